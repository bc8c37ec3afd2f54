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

// JSON lets a body spell any character of a key or a string as a \u
// escape, and the API reads "service\u005ftier" as service_tier and
// "image\u005furl" as image_url. The worst case reserved against a
// client's max_cost must read the body as the API does: a body that hides
// its priority tier, or its image parts, behind an escape is billed at
// priority rates, or for its images, all the same.
func TestOpenAIServeMaxCostHeldWithEscapedFields(t *testing.T) {
	var parts []string
	for i := range 100 {
		parts = append(parts, fmt.Sprintf(`{"type":"image\u005furl","image\u005furl":{"url":"https://x.io/%d.png"}}`, i))
	}
	for _, c := range []struct {
		name, body string
		maxOut     int64
	}{
		{"escaped service_tier", `{"model":"gpt-4.1-mini","max_completion_tokens":2000,"service\u005ftier":"priority","messages":[{"role":"user","content":"Write at length."}]}`, 2000},
		{"escaped image_url", `{"model":"gpt-4.1-mini","max_completion_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these."},` + strings.Join(parts, ",") + `]}]}`, 16},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, oaOrgs)
			// The standard rates' worst case of every byte a prompt token,
			// twice over.
			maxCost, err := cost.OpenAI().WorstCase("gpt-4.1-mini", 2*int64(len(c.body)), c.maxOut, 1, false)
			if err != nil {
				t.Fatal(err)
			}
			g, url, _ := serve(t, run, func(cf *gateway.Config) { cf.Clients[0].MaxCost = maxCost })
			req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader([]byte(c.body)))
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
			t.Logf("%d-byte body: status %d; max_cost %s, ledger %s, simulator bill %s", len(c.body), resp.StatusCode, maxCost, spent, bill)
			if bill > maxCost {
				t.Errorf("the simulator billed %s, above client a's max_cost %s (answer %.200s)", bill, maxCost, answer)
			}
			if bill > spent {
				t.Errorf("the simulator billed %s, the ledger holds %s", bill, spent)
			}
		})
	}
}
