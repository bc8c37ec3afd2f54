package sim_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/apidispatch/apidispatch/sim"
)

// Serve the origin-3org preset at 20× speed, send one request with one of
// its keys, and read the bill.
func ExampleStart() {
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		panic(err)
	}
	cfg.Speed = 20
	run, err := sim.Start(cfg)
	if err != nil {
		panic(err)
	}
	defer run.Close()

	req, _ := http.NewRequest("POST", run.URL+"/v1/messages", strings.NewReader(
		`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("x-api-key", run.Server.Keys()["high_prio"][0])
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	fmt.Println(resp.StatusCode, resp.Header.Get("anthropic-ratelimit-requests-limit"))
	t := run.Server.LedgerTotals()
	fmt.Println(t.Requests, t.ByOrg["high_prio"].Requests, t.CostNanos > 0)
	// Output:
	// 200 600000
	// 1 1 true
}
