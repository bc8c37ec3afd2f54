package cost

import (
	_ "embed"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"

	"github.com/apidispatch/apidispatch/openai"
)

// OpenAI prices are kept in tenths of a nano-dollar per token: the cached
// input of the smallest models is $0.005 per million tokens, and its batch
// price half of that, 2.5 n$ a token.

// Tenths is an amount in tenths of a nano-dollar (1e-10 USD).
type Tenths int64

// Nanos rounds t half up to a whole nano-dollar.
func (t Tenths) Nanos() Nanos {
	if t >= 0 {
		return Nanos((t + 5) / 10)
	}
	return -Nanos((-t + 5) / 10)
}

// OpenAIRates are the prices of one token of each kind, in tenths of a
// nano-dollar.
type OpenAIRates struct {
	Input       Tenths // uncached prompt token
	CachedInput Tenths // prompt token read from the prompt cache
	Output      Tenths // completion token (reasoning tokens included)
}

// OpenAIPrice is the price of one OpenAI model: standard and Batch API
// rates (the standard ones × the batch multiplier, exact).
type OpenAIPrice struct {
	Model   string
	Aliases []string
	// MaxOutput is the most completion tokens one choice may take: what a
	// request that sets no max_completion_tokens (nor max_tokens) may
	// draw, per choice.
	MaxOutput int64
	Standard  OpenAIRates
	Batch     OpenAIRates
	// Priority is the rates of priority processing (service_tier
	// "priority"), nil when the model does not offer it (such a request
	// is served, and billed, at the standard tier). Flex says the model
	// offers flex processing (service_tier "flex"), billed at the Batch
	// API rates.
	Priority *OpenAIRates
	Flex     bool
}

// OpenAI service tiers, as a request asks for them and an answer's
// service_tier says which one served it.
const (
	TierAuto     = "auto"     // the project's setting (standard unless it says otherwise)
	TierDefault  = "default"  // standard processing
	TierFlex     = "flex"     // flex processing, at the Batch API rates
	TierPriority = "priority" // priority processing, at a premium
)

// RatesFor are the rates of tier (an answer's service_tier), or of the
// Batch API when batch: the priority rates for "priority" when the model
// offers it, the Batch API rates for "flex" when it offers flex, else the
// standard rates.
func (p *OpenAIPrice) RatesFor(tier string, batch bool) OpenAIRates {
	switch {
	case batch:
		return p.Batch
	case tier == TierPriority && p.Priority != nil:
		return *p.Priority
	case tier == TierFlex && p.Flex:
		return p.Batch
	}
	return p.Standard
}

// WorstRatesFor are the dearest rates a request asking for tier (its
// service_tier, "" when it sets none) may be billed at: the priority
// rates when it asks for priority (or may: an unread request, tier
// "?"), else the standard rates (a flex request is served at flex or not
// at all; one without a tier, or with "auto" or "default", at the
// standard tier unless its project is set to another). At the Batch API
// rates when batch.
func (p *OpenAIPrice) WorstRatesFor(tier string, batch bool) OpenAIRates {
	switch {
	case batch:
		return p.Batch
	case (tier == TierPriority || tier == TierUnknown) && p.Priority != nil:
		return *p.Priority
	}
	return p.Standard
}

// TierUnknown is the tier of a request whose body was not read: it may
// ask for any tier.
const TierUnknown = "?"

// MaxImageTokens is the most prompt tokens one image part of a chat
// completion may be billed at by this model, whatever its URL's length:
// an image is billed by its size in the model's tiles or patches, not by
// the bytes that name it. gpt-4o-mini bills an image's base and tiles at
// many times the tokens of the others (up to 48,169 for a large image at
// high detail); every other model stays within 3,840 (1,536 patches at
// the largest multiplier, above the 1,445 of eight tiles).
func (p *OpenAIPrice) MaxImageTokens() int64 {
	if strings.HasPrefix(strings.ToLower(p.Model), "gpt-4o-mini") {
		return 2833 + 8*5667
	}
	return 3840
}

// OpenAITable is a set of OpenAI prices by model id and alias. It is
// immutable and safe for concurrent use; the zero value prices nothing.
type OpenAITable struct {
	byName map[string]*OpenAIPrice
	models []*OpenAIPrice
}

//go:embed openai_prices.toml
var embeddedOpenAIPrices []byte

var defaultOpenAI = sync.OnceValue(func() *OpenAITable {
	t, err := parseOpenAIPrices("openai_prices.toml (embedded)", embeddedOpenAIPrices)
	if err != nil {
		panic(err) // the embedded file is covered by tests
	}
	return t
})

