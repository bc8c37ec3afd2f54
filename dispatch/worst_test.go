package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
)

// Under --max-cost the feeder bounds each item by the one worst case of
// its params, with every multiplier they ask for (inference_geo "us",
// cache writes at 5-minute and 1-hour rates), and an item whose params
// cannot be read at every multiplier; without a cap it reads nothing.
func TestFeederBoundsEachItemWithItsMultipliers(t *testing.T) {
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
	var items []store.Item
	for seq := int64(1); seq <= 5; seq++ {
		// The line is the params and the custom_id around them.
		items = append(items, store.Item{Seq: seq, Model: "claude-sonnet-4-6", MaxTokens: 256, EstInput: 40, Length: int64(len(bodies[seq])) + 30})
	}
	read := 0
	e := &Engine{cfg: Config{Prices: cost.Default(), Body: func(it store.Item) (json.RawMessage, error) {
		read++
		if b, ok := bodies[it.Seq]; ok {
			return json.RawMessage(b), nil
		}
		return nil, errors.New("the input changed")
	}}}
	e.gate = spend.New("--max-cost", cost.NanosPerUSD, 0)
	fs, _, err := e.keyItems(context.Background(), items, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		b := want[f.it.Seq]
		b.Model, b.MaxTokens = "claude-sonnet-4-6", 256
		b.Input = int64(len(bodies[f.it.Seq])) // the params' bytes bound their tokens
		if b.Input == 0 {
			b.Input = max(f.it.EstInput, f.it.Length) // unreadable: the line
		}
		w, _ := cost.Default().WorstCase(b)
		if f.worst != w {
			t.Errorf("item %d: worst case %v, want %v (%+v)", f.it.Seq, f.worst, w, b)
		}
	}
	e.gate, read = spend.New("--max-cost", 0, 0), 0
	fs, _, _ = e.keyItems(context.Background(), items, nil)
	if read != 0 || fs[1].worst != 0 {
		t.Errorf("without a cap: %d bodies read, worst %v", read, fs[1].worst)
	}
}
