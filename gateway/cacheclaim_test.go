package gateway

import (
	"bytes"
	"path/filepath"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// Two gateways on one cache file (two connections to it, as two processes
// have), the same 50 prompts sent to both at once: each prompt is billed
// once, and both clients of a prompt get the same body. Before claims in
// the cache file, each gateway sent its own: about 100 billed.
func TestGatewayCacheTwoGatewaysOneFileSendOnce(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	_, srv1 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	_, srv2 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	const n = 50
	var answers [2][n]gwAnswer
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		for s, url := range []string{srv1.URL, srv2.URL} {
			wg.Go(func() {
				<-start
				answers[s][i] = postMessage(t, url, tokA, judgeBody(1000+i, ""))
			})
		}
	}
	close(start)
	wg.Wait()
	differ := 0
	for i := range n {
		a, b := answers[0][i], answers[1][i]
		if a.status != 200 || b.status != 200 {
			t.Fatalf("prompt %d: %d and %d:\n%s\n%s", i, a.status, b.status, a.body, b.body)
		}
		if !bytes.Equal(a.body, b.body) {
			differ++
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d prompts got two different bodies from the two gateways", differ, n)
	}
	if got := run.Server.LedgerTotals().Requests; got != n {
		t.Errorf("%d prompts sent to two gateways on one cache file at once: the API billed %d requests, want %d", n, got, n)
	}
	if got := cacheEntries(t, openCache(t, path)); got != n {
		t.Errorf("%d entries, want %d", got, n)
	}
}