// OpenAI returns the embedded OpenAI price table (openai_prices.toml in
// this package). It is shared and immutable.
func OpenAI() *OpenAITable { return defaultOpenAI() }

// snapshotSuffix is the date of an OpenAI snapshot id, "-2025-04-14".
var snapshotSuffix = regexp.MustCompile(`-[0-9]{4}-[0-9]{2}-[0-9]{2}$`)

// Lookup returns the price of model, trying a dated snapshot's model
// when the snapshot itself is not listed. An unknown model is an error
// wrapping ErrNoPrice.
func (t *OpenAITable) Lookup(model string) (*OpenAIPrice, error) {
	if p, ok := t.byName[model]; ok {
		return p, nil
	}
	if m := snapshotSuffix.FindStringIndex(model); m != nil {
		if p, ok := t.byName[model[:m[0]]]; ok {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w %q", ErrNoPrice, model)
}

// Models returns the canonical entries, sorted by model id.
func (t *OpenAITable) Models() []*OpenAIPrice { return append([]*OpenAIPrice(nil), t.models...) }

// Cost is the exact cost of one chat completion's usage:
//
//	(prompt_tokens − cached_tokens) × input
//	+ cached_tokens × cached input
//	+ completion_tokens × output   (reasoning tokens are among them)
//
// at the Batch API rates when batch is true, summed in tenths of a
// nano-dollar and rounded half up to a nano-dollar. The simulator bills
// by the same rule, so a client's sum equals its ledger to the nano-dollar.
func (t *OpenAITable) Cost(model string, u openai.Usage, batch bool) (Nanos, error) {
	return t.CostTier(model, u, TierDefault, batch)
}

// CostTier is Cost at the rates of the service tier that served the
// request (the answer's service_tier; RatesFor).
func (t *OpenAITable) CostTier(model string, u openai.Usage, tier string, batch bool) (Nanos, error) {
	p, err := t.Lookup(model)
	if err != nil {
		return 0, err
	}
	return p.costAt(u, p.RatesFor(tier, batch))
}

// Cost is the cost of u at this price; see OpenAITable.Cost.
func (p *OpenAIPrice) Cost(u openai.Usage, batch bool) (Nanos, error) {
	return p.costAt(u, p.RatesFor(TierDefault, batch))
}

// costAt is the cost of u at rates r.
func (p *OpenAIPrice) costAt(u openai.Usage, r OpenAIRates) (Nanos, error) {
	cached := u.PromptTokensDetails.CachedTokens
	for _, v := range []int64{u.PromptTokens, u.CompletionTokens, cached, u.CompletionTokensDetails.ReasoningTokens} {
		if v < 0 || v > maxTokens {
			return 0, fmt.Errorf("%w: token count %d out of range", ErrBadUsage, v)
		}
	}
	if cached > u.PromptTokens {
		return 0, fmt.Errorf("%w: %d cached tokens of %d prompt tokens", ErrBadUsage, cached, u.PromptTokens)
	}
	if u.CompletionTokensDetails.ReasoningTokens > u.CompletionTokens {
		return 0, fmt.Errorf("%w: %d reasoning tokens of %d completion tokens", ErrBadUsage, u.CompletionTokensDetails.ReasoningTokens, u.CompletionTokens)
	}
	t := Tenths(u.PromptTokens-cached)*r.Input + Tenths(cached)*r.CachedInput + Tenths(u.CompletionTokens)*r.Output
	return t.Nanos(), nil
}

// WorstCase is the most a request can cost: every prompt token uncached
// and maxCompletion tokens for each of its n choices.
func (t *OpenAITable) WorstCase(model string, promptTokens, maxCompletion, n int64, batch bool) (Nanos, error) {
	return t.WorstCaseTier(model, promptTokens, maxCompletion, n, TierDefault, batch)
}

// WorstCaseTier is WorstCase for a request asking for service tier tier
// ("" when it sets none, TierUnknown when unread), at the dearest rates
// it may be billed at (WorstRatesFor).
func (t *OpenAITable) WorstCaseTier(model string, promptTokens, maxCompletion, n int64, tier string, batch bool) (Nanos, error) {
	if n < 1 {
		n = 1
	}
	if maxCompletion < 0 || n > 128 || maxCompletion > maxTokens/n {
		return 0, fmt.Errorf("%w: %d choices of %d tokens", ErrBadUsage, n, maxCompletion)
	}
	p, err := t.Lookup(model)
	if err != nil {
		return 0, err
	}
	return p.costAt(openai.Usage{PromptTokens: promptTokens, CompletionTokens: maxCompletion * n}, p.WorstRatesFor(tier, batch))
}

type openaiFileModel struct {
	Aliases         []string   `toml:"aliases"`
	Input           usdTenths  `toml:"input"`
	CachedInput     usdTenths  `toml:"cached_input"`
	Output          usdTenths  `toml:"output"`
	BatchMultiplier multiplier `toml:"batch_multiplier"`
	MaxOutput       int64      `toml:"max_output"`
	Flex            bool       `toml:"flex"`
	Priority        *struct {
		Input       usdTenths `toml:"input"`
		CachedInput usdTenths `toml:"cached_input"`
		Output      usdTenths `toml:"output"`
	} `toml:"priority"`
}

// usdTenths is a price in USD per million tokens decoded exactly into
// tenths of a nano-dollar per token (at most four decimals).
type usdTenths struct {
	set bool
	n   Tenths
}

// UnmarshalTOML implements toml.Unmarshaler.
func (p *usdTenths) UnmarshalTOML(v any) error {
	s, err := decimalText(v)
	if err != nil {
		return err
	}
	n, err := parseDecimal(s, 4)
	if err != nil {
		return fmt.Errorf("price %s USD per million tokens: %v (at most 4 decimals)", s, err)
	}
	if n > 10_000_000 {
		return fmt.Errorf("price %s USD per million tokens is implausibly high", s)
	}
	p.set, p.n = true, Tenths(n)
	return nil
}

// parseOpenAIPrices decodes and validates an OpenAI price file.
func parseOpenAIPrices(name string, data []byte) (*OpenAITable, error) {
	var doc struct {
		Models map[string]openaiFileModel `toml:"models"`
	}
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return nil, fmt.Errorf("cost: %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("cost: %s: unknown key %s", name, strings.Join(keys, ", "))
	}
	t := &OpenAITable{byName: map[string]*OpenAIPrice{}}
	for id, fm := range doc.Models {
		where := fmt.Sprintf("cost: %s: models.%q", name, id)
		if !fm.Input.set || !fm.Output.set || !fm.CachedInput.set {
			return nil, fmt.Errorf("%s: input, cached_input and output are required", where)
		}
		permille := int64(500)
		if fm.BatchMultiplier.set {
			permille = fm.BatchMultiplier.permille
		}
		if fm.MaxOutput < 1 || fm.MaxOutput > maxTokens/128 {
			return nil, fmt.Errorf("%s: max_output must be set, from 1 to %d", where, maxTokens/128)
		}
		p := &OpenAIPrice{Model: id, Aliases: fm.Aliases, MaxOutput: fm.MaxOutput, Flex: fm.Flex,
			Standard: OpenAIRates{Input: fm.Input.n, CachedInput: fm.CachedInput.n, Output: fm.Output.n}}
		if pr := fm.Priority; pr != nil {
			if !pr.Input.set || !pr.Output.set || !pr.CachedInput.set {
				return nil, fmt.Errorf("%s: priority: input, cached_input and output are required", where)
			}
			p.Priority = &OpenAIRates{Input: pr.Input.n, CachedInput: pr.CachedInput.n, Output: pr.Output.n}
			if p.Priority.Input < p.Standard.Input || p.Priority.CachedInput < p.Standard.CachedInput || p.Priority.Output < p.Standard.Output {
				return nil, fmt.Errorf("%s: priority: a rate below the standard one", where)
			}
		}
		for _, r := range []struct {
			what     string
			src, dst *Tenths
		}{{"input", &p.Standard.Input, &p.Batch.Input}, {"cached_input", &p.Standard.CachedInput, &p.Batch.CachedInput}, {"output", &p.Standard.Output, &p.Batch.Output}} {
			if int64(*r.src)*permille%1000 != 0 {
				return nil, fmt.Errorf("%s: batch_multiplier: %s × %d/1000 is not a whole number of tenths of a nano-dollar", where, r.what, permille)
			}
			*r.dst = Tenths(int64(*r.src) * permille / 1000)
		}
		for _, n := range append([]string{id}, fm.Aliases...) {
			if _, dup := t.byName[n]; dup {
				return nil, fmt.Errorf("%s: name %q is used twice", where, n)
			}
			t.byName[n] = p
		}
		t.models = append(t.models, p)
	}
	sort.Slice(t.models, func(i, j int) bool { return t.models[i].Model < t.models[j].Model })
	return t, nil
}
