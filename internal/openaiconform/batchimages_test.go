package openaiconform

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/openai"
)

// An OpenAI batch's lines are bounded as its chat completions are: each
// image part at the most an image costs, however few bytes its URL
// takes. The worst case held against a client's max_cost at the batch's
// create must count them, or a batch of image lines is billed past it.
func TestOpenAIBatchMaxCostHeldWithImageParts(t *testing.T) {
	run := batchSim(t, 1200)
	var parts []string
	for i := range 100 {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":"https://x.io/%d.png"}}`, i))
	}
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these."},` +
		strings.Join(parts, ",") + `]}]}`
	const n = 5
	var in strings.Builder
	for i := range n {
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("img-%d", i), Method: "POST", URL: "/v1/chat/completions", Body: json.RawMessage(body)})
		in.Write(append(line, '\n'))
	}
	// Every byte of each body a prompt token, twice over, at the batch
	// price: far above what its text could cost.
	one, err := cost.OpenAI().WorstCase("gpt-4.1-mini", 2*int64(len(body)), 16, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	maxCost := n * one
	g, url, _ := serve(t, run, func(c *gateway.Config) { c.Clients[0].MaxCost = maxCost })
	alice := gwClient(url, tokA)
	f := upload(t, alice, []byte(in.String()))
	b, err := newBatch(alice, f.ID)
	if err == nil {
		done, _ := awaitBatch(t, alice, b.ID)
		t.Logf("batch %s", done.Status)
	}
	time.Sleep(100 * time.Millisecond)
	_, bill := simBatchEntries(run)
	spent := g.Ledger().ByOrg()[gateway.OrgGatewayBatches]
	t.Logf("%d lines of %d bytes with 100 image parts each: create %v; max_cost %s, ledger %s, simulator bill %s", n, len(body), err, maxCost, spent, bill)
	if bill > maxCost {
		t.Errorf("the simulator billed %s, above client a's max_cost %s", bill, maxCost)
	}
}
