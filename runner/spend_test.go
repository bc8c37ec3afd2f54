package runner_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
)

// projectedAllSync is plan's expected cost of b's input, every item by sync.
func (b *bench) projectedAllSync(t *testing.T, limits *plan.Limits) cost.Nanos {
	t.Helper()
	ws, err := rundir.Validate(b.input, cost.Default())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range b.orgs {
		names = append(names, o.Name)
	}
	p, err := plan.Project(plan.Input{Workload: ws, Prices: cost.Default(), Orgs: names, Limits: limits, Speed: b.speed})
	if err != nil {
		t.Fatal(err)
	}
	return p.ExpectedCost
}

// fastBatches makes the simulator's batches start 5 API s after their
// create and process 30,000 requests a minute per org.
func fastBatches(c *sim.Config) {
	for i := range c.Orgs {
		c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute, c.Orgs[i].Batch.CancelS = 5, 30000, 1
	}
}

// simInProgress counts the simulator's batches that have not ended.
func simInProgress(r *sim.Running) int {
	n := 0
	for _, st := range r.Server.BatchStats() {
		n += st.InProgress
	}
	return n
}

// ledgerAudit sums the simulator's ledger (sync and batch requests alike)
// and counts the requests billed more than once, by their params' hash
// (the prompt: the same for an item by sync and in a batch).
func ledgerAudit(r *sim.Running) (billed cost.Nanos, requests, twice int) {
	seen := map[sim.BodyHash]int{}
	for _, e := range r.Server.Ledger() {
		billed += cost.Nanos(e.CostNanos)
		requests++
		if seen[e.BodySHA256]++; seen[e.BodySHA256] == 2 {
			twice++
		}
	}
	return billed, requests, twice
}

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

// TestBatchRouteStoppedByASpendCapKeepsItsError: a batch-route run whose
// spend gate has no room for the next batch's first request stops with
// the cap's *spend.CapError in its error chain, as the sync route's stop
// does. The batch route gave only its text, so a gateway batch refused by
// its client's max_cost, which ends when errors.As finds the cap, was run
// again and again for ever (TestClientCapSharedBySyncAndBatch, 1 run in 4).
func TestBatchRouteStoppedByASpendCapKeepsItsError(t *testing.T) {
	b := newBench(t, 4, 1000, fastBatches)
	gate := spend.New("client a's max_cost", cost.Nanos(1_000), 0) // less than any request's worst case
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.Spend = gate
	res, err, _ := b.exec(t.Context(), "", x)
	if res == nil || res.Complete {
		t.Fatalf("run complete %v with a cap below one request: %v", res != nil && res.Complete, err)
	}
	var ce *spend.CapError
	if !errors.As(err, &ce) || !errors.Is(err, dispatch.ErrIncomplete) {
		t.Fatalf("batch route stopped by its spend cap: error %v (%T), want ErrIncomplete with the *spend.CapError under it", err, err)
	}
	if b.sim.Server.LedgerTotals().Requests != 0 {
		t.Errorf("%d requests billed past a cap below one", b.sim.Server.LedgerTotals().Requests)
	}
}
