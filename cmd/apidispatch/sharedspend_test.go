package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/redis/go-redis/v9"
)

// Issue 27: two 'apidispatch serve' on one Redis (--shared) and one
// clients file, alice (max_cost $0.05) spread over both; one of them is
// killed (-9) with her requests in flight, which the API bills though
// nobody reads their answers, and started again on its state directory.
// Her max_cost is one budget across the gateways and across the kill: the
// reservations the dead gateway left open in Redis stay counted while it is
// down, and its restart keeps each at its worst case (none is left open);
// the simulator's bill stays within her max_cost, and within 95 % of it
// once she has spent until refused.
func TestServeSharedMaxCostAcrossGatewaysAndKillNine(t *testing.T) {
	const speed = 50
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) { c.BillAbandoned = true })
	dir := t.TempDir()
	const alice = "sk-gw-shared-alice-000001"
	const capN = cost.Nanos(50_000_000)
	clients := filepath.Join(dir, "clients.toml")
	if err := os.WriteFile(clients, []byte("[[client]]\nname = \"alice\"\ntoken = \""+alice+"\"\nmax_cost = 0.05\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	states := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}
	start := func(i int) (*os.Process, string) {
		p, base, _ := startServe(t, run, "--speed", fmt.Sprint(speed), "--clients", clients, "--state-dir", states[i], "--shared", rs.URL())
		return p, base
	}
	// max_tokens 64: the simulator's answers run to it, so an answer costs
	// about its worst case and the cap can be spent to within a few.
	body := func(i int64) []byte {
		return fmt.Appendf(nil, `{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i)
	}
	inFlight := func() (n int64) {
		for _, o := range run.Server.Stats().Orgs {
			n += o.InFlight
		}
		return n
	}
	pa, baseA := start(0)
	_, baseB := start(1)
	var item atomic.Int64
	// A third of her budget through both gateways.
	for billed := int64(0); billed < int64(capN)/3; billed = run.Server.LedgerTotals().CostNanos {
		for _, base := range []string{baseA, baseB} {
			if status, b, err := postGW(base, alice, body(item.Add(1))); err != nil || status != http.StatusOK {
				t.Fatalf("%d %s %v", status, b, err)
			}
		}
	}
	// Slow answers (150 API s, 3 s here) keep k requests upstream across
	// the kill of gateway a.
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 150 * time.Second, FromNow: true}); err != nil {
		t.Fatal(err)
	}
	const k = 8
	var wg sync.WaitGroup
	for range k {
		b := body(item.Add(1))
		wg.Go(func() { postGW(baseA, alice, b) })
	}
	for end := time.Now().Add(20 * time.Second); inFlight() < k && time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
	}
	if n := inFlight(); n < k {
		t.Fatalf("%d requests upstream before the kill, want %d", n, k)
	}
	pa.Signal(syscall.SIGKILL)
	pa.Wait()
	wg.Wait()
	run.Server.ClearFaults("slow")
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	id, err := os.ReadFile(filepath.Join(states[0], "spend-id"))
	if err != nil {
		t.Fatal(err)
	}
	resKey := "apidispatch:v1:spend:{spend}:res:" + strings.TrimSpace(string(id))
	if n := rdb.HLen(context.Background(), resKey).Val(); n < k {
		t.Errorf("%d reservations of the killed gateway open in Redis, want its %d in flight", n, k)
	}
	for end := time.Now().Add(30 * time.Second); inFlight() > 0 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
	}
	_, baseA = start(0)
	if n := rdb.HLen(context.Background(), resKey).Val(); n != 0 {
		t.Errorf("%d reservations of the killed gateway still open after its restart on its state directory", n)
	}
	// Alice spends until both gateways refuse her.
	var answered, refused atomic.Int64
	var inflight atomic.Int64
	var wg2 sync.WaitGroup
	for range 8 {
		wg2.Go(func() {
			streak := 0
			for {
				i := item.Add(1)
				if i > 3000 {
					t.Errorf("3000 requests and no refusal")
					return
				}
				inflight.Add(1)
				status, b, err := postGW([]string{baseA, baseB}[i%2], alice, body(i))
				alone := inflight.Add(-1) == 0
				switch {
				case err != nil:
					t.Errorf("request %d: %v", i, err)
					return
				case status == http.StatusOK:
					answered.Add(1)
					streak = 0
				case status == http.StatusBadRequest && strings.Contains(string(b), anthropic.SpendLimitMessagePrefix):
					refused.Add(1)
					if alone {
						streak++
					}
					if streak >= 5 {
						return
					}
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("request %d: %d %s", i, status, b)
					return
				}
			}
		})
	}
	wg2.Wait()
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	t.Logf("2 gateways, one killed with %d requests in flight and restarted: then %d answered, %d refused; the simulator billed %s on alice's max_cost %s (%.3f×)",
		k, answered.Load(), refused.Load(), billed, capN, float64(billed)/float64(capN))
	if refused.Load() == 0 {
		t.Fatal("nothing refused: the test proves nothing")
	}
	if billed > capN {
		t.Errorf("billed %s, past alice's max_cost %s", billed, capN)
	}
	if billed < capN*95/100 {
		t.Errorf("billed %s, under 95 %% of alice's max_cost %s though her work exceeded it", billed, capN)
	}
	if n := rdb.HLen(context.Background(), resKey).Val(); n != 0 {
		t.Errorf("%d reservations of the restarted gateway left open once idle", n)
	}
}
