package cost

import (
	"errors"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
)

// The one worst case counts every multiplier a request can be billed at:
// for each, the worst case with it is at least the cost of a usage that
// spends all the input and max_tokens at it, and the worst case without it
// is below that cost (the multiplier matters, so forgetting it would show).
func TestWorstCaseCountsEveryMultiplier(t *testing.T) {
	t.Parallel()
	tab := Default()
	const in, out = 150_000, 4_096
	w5 := func(n int64) anthropic.Usage {
		return anthropic.Usage{CacheCreationInputTokens: n, CacheCreation: &anthropic.CacheCreation{Ephemeral5mInputTokens: n}}
	}
	w1 := func(n int64) anthropic.Usage {
		return anthropic.Usage{CacheCreationInputTokens: n, CacheCreation: &anthropic.CacheCreation{Ephemeral1hInputTokens: n}}
	}
	for _, tc := range []struct {
		name    string
		with    Bound
		without Bound // the same request with the multiplier left out ("" model: none to leave out)
		usage   anthropic.Usage
		batch   bool
	}{
		{name: "inference_geo us", with: Bound{Model: "claude-sonnet-4-6", Input: in, MaxTokens: out, GeoUS: true},
			without: Bound{Model: "claude-sonnet-4-6", Input: in, MaxTokens: out},
			usage:   anthropic.Usage{InputTokens: in, OutputTokens: out, InferenceGeo: "us"}},
		{name: "long context", with: Bound{Model: "claude-sonnet-4-5", Input: 250_000, MaxTokens: out},
			without: Bound{Model: "claude-sonnet-4-5", Input: 200_000, MaxTokens: out},
			usage:   anthropic.Usage{InputTokens: 250_000, OutputTokens: out}},
		{name: "long context through cache writes", with: Bound{Model: "claude-sonnet-4-5", Input: 250_000, MaxTokens: out, CacheWrite: CacheWrite5m},
			without: Bound{Model: "claude-sonnet-4-5", Input: 250_000, MaxTokens: out},
			usage:   func() anthropic.Usage { u := w5(200_000); u.InputTokens = 50_000; u.OutputTokens = out; return u }()},
		{name: "5-minute cache write", with: Bound{Model: "claude-haiku-4-5", Input: in, MaxTokens: out, CacheWrite: CacheWrite5m},
			without: Bound{Model: "claude-haiku-4-5", Input: in, MaxTokens: out},
			usage:   func() anthropic.Usage { u := w5(in); u.OutputTokens = out; return u }()},
		{name: "1-hour cache write", with: Bound{Model: "claude-opus-4-6", Input: in, MaxTokens: out, CacheWrite: CacheWrite1h},
			without: Bound{Model: "claude-opus-4-6", Input: in, MaxTokens: out, CacheWrite: CacheWrite5m},
			usage:   func() anthropic.Usage { u := w1(in); u.OutputTokens = out; return u }()},
		{name: "thinking (its budget is output within max_tokens)", with: Bound{Model: "claude-sonnet-4-5", Input: in, MaxTokens: out},
			without: Bound{Model: "claude-sonnet-4-5", Input: in, MaxTokens: 1_024},
			usage:   anthropic.Usage{InputTokens: in, OutputTokens: out}},
		{name: "batch discount", with: Bound{Model: "claude-sonnet-4-5", Input: in, MaxTokens: out, Batch: true},
			usage: anthropic.Usage{InputTokens: in, OutputTokens: out}, batch: true},
		{name: "all at once", with: Bound{Model: "claude-sonnet-4-5", Input: 250_000, MaxTokens: out, CacheWrite: CacheWrite1h, GeoUS: true, Batch: true},
			without: Bound{Model: "claude-sonnet-4-5", Input: 250_000, MaxTokens: out, CacheWrite: CacheWrite5m, GeoUS: true, Batch: true},
			usage:   func() anthropic.Usage { u := w1(250_000); u.OutputTokens, u.InferenceGeo = out, "us"; return u }(), batch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := tab.Cost(tc.with.Model, tc.usage, tc.batch)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tab.WorstCase(tc.with)
			if err != nil {
				t.Fatal(err)
			}
			if got < want {
				t.Errorf("worst case %v < the cost %v of a usage it allows", got, want)
			}
			if tc.without.Model != "" {
				less, err := tab.WorstCase(tc.without)
				if err != nil {
					t.Fatal(err)
				}
				if less >= want {
					t.Errorf("without the multiplier the worst case is %v, not below %v: the case tests nothing", less, want)
				}
			}
		})
	}
	// The batch discount is a discount: the same request costs less as a batch.
	sync, _ := tab.WorstCase(Bound{Model: "claude-sonnet-4-5", Input: in, MaxTokens: out})
	batch, _ := tab.WorstCase(Bound{Model: "claude-sonnet-4-5", Input: in, MaxTokens: out, Batch: true})
	if batch*2 != sync {
		t.Errorf("batch worst case %v, want half of %v", batch, sync)
	}
	// Many requests at a mean input whose longest may pass the threshold:
	// all at the long-context rates (1,000 × $6/M + 4,096 × $22.50/M).
	long, _ := tab.WorstCase(Bound{Model: "claude-sonnet-4-5", Input: 1_000, MaxTokens: out, LongContext: true})
	if long != 1_000*6_000+out*22_500 {
		t.Errorf("long-context bound %v, want %v", long, Nanos(1_000*6_000+out*22_500))
	}
	if _, err := tab.WorstCase(Bound{Model: "claude-sonnet-4-5", Input: -1}); !errors.Is(err, ErrBadUsage) {
		t.Errorf("negative input: %v, want ErrBadUsage", err)
	}
}
