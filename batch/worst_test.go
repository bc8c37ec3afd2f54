package batch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// Under --max-cost the batch route bounds each item by the one worst case
// at the batch rates, with every multiplier its params ask for
// (inference_geo "us", cache writes), and an item whose params cannot be
// read at every multiplier.
func TestWorstCaseAtBatchRatesWithItsMultipliers(t *testing.T) {
	t.Parallel()
	msg := `"messages":[{"role":"user","content":"Item 7. Provide your evaluation as a JSON object."}]`
	bodies := map[int64]string{
		1: `{"model":"claude-sonnet-4-6","max_tokens":256,` + msg + `}`,
		2: `{"model":"claude-sonnet-4-6","max_tokens":256,"inference_geo":"us",` + msg + `}`,
		3: `{"model":"claude-sonnet-4-6","max_tokens":256,"system":[{"type":"text","text":"R","cache_control":{"type":"ephemeral"}}],` + msg + `}`,
		4: `{"model":"claude-sonnet-4-6","max_tokens":256,"cache_control":{"type":"ephemeral","ttl":"1h"},` + msg + `}`,
	}
	want := map[int64]cost.Bound{
		1: {}, 2: {GeoUS: true}, 3: {CacheWrite: cost.CacheWrite5m}, 4: {CacheWrite: cost.CacheWrite1h},
		5: {GeoUS: true, CacheWrite: cost.CacheWrite1h}, // unreadable
	}
	r := &Route{cfg: Config{Prices: cost.Default(), Body: func(it store.Item) (json.RawMessage, error) {
		if b, ok := bodies[it.Seq]; ok {
			return json.RawMessage(b), nil
		}
		return nil, errors.New("the input changed")
	}}, gate: spend.New("--max-cost", cost.NanosPerUSD, 0)}
	for seq := int64(1); seq <= 5; seq++ {
		it := store.Item{Seq: seq, Model: "claude-sonnet-4-6", MaxTokens: 256, EstInput: 40, Length: int64(len(bodies[seq])) + 30}
		b := want[seq]
		b.Model, b.MaxTokens, b.Batch = it.Model, 256, true
		b.Input = int64(len(bodies[seq]))
		if b.Input == 0 {
			b.Input = max(it.EstInput, it.Length)
		}
		w, _ := cost.Default().WorstCase(b)
		if got := r.worstCase(it); got != w {
			t.Errorf("item %d: worst case %v, want %v (%+v)", seq, got, w, b)
		}
	}
}

// Under --max-cost an OpenAI item on the batch route is bounded as its
// body reads: each image part at the most an image costs, however few
// bytes its URL takes. Before, its body was not read, and a line of 100
// image parts was bounded by its bytes alone (1,291,400 n$ of its 78,091,400 n$).
func TestOpenAIWorstCaseReadsItsBody(t *testing.T) {
	t.Parallel()
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[` +
		strings.Repeat(`{"type":"image_url","image_url":{"url":"https://x.io/a.png"}},`, 100) + `{"type":"text","text":"Describe these."}]}]}`
	r := &Route{cfg: Config{Prices: cost.Default(), Body: func(store.Item) (json.RawMessage, error) { return json.RawMessage(body), nil }},
		gate: spend.New("--max-cost", cost.NanosPerUSD, 0)}
	it := store.Item{Seq: 1, Provider: "openai", Model: "gpt-4.1-mini", MaxTokens: 16, EstInput: 60, Length: int64(len(body)) + 60}
	want, err := upstream.OpenAI.WorstCase(nil, upstream.Item{Model: it.Model, EstInput: it.EstInput, Length: it.Length, MaxTokens: 16}, []byte(body), true)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.worstCase(it); got < want {
		t.Errorf("worst case %d n$, below its body's %d n$", got, want)
	}
}
