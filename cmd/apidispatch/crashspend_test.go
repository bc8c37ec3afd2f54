package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// postGW sends a Messages body to the gateway at base; a connection cut
// (the gateway killed) is an error, not a failure of the test.
func postGW(base, token string, body []byte) (int, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Issue 28: three kill -9s of 'apidispatch serve', each with requests in
// flight that the API bills though nobody reads their answers (the
// simulator bills abandoned requests), then client alice (max_cost $0.02)
// spends until refused. Every reservation in flight used to die with the
// process, so the restarted gateway let her spend that money again: $0.0351
// billed on the $0.02 cap. Each attempt is now journaled before it is sent
// and a restart counts the open ones at their worst case: the bill stays
// within the cap.
func TestServeKillNineWithRequestsInFlightHoldsMaxCost(t *testing.T) {
	const speed = 50
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) { c.BillAbandoned = true })
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	const alice = "sk-gw-crash-alice-0000001"
	clients := filepath.Join(dir, "clients.toml")
	if err := os.WriteFile(clients, []byte("[[client]]\nname = \"alice\"\ntoken = \""+alice+"\"\nmax_cost = 0.02\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--speed", fmt.Sprint(speed), "--clients", clients, "--state-dir", state}
	body := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i))
	}
	inFlight := func() (n int64) {
		for _, o := range run.Server.Stats().Orgs {
			n += o.InFlight
		}
		return n
	}
	item := 0
	const k = 8
	for round := 1; round <= 3; round++ {
		p, base, _ := startServe(t, run, args...)
		// A fresh gateway sends one request per key until it has seen the
		// key's rate-limit headers: a few quick answers first, so that
		// all k go upstream at once.
		for range 6 {
			item++
			if status, b, err := postGW(base, alice, body(item)); err != nil || status != http.StatusOK {
				t.Fatalf("round %d: warm-up %d %s %v", round, status, b, err)
			}
		}
		// Slow answers (150 API s, 3 s here) keep the requests upstream
		// across the kill.
		if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 150 * time.Second, FromNow: true}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range k {
			item++
			b := body(item)
			wg.Go(func() { postGW(base, alice, b) })
		}
		deadline := time.Now().Add(20 * time.Second)
		for inFlight() < k && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if n := inFlight(); n < k {
			t.Fatalf("round %d: %d requests upstream before the kill, want %d", round, n, k)
		}
		p.Signal(syscall.SIGKILL)
		p.Wait()
		wg.Wait()
		run.Server.ClearFaults("slow")
		// The simulator bills the abandoned requests when their answers
		// are done.
		for end := time.Now().Add(30 * time.Second); inFlight() > 0 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		}
	}
	abandoned := run.Server.LedgerTotals() // the warm-ups' and the abandoned requests' bill
	// Alice spends until the restarted gateway refuses her.
	_, base, _ := startServe(t, run, args...)
	spent, refused := 0, false
	for spent < 200 && !refused {
		item++
		status, b, err := postGW(base, alice, body(item))
		switch {
		case err != nil:
			t.Fatal(err)
		case status == http.StatusBadRequest && strings.Contains(string(b), anthropic.SpendLimitMessagePrefix):
			refused = true
		case status != http.StatusOK:
			t.Fatalf("request %d: %d %s", item, status, b)
		default:
			spent++
		}
	}
	billed := run.Server.LedgerTotals()
	t.Logf("3 kills with %d requests in flight each: %d requests billed %v by then; then %d answers until refused (%v): %d requests billed %v on the $0.02 cap",
		k, abandoned.Requests, cost.Nanos(abandoned.CostNanos), spent, refused, billed.Requests, cost.Nanos(billed.CostNanos))
	if abandoned.Requests < 3*k || !refused {
		t.Fatalf("%d abandoned requests billed, refused %v: the test proves nothing", abandoned.Requests, refused)
	}
	if billed.CostNanos > 20_000_000 {
		t.Errorf("the simulator billed %v, past alice's max_cost $0.02", cost.Nanos(billed.CostNanos))
	}
}
