package runner_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/runner"
)

// TestOpenAIBatchMaxCostHeldWithImageParts: --max-cost on the batch
// route holds with OpenAI items whose image parts are billed far above
// their bytes (100 short image URLs a line): each item's worst case is
// its body's, so the ledger never passes the cap.
func TestOpenAIBatchMaxCostHeldWithImageParts(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 1, 2000, gptLimits)
	images := strings.TrimSuffix(strings.Repeat(`{"type":"image_url","image_url":{"url":"https://x.io/a.png"}},`, 100), ",")
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these, 00."},` + images + `]}]}`
	const n = 20
	var in strings.Builder
	for i := range n {
		body := fmt.Sprintf(`{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these, %02d."},`, i) + images + `]}]}`
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("img-%02d", i), Method: "POST", URL: "/v1/chat/completions", Body: json.RawMessage(body)})
		in.Write(append(line, '\n'))
	}
	b.input = filepath.Join(t.TempDir(), "images.jsonl")
	if err := os.WriteFile(b.input, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each line's bytes as prompt tokens, twice over, at the batch rates,
	// for half the items.
	one, err := cost.OpenAI().WorstCase("gpt-4.1-mini", 2*int64(len(body)), 16, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	maxCost := n / 2 * one
	res, err, _ := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Sync: dispatch.Config{MaxCost: maxCost}})
	total, billed, twice := batchLedger(b.sim.Server.Ledger())
	t.Logf("cap %s: %d of %d image items billed %s (%v)", maxCost, billed, n, cost.Nanos(total), err)
	if cost.Nanos(total) > maxCost || twice != 0 {
		t.Errorf("ledger %s above --max-cost %s (%d billed twice; result %+v)", cost.Nanos(total), maxCost, twice, res)
	}
}
