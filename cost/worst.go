package cost

import "fmt"

// CacheWrite is the dearest prompt-cache write a request may make. Its zero
// value is NoCacheWrite.
type CacheWrite uint8

// The cache writes a request may make, cheapest first.
const (
	NoCacheWrite CacheWrite = iota // no cache_control: no write
	CacheWrite5m                   // cache_control without ttl, or ttl "5m"
	CacheWrite1h                   // a cache_control with ttl "1h"
)

// Bound is what a Messages request tells before it is sent of the most it
// can be billed: the input and output it may use, and every multiplier its
// params can bring. workload.BoundOf reads it from a request's params;
// Table.WorstCase prices it, the one worst case of every route and front
// door. The zero value bounds nothing (no model).
type Bound struct {
	Model string
	// Input bounds the request's input tokens. A local estimate is an
	// estimate; the body's length in bytes always bounds it (a token is at
	// least one byte), so callers take the larger of the two.
	Input int64
	// MaxTokens is the request's max_tokens: every output token it may be
	// billed, thinking tokens included (the API refuses a thinking budget
	// that is not below max_tokens).
	MaxTokens int64
	// CacheWrite is the dearest cache write its cache_control markers may
	// make: the worst case bills all input at that rate.
	CacheWrite CacheWrite
	// GeoUS: inference_geo "us", billed ×1.1 on every category.
	GeoUS bool
	// Batch: sent through the Message Batches API, at its discount.
	Batch bool
	// LongContext bills at the model's long-context rates (when it has
	// them) whatever Input says: for a bound of many requests at their mean
	// input, the longest of which may pass the threshold.
	LongContext bool
}

// WorstCase is the most the request b describes can cost: all of its input
// at the dearest input rate it may be billed (the cache write rate its
// cache_control allows, never less than the uncached rate), all of
// max_tokens at the output rate, at the long-context rates when its input
// can pass the model's threshold, at the batch rates for a batch request,
// and ×1.1 for inference_geo "us". It is only as good as b.Input. An
// unknown model returns an error wrapping ErrNoPrice; a negative or absurd
// count one wrapping ErrBadUsage.
func (t *Table) WorstCase(b Bound) (Nanos, error) {
	p, err := t.Lookup(b.Model)
	if err != nil {
		return 0, err
	}
	return p.WorstCase(b)
}

// WorstCase is Table.WorstCase at this price (b.Model is not read).
func (p *Price) WorstCase(b Bound) (Nanos, error) {
	if b.Input < 0 || b.Input > maxTokens || b.MaxTokens < 0 || b.MaxTokens > maxTokens {
		return 0, fmt.Errorf("%w: worst case of %d input and %d output tokens", ErrBadUsage, b.Input, b.MaxTokens)
	}
	r := p.RatesFor(b.Batch, b.Input)
	if lc := p.LongContext; lc != nil && b.LongContext {
		r = lc.Standard
		if b.Batch {
			r = lc.Batch
		}
	}
	in := r.Input
	if b.CacheWrite >= CacheWrite5m {
		in = max(in, r.CacheWrite5m)
	}
	if b.CacheWrite >= CacheWrite1h {
		in = max(in, r.CacheWrite1h)
	}
	c := Nanos(b.Input)*in + Nanos(b.MaxTokens)*r.Output
	if b.GeoUS {
		c = usGeo(c)
	}
	return c, nil
}

// Unpriceable is the worst case a route counts for a request it cannot
// price (no price for its model): far above any cap, so such a request is
// refused by a capped spend gate rather than let through at 0, and far
// enough below the int64 limit that sums of a few of them cannot overflow.
const Unpriceable Nanos = 1 << 60
