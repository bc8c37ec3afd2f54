// Package cost holds the price table of the Anthropic models apidispatch
// sends to and computes the exact cost of a response's usage.
//
// Money is integer nano-dollars (Nanos, 1e-9 USD): every listed price is a
// whole number of nano-dollars per token ($3 per million tokens is 3,000 n$ a
// token), so a cost is an exact integer sum, never a float rounding. Convert
// with Nanos.USD only for display.
//
// Most callers want Default().Cost(model, usage, batch): the one function
// that turns a Usage into money, applying the cache-write split, cache reads,
// the Sonnet 4/4.5 long-context rule, the Message Batches discount and the
// ×1.1 of inference_geo "us" (Usage.InferenceGeo).
// Table.WorstCase is the one worst case of a request not yet answered (see
// Bound and ReadParams), under every route's spend reservations.
// A --prices FILE is read with Load, which extends or overrides the embedded
// table (prices.toml in this package documents the format).
//
// OpenAI models have their own table, OpenAI() (openai_prices.toml): its
// Cost prices an openai.Usage (cached input, reasoning tokens as output,
// the Batch API's half price) in tenths of a nano-dollar, rounded half up
// to a nano-dollar per request.
package cost

import (
	"errors"
	"fmt"
	"regexp"
	"sort"

	"github.com/apidispatch/apidispatch/anthropic"
)

// ErrNoPrice is returned (wrapped with the model name) by Lookup, Cost and
// WorstCase for a model the table does not price.
var ErrNoPrice = errors.New("cost: no price for model")

// ErrBadUsage is returned (wrapped) by Cost for a usage with a negative or
// absurdly large token count.
var ErrBadUsage = errors.New("cost: invalid usage")

// maxTokens bounds every token count Cost accepts, so that count × price can
// never overflow int64 (1e12 tokens × 1e6 n$ = 1e18 < 9.2e18).
const maxTokens = 1_000_000_000_000

// Rates are the prices of one token of each kind, in nano-dollars.
type Rates struct {
	Input        Nanos // uncached input token
	Output       Nanos // output token
	CacheWrite5m Nanos // input token written to the 5-minute cache
	CacheWrite1h Nanos // input token written to the 1-hour cache
	CacheRead    Nanos // input token read from the cache
}

// LongContext is the rule of Sonnet 4 and 4.5 with the 1M context window:
// when a request's total input (input + cache creation + cache read tokens)
// is above Threshold, the whole request is billed at these rates.
type LongContext struct {
	Threshold int64
	Standard  Rates
	Batch     Rates // Standard × the model's batch multiplier
}

// Price is the price of one model. Batch rates are precomputed from the
// batch multiplier and are exact (the loader refuses a multiplier that would
// make a fraction of a nano-dollar).
type Price struct {
	Model       string   // canonical id, e.g. "claude-sonnet-4-5"
	Aliases     []string // other ids billed the same, e.g. "claude-sonnet-4-5-20250929"
	Standard    Rates
	Batch       Rates        // Standard × batch multiplier (Message Batches API)
	LongContext *LongContext // nil for models without the rule
}

// RatesFor returns the rates that apply to a request with totalInput input
// tokens (input + cache creation + cache read), sent through the Message
// Batches API or not.
func (p *Price) RatesFor(batch bool, totalInput int64) Rates {
	if lc := p.LongContext; lc != nil && totalInput > lc.Threshold {
		if batch {
			return lc.Batch
		}
		return lc.Standard
	}
	if batch {
		return p.Batch
	}
	return p.Standard
}

