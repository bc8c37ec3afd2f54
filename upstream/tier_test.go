package upstream

import (
	"fmt"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
)

// TestOpenAIWorstCaseByServiceTier: an OpenAI request's worst case is at
// the dearest rates the tier it asks for may be billed at — priority's
// (about 1.75× to 2× the standard rates) for "priority" (and "fast"), and
// for a body not read, which may ask for it; the standard rates for
// "flex" (served at flex or refused), "default", "auto" and none; the
// Batch API rates on the batch route whatever the tier. A model without
// priority processing is bounded at its standard rates. Before, every
// request was bounded at the standard rates, so a priority request's
// reservation under --max-cost or a client's max_cost was about half what
// it could be billed.
func TestOpenAIWorstCaseByServiceTier(t *testing.T) {
	t.Parallel()
	// prompt bound 2,000 tokens (the body is shorter), 500 completion
	// tokens × n 2; rates in tenths of a nano-dollar per token.
	it := Item{Model: "gpt-4.1-mini", EstInput: 2000, Length: 400, MaxTokens: 500, Choices: 2}
	at := func(in, out int64) cost.Nanos { return cost.Tenths(2000*in + 1000*out).Nanos() }
	body := func(tier string) []byte {
		if tier == "" {
			return []byte(`{"model":"gpt-4.1-mini","max_completion_tokens":500,"n":2,"messages":[{"role":"user","content":"hi"}]}`)
		}
		return fmt.Appendf(nil, `{"model":"gpt-4.1-mini","max_completion_tokens":500,"n":2,"service_tier":%q,"messages":[{"role":"user","content":"hi"}]}`, tier)
	}
	priority, standard, batch := at(7000, 28000), at(4000, 16000), at(2000, 8000)
	for _, c := range []struct {
		name  string
		body  []byte
		batch bool
		want  cost.Nanos
	}{
		{"priority", body("priority"), false, priority},
		{"fast", body("fast"), false, priority},
		{"unread", nil, false, priority},
		{"flex", body("flex"), false, standard},
		{"default", body("default"), false, standard},
		{"auto", body("auto"), false, standard},
		{"none", body(""), false, standard},
		{"priority by batch", body("priority"), true, batch},
		{"unread by batch", nil, true, batch},
	} {
		got, err := OpenAI.WorstCase(nil, it, c.body, c.batch)
		if err != nil || got != c.want {
			t.Errorf("%s: worst case %d n$ (%v), want %d n$", c.name, got, err, c.want)
		}
	}
	// gpt-5-nano has no priority processing: a priority request is
	// served, and bounded, at the standard tier.
	nano := Item{Model: "gpt-5-nano", EstInput: 2000, MaxTokens: 500, Choices: 2}
	got, err := OpenAI.WorstCase(nil, nano, []byte(`{"service_tier":"priority"}`), false)
	if want := at(500, 4000); err != nil || got != want {
		t.Errorf("gpt-5-nano priority: %d n$ (%v), want %d n$", got, err, want)
	}
}

// TestOpenAIWorstCaseReadsEscapedFields: JSON may spell any character of
// a key or a string as a \u escape, and the API reads the body decoded. A
// body asking for priority with "service\u005ftier", or holding image
// parts spelt "image\u005furl", is bounded as the same body unescaped.
// Before, a byte search for the plain spelling missed both: the priority
// request was bounded at the standard rates (a client's max_cost of
// $0.0033 billed $0.0056 through serve), the 100 images not at all
// ($0.0060 billed $0.0306; TestOpenAIServeMaxCostHeldWithEscapedFields).
func TestOpenAIWorstCaseReadsEscapedFields(t *testing.T) {
	t.Parallel()
	it := Item{Model: "gpt-4.1-mini", EstInput: 40, Length: 200, MaxTokens: 500}
	for _, c := range []struct{ name, plain, escaped string }{
		{"service_tier",
			`{"model":"gpt-4.1-mini","service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"gpt-4.1-mini","service\u005ftier":"priority","messages":[{"role":"user","content":"hi"}]}`},
		{"image_url",
			`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x.io/a.png"}}]}]}`,
			`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":[{"type":"image\u005furl","image\u005furl":{"url":"https://x.io/a.png"}}]}]}`},
	} {
		want, err := OpenAI.WorstCase(nil, it, []byte(c.plain), false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := OpenAI.WorstCase(nil, it, []byte(c.escaped), false)
		if err != nil || got < want {
			t.Errorf("%s escaped: worst case %d n$ (%v), below the unescaped body's %d n$", c.name, got, err, want)
		}
	}
}
