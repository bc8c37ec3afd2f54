package cost

import (
	"errors"
	"testing"

	"github.com/apidispatch/apidispatch/openai"
)

func oaUsage(prompt, cached, completion, reasoning int64) openai.Usage {
	return openai.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: cached},
		CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: reasoning}}
}

func TestOpenAICost(t *testing.T) {
	t.Parallel()
	tab := OpenAI()
	cases := []struct {
		model string
		u     openai.Usage
		batch bool
		want  Nanos
	}{
		// $2/M in, $8/M out: 1,000 in + 500 out = $0.002 + $0.004.
		{"gpt-4.1", oaUsage(1000, 0, 500, 0), false, 6_000_000},
		{"gpt-4.1", oaUsage(1000, 0, 500, 0), true, 3_000_000},
		// 1,024 of 2,000 prompt tokens cached at $0.50/M.
		{"gpt-4.1", oaUsage(2000, 1024, 0, 0), false, 976*2000 + 1024*500},
		// A dated snapshot is billed as its model.
		{"gpt-4o-2024-08-06", oaUsage(100, 0, 10, 0), false, 100*2500 + 10*10000},
		// Reasoning tokens are output tokens already counted in completion_tokens.
		{"o4-mini", oaUsage(100, 0, 300, 250), false, 100*1100 + 300*4400},
		// Sub-nano rates: 3 cached tokens at 2.5 n$ (batch gpt-5-nano) = 7.5 → 8.
		{"gpt-5-nano", oaUsage(3, 3, 0, 0), true, 8},
		{"gpt-5-nano", oaUsage(1, 1, 0, 0), true, 3},            // 2.5 → 3 (half up)
		{"gpt-4o-mini", oaUsage(10, 10, 1, 0), true, 375 + 300}, // 10 × 37.5 + 300
		{"gpt-4.1-nano", oaUsage(40, 40, 0, 0), false, 1000},    // 40 × 25
		{"gpt-5", oaUsage(1_000_000, 0, 1_000_000, 0), false, 11_250_000_000},
	}
	for _, c := range cases {
		got, err := tab.Cost(c.model, c.u, c.batch)
		if err != nil || got != c.want {
			t.Errorf("Cost(%s, %+v, batch %v) = %d, %v; want %d", c.model, c.u, c.batch, got, err, c.want)
		}
	}
}

func TestOpenAIBatchIsHalfOfEveryRate(t *testing.T) {
	t.Parallel()
	models := OpenAI().Models()
	if len(models) < 10 {
		t.Fatalf("only %d OpenAI models priced", len(models))
	}
	for _, p := range models {
		if p.Batch.Input*2 != p.Standard.Input || p.Batch.CachedInput*2 != p.Standard.CachedInput || p.Batch.Output*2 != p.Standard.Output {
			t.Errorf("%s: batch %+v is not half of %+v", p.Model, p.Batch, p.Standard)
		}
		if p.Standard.CachedInput >= p.Standard.Input || p.Standard.Output <= p.Standard.Input {
			t.Errorf("%s: implausible rates %+v", p.Model, p.Standard)
		}
	}
}

func TestOpenAICostRefusesBadUsage(t *testing.T) {
	t.Parallel()
	tab := OpenAI()
	for _, u := range []openai.Usage{oaUsage(-1, 0, 0, 0), oaUsage(10, 11, 0, 0), oaUsage(10, 0, 5, 6), oaUsage(maxTokens+1, 0, 0, 0)} {
		if _, err := tab.Cost("gpt-4.1", u, false); !errors.Is(err, ErrBadUsage) {
			t.Errorf("%+v: err %v, want ErrBadUsage", u, err)
		}
	}
	if _, err := tab.Cost("gpt-9", oaUsage(1, 0, 1, 0), false); !errors.Is(err, ErrNoPrice) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := tab.WorstCase("gpt-4.1", 10, maxTokens, 2, false); !errors.Is(err, ErrBadUsage) {
		t.Errorf("overflowing worst case: %v", err)
	}
	w, err := tab.WorstCase("gpt-4.1", 100, 50, 3, false)
	if err != nil || w != 100*2000+150*8000 {
		t.Errorf("WorstCase = %d, %v", w, err)
	}
}

func TestParseOpenAIPricesErrors(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"missing cached": "[models.\"m\"]\nmax_output = 10\ninput = 1\noutput = 2\n",
		"no max_output":  "[models.\"m\"]\ninput = 1\ncached_input = 0.5\noutput = 2\n",
		"five decimals":  "[models.\"m\"]\nmax_output = 10\ninput = 0.00001\ncached_input = 0\noutput = 2\n",
		"inexact batch":  "[models.\"m\"]\nmax_output = 10\ninput = 0.0001\ncached_input = 0\noutput = 2\n",
		"unknown key":    "[models.\"m\"]\nmax_output = 10\ninput = 1\ncached_input = 0.5\noutput = 2\ncache_write = 3\n",
		"duplicate name": "[models.\"m\"]\nmax_output = 10\ninput = 1\ncached_input = 0.5\noutput = 2\n[models.\"n\"]\nmax_output = 10\naliases=[\"m\"]\ninput = 1\ncached_input = 0.5\noutput = 2\n",
	} {
		if _, err := parseOpenAIPrices(name, []byte(src)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