// Cost is the exact cost of one response's usage at this price; see
// Table.Cost.
func (p *Price) Cost(u anthropic.Usage, batch bool) (Nanos, error) {
	for _, v := range []int64{u.InputTokens, u.OutputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens} {
		if v < 0 || v > maxTokens {
			return 0, fmt.Errorf("%w: token count %d out of range", ErrBadUsage, v)
		}
	}
	w5, w1 := u.CacheCreationInputTokens, int64(0)
	if cc := u.CacheCreation; cc != nil {
		if cc.Ephemeral5mInputTokens < 0 || cc.Ephemeral1hInputTokens < 0 ||
			cc.Ephemeral5mInputTokens > maxTokens || cc.Ephemeral1hInputTokens > maxTokens {
			return 0, fmt.Errorf("%w: cache_creation split (%d, %d) out of range",
				ErrBadUsage, cc.Ephemeral5mInputTokens, cc.Ephemeral1hInputTokens)
		}
		w5, w1 = cc.Ephemeral5mInputTokens, cc.Ephemeral1hInputTokens
		// If the split explains fewer tokens than the total, bill the rest
		// at the 5-minute rate rather than not at all.
		if rest := u.CacheCreationInputTokens - w5 - w1; rest > 0 {
			w5 += rest
		}
	}
	total := u.InputTokens + w5 + w1 + u.CacheReadInputTokens
	r := p.RatesFor(batch, total)
	c := Nanos(u.InputTokens)*r.Input +
		Nanos(w5)*r.CacheWrite5m +
		Nanos(w1)*r.CacheWrite1h +
		Nanos(u.CacheReadInputTokens)*r.CacheRead +
		Nanos(u.OutputTokens)*r.Output
	if u.InferenceGeo == "us" {
		c = usGeo(c)
	}
	return c, nil
}

// usGeo is c × 1.1, the price of inference_geo "us" (docs/design.md §20),
// rounded half up to a nano-dollar; exact for the embedded prices, which are
// all multiples of 10 n$. It cannot overflow where c does not.
func usGeo(c Nanos) Nanos {
	return c/10*11 + (c%10*11+5)/10
}

// Table is a set of prices by model id and alias. A Table is immutable after
// Default or Load returns it and is safe for concurrent use. The zero value
// is an empty table that prices nothing.
type Table struct {
	byName map[string]*Price
	models []*Price // canonical entries, sorted by Model
}

// Lookup returns the price of model. A name is tried as given; if it is not
// in the table and ends in a date suffix ("-20250929"), the name without the
// suffix is tried, since a dated snapshot is billed as its model. An unknown
// model returns an error wrapping ErrNoPrice.
func (t *Table) Lookup(model string) (*Price, error) {
	if p, ok := t.byName[model]; ok {
		return p, nil
	}
	if m := dateSuffix.FindStringIndex(model); m != nil {
		if p, ok := t.byName[model[:m[0]]]; ok {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w %q (add it with --prices FILE)", ErrNoPrice, model)
}

var dateSuffix = regexp.MustCompile(`-[0-9]{8}$`)

// Cost is the one function for the cost of a usage, exact in nano-dollars:
//
//	input_tokens × input
//	+ cache writes × cache write (the usage.cache_creation split into 5-minute
//	  and 1-hour writes when present; otherwise all cache_creation_input_tokens
//	  at the 5-minute rate)
//	+ cache_read_input_tokens × cache read
//	+ output_tokens × output
//
// at the long-context rates when the model has the rule and total input
// (input + cache creation + cache read) is above its threshold, and at the
// batch rates when batch is true (a Message Batches result).
func (t *Table) Cost(model string, u anthropic.Usage, batch bool) (Nanos, error) {
	p, err := t.Lookup(model)
	if err != nil {
		return 0, err
	}
	return p.Cost(u, batch)
}

// Models returns the canonical entries of the table, sorted by model id.
// The returned Prices must not be modified.
func (t *Table) Models() []*Price {
	return append([]*Price(nil), t.models...)
}

// newTable indexes entries: every id and alias points at its entry. Later
// entries win over earlier ones for a shared name.
func newTable(entries []*Price) *Table {
	t := &Table{byName: make(map[string]*Price)}
	for _, p := range entries {
		t.byName[p.Model] = p
		for _, a := range p.Aliases {
			t.byName[a] = p
		}
	}
	// Keep only entries still reachable by some name.
	seen := map[*Price]bool{}
	for _, p := range t.byName {
		if !seen[p] {
			seen[p] = true
			t.models = append(t.models, p)
		}
	}
	sort.Slice(t.models, func(i, j int) bool { return t.models[i].Model < t.models[j].Model })
	return t
}
