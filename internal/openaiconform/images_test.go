package openaiconform

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A chat completion's image parts are billed as images, whatever the
// length of their URLs: a short URL is a few dozen bytes of the body and
// hundreds of prompt tokens. The worst case reserved against max_cost
// must count each image at the most it can cost, or a client whose
// max_cost is far above its request's bytes is billed past its max_cost.
func TestOpenAIServeMaxCostHeldWithImageParts(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
	var parts []string
	for i := range 100 {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":"https://x.io/%d.png"}}`, i))
	}
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these."},` +
		strings.Join(parts, ",") + `]}]}`
	// Every byte of the body a prompt token, twice over: far above what
	// its text could cost.
	maxCost, err := cost.OpenAI().WorstCase("gpt-4.1-mini", 2*int64(len(body)), 16, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	g, url, _ := serve(t, run, func(c *gateway.Config) { c.Clients[0].MaxCost = maxCost })
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("authorization", "Bearer "+tokA)
	req.Header.Set("content-type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	spent, bill := spentOn(g, run, "gpt_a", "gpt_b"), openAIBill(run, "gpt_a", "gpt_b")
	t.Logf("a %d-byte body with 100 image parts: status %d; max_cost %s, ledger %s, simulator bill %s", len(body), resp.StatusCode, maxCost, spent, bill)
	if bill > maxCost {
		t.Errorf("the simulator billed %s, above client a's max_cost %s (answer %.200s)", bill, maxCost, answer)
	}
	if bill > spent {
		t.Errorf("the simulator billed %s, the ledger holds %s", bill, spent)
	}
}
