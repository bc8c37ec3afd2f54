package runner_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/runner"
)

// writeGeoUS writes n requests asking for inference_geo "us" (billed
// ×1.1) and a long answer (the simulator's "at length": 1,200 tokens or
// more, so each fills its max_tokens of 1,024) to a file and returns it.
func writeGeoUS(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"g%d","params":{"model":"claude-sonnet-4-6","max_tokens":1024,"inference_geo":"us","messages":[{"role":"user","content":"Item %d: explain the rubric at length."}]}}`+"\n", i, i)
	}
	path := filepath.Join(t.TempDir(), "geo.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 28, on every route of 'run': --max-cost $1.00 over requests with
// inference_geo "us" whose answers fill max_tokens. The worst case each
// request (sync) or batch (the batch route) reserves left out the ×1.1,
// so with the cap's room taken at once the bill passed the cap; now the
// one worst case counts it, and the bill stays within the cap.
func TestMaxCostCountsInferenceGeoUSOnEveryRoute(t *testing.T) {
	const capN = cost.NanosPerUSD // $1.00
	for _, route := range []string{runner.RouteSync, runner.RouteBatch} {
		t.Run(route, func(t *testing.T) {
			b := newBench(t, 1, 200, nil)
			b.input = writeGeoUS(t, 300)
			res, err, _ := b.exec(t.Context(), "", runner.Exec{Route: route, Sync: dispatch.Config{MaxCost: capN}})
			if !errors.Is(err, dispatch.ErrIncomplete) || res == nil || !strings.Contains(res.Stop.Reason, "--max-cost") {
				t.Fatalf("want a run stopped by --max-cost; got %v (%+v)", err, res)
			}
			var billed int64
			var n int
			for _, e := range b.sim.Server.Ledger() {
				billed += e.CostNanos
				n++
			}
			t.Logf("route %s: %d requests billed %v on the $1.00 cap", route, n, cost.Nanos(billed))
			if n < 40 {
				t.Fatalf("only %d requests billed: the test proves little", n)
			}
			if cost.Nanos(billed) > capN {
				t.Errorf("the simulator billed %v, past --max-cost $1.00", cost.Nanos(billed))
			}
		})
	}
}
