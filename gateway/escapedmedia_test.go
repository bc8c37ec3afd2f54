package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// An image block is billed as an image whatever spells it: a type written
// with a \u escape ("imag\u0065", which the API reads as "image"), or a
// base64 source of a few bytes (a PNG of a large blank image compresses
// to a few hundred bytes and is billed at the most an image costs). The
// worst case reserved against max_cost must count each at the most an
// image costs.
func TestMaxCostHeldWithEscapedAndSmallImages(t *testing.T) {
	for _, c := range []struct{ name, block string }{
		{"escaped type", `{"type":"imag\u0065","source":{"type":"url","url":"https://x.io/%d.png"}}`},
		{"small base64", `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo%d"}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
			var blocks []string
			for i := range 100 {
				blocks = append(blocks, fmt.Sprintf(c.block, i))
			}
			body := `{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"Describe these."},` +
				strings.Join(blocks, ",") + `]}]}`
			price, err := cost.Default().Lookup("claude-haiku-4-5")
			if err != nil {
				t.Fatal(err)
			}
			// Every byte of the body an input token, twice over.
			maxCost, err := price.WorstCase(cost.Bound{Model: "claude-haiku-4-5", Input: 2 * int64(len(body)), MaxTokens: 16, GeoUS: true, CacheWrite: cost.CacheWrite1h})
			if err != nil {
				t.Fatal(err)
			}
			g, srv := startGW(t, run, func(c *Config) { c.Clients[0].MaxCost = maxCost })
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("x-api-key", tokA)
			req.Header.Set("anthropic-version", "2023-06-01")
			req.Header.Set("content-type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			waitIdle(t, g)
			bill := cost.Nanos(run.Server.LedgerTotals().CostNanos)
			t.Logf("a %d-byte request with 100 images: status %d; max_cost %s, simulator bill %s", len(body), resp.StatusCode, maxCost, bill)
			if bill > maxCost {
				t.Errorf("the simulator billed %s, above client a's max_cost %s (answer %.200s)", bill, maxCost, answer)
			}
		})
	}
}
