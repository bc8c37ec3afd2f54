//go:build long

package runner_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/store"
)

// TestAutoMaxCostHoldsWithBothRoutes: 'run --route auto --deadline' with
// --max-cost at 45 % of the projected all-sync cost, the sync engine and
// the batch route running at once. Each used to keep the cap alone (the
// engine its own completions and requests in flight, the batch route its
// open batches), so together they passed it by a third. With one spend
// gate for the run, the simulator's ledger stays within the cap, the run
// stops resumable (exit 4) saying --max-cost was reached, and a resume
// without the cap ends every item exactly once, nothing billed twice.
func TestAutoMaxCostHoldsWithBothRoutes(t *testing.T) {
	const n, k = 3000, 10
	// The planner is told batches start 120 API s after their create and
	// process 600 requests a minute (so a deadline of 200 API s splits the
	// items between the routes); the simulator's batches start after 5 s
	// and run fifty times faster, so that the cap, not the deadline, ends
	// the run.
	b := newBench(t, n, k, fastBatches)
	limits := &plan.Limits{Batch: &plan.BatchModel{QueueWaitS: 120, PerMinute: 600, PollS: 10}}
	maxCost := b.projectedAllSync(t, limits) * 45 / 100
	dir := filepath.Join(t.TempDir(), "run")
	run := func(maxCost cost.Nanos, deadline time.Duration) runner.Outcome {
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteAuto, Deadline: deadline, Limits: limits, Stderr: &log,
			Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, MaxCost: maxCost},
		})
		t.Logf("run (--max-cost %s, --deadline %s): exit %d, %v\n%s", maxCost, deadline, out.Code(), out.Err, log.String())
		return out
	}
	first := run(maxCost, 20*time.Second)
	s := first.Summary
	if s == nil {
		t.Fatalf("no summary: %v", first.Err)
	}
	// A batch left running at the stop (the deadline can end the batch
	// route after the cap stopped the sync engine) bills when it ends:
	// its worst case stayed reserved, so the ledger is read once every
	// batch has ended.
	for i := 0; simInProgress(b.sim) > 0; i++ {
		if i == 6000 {
			t.Fatalf("the simulator's batches have not ended after a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	billed, requests, _ := ledgerAudit(b.sim)
	br, sr := s.ByRoute[store.RouteBatch], s.ByRoute[store.RouteSync]
	_, created := simCreated(b.sim)
	t.Logf("cap %s (45%% of the projected all-sync cost): ledger %s for %d requests (%.1f%% of the cap); by sync %+v, by batch %+v; %d batches created, %+v; stop: %s",
		maxCost, billed, requests, 100*float64(billed)/float64(maxCost), sr, br, created, s.Batches, s.StopReason)
	if billed > maxCost {
		t.Errorf("the simulator billed %s, past --max-cost %s by %.1f%%", billed, maxCost, 100*(float64(billed)/float64(maxCost)-1))
	}
	// Both routes sent: which takes how much of the cap depends on who
	// reserves first (under the race detector the sync engine often takes
	// nearly all of it).
	if sr == nil || sr.Items == 0 || created == 0 {
		t.Errorf("by_route sync %+v, %d batches created: both routes must have run", sr, created)
	}
	if first.Code() != runner.ExitIncomplete || !strings.Contains(s.StopReason, "--max-cost") || s.Unfinished == 0 {
		t.Errorf("exit %d, %d unfinished, stop %q: want exit 4 (resumable), stopped by --max-cost", first.Code(), s.Unfinished, s.StopReason)
	}
	if t.Failed() {
		return
	}
	// The same command again: the gate is seeded with what the run spent,
	// so it goes on against the same cap and stops at once.
	again := run(maxCost, 20*time.Second)
	if billed, _, _ := ledgerAudit(b.sim); billed > maxCost || again.Code() != runner.ExitIncomplete || again.Summary == nil || !strings.Contains(again.Summary.StopReason, "--max-cost") {
		t.Fatalf("resumed with the same cap: exit %d, ledger %s (cap %s), %v", again.Code(), billed, maxCost, again.Err)
	}
	// Resume without the cap (and without a deadline: every free item by
	// batch).
	out := run(0, 0)
	if out.Code() != runner.ExitOK {
		t.Fatalf("the resume: exit %d, %v", out.Code(), out.Err)
	}
	c := b.audit(dir)
	total, requests, twice := ledgerAudit(b.sim)
	if twice != 0 || requests != n || c.Lines != n {
		t.Fatalf("after the resume: %d requests billed for %d items, %d twice; %d result lines", requests, n, twice, c.Lines)
	}
	if out.Summary.Cost.TotalNanos != int64(total) {
		t.Fatalf("summary cost %d nanos, ledger %d", out.Summary.Cost.TotalNanos, total)
	}
	t.Logf("resume: %d items each billed once, ledger %s = summary", n, total)
}

// TestPilotMaxCostOneGate: --pilot spends by sync before the routes run;
// its spend counts against the same --max-cost as every route after it.
// A cap below the pilot's cost stops the pilot itself; a cap above it
// leaves the batch route only the rest. Either way the simulator's ledger
// stays within the cap and the run stops resumable, saying why.
func TestPilotMaxCostOneGate(t *testing.T) {
	const n, k, pilot = 1500, 20, 300
	for _, tc := range []struct {
		name string
		frac int64 // the cap, in % of the projected all-sync cost
	}{{"cap below the pilot", 5}, {"cap past the pilot", 30}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, n, k, fastBatches)
			maxCost := b.projectedAllSync(t, nil) * cost.Nanos(tc.frac) / 100
			var log bytes.Buffer
			out := runner.Run(t.Context(), runner.Config{
				Input: b.input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Route: runner.RouteBatch, Pilot: pilot, Stderr: &log,
				Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, MaxCost: maxCost},
			})
			t.Logf("exit %d, %v\n%s", out.Code(), out.Err, log.String())
			billed, requests, twice := ledgerAudit(b.sim)
			s := out.Summary
			if s == nil {
				t.Fatalf("no summary: %v", out.Err)
			}
			sr := s.ByRoute[store.RouteSync]
			t.Logf("cap %s: ledger %s for %d requests (%.1f%% of the cap), %d by sync (the pilot), batches %+v; stop: %s",
				maxCost, billed, requests, 100*float64(billed)/float64(maxCost), sr.Items, s.Batches, s.StopReason)
			if billed > maxCost || twice != 0 {
				t.Fatalf("the simulator billed %s (%d twice) under --max-cost %s", billed, twice, maxCost)
			}
			if out.Code() != runner.ExitIncomplete || !strings.Contains(s.StopReason, "--max-cost") {
				t.Fatalf("exit %d, stop %q: want 4, stopped by --max-cost", out.Code(), s.StopReason)
			}
			_, created := simCreated(b.sim)
			pilotDone := sr != nil && sr.Items == pilot
			if pilotDone == (created == 0) {
				t.Fatalf("pilot done %v (by sync %+v), %d batches created: batches come only after a whole pilot", pilotDone, sr, created)
			}
			if tc.frac == 5 && pilotDone || tc.frac == 30 && !pilotDone {
				t.Fatalf("a cap of %d%% of the all-sync cost: the pilot of %d of %d items done %v", tc.frac, pilot, n, pilotDone)
			}
		})
	}
}
