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
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store"
)

// projectedAllSync is plan's expected cost of b's input, every item by sync.
func (b *bench) projectedAllSync(t *testing.T, limits *plan.Limits) cost.Nanos {
	t.Helper()
	ws, err := dispatch.Validate(b.input, cost.Default())
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
	// The planner is told batches start 30 API s after their create and
	// process 3,000 requests a minute (so a 60 API s deadline splits the
	// items between the routes); the simulator's batches start after 5 s
	// and run ten times faster, so that the cap, not the deadline, ends
	// the run.
	b := newBench(t, n, k, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute, c.Orgs[i].Batch.CancelS = 5, 30000, 1
		}
	})
	limits := &plan.Limits{Batch: &plan.BatchModel{QueueWaitS: 30, PerMinute: 3000, PollS: 10}}
	maxCost := b.projectedAllSync(t, limits) * 45 / 100
	dir := filepath.Join(t.TempDir(), "run")
	run := func(maxCost cost.Nanos, deadline time.Duration) runner.Outcome {
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteAuto, Deadline: deadline, Limits: limits, Stderr: &log,
			Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, MaxCost: maxCost},
		})
		t.Logf("run (--max-cost %s, --deadline %s): exit %d, %v\n%s", maxCost, deadline, out.Code, out.Err, log.String())
		return out
	}
	first := run(maxCost, 6*time.Second)
	billed, requests, _ := ledgerAudit(b.sim)
	s := first.Summary
	if s == nil {
		t.Fatalf("no summary: %v", first.Err)
	}
	br, sr := s.ByRoute[store.RouteBatch], s.ByRoute[store.RouteSync]
	t.Logf("cap %s (45%% of the projected all-sync cost): ledger %s for %d requests (%.1f%% of the cap); by sync %+v, by batch %+v; batches %+v; stop: %s",
		maxCost, billed, requests, 100*float64(billed)/float64(maxCost), sr, br, s.Batches, s.StopReason)
	if billed > maxCost {
		t.Errorf("the simulator billed %s, past --max-cost %s by %.1f%%", billed, maxCost, 100*(float64(billed)/float64(maxCost)-1))
	}
	if br == nil || sr == nil || br.Items == 0 || sr.Items == 0 {
		t.Errorf("by_route sync %+v, batch %+v: both routes must have run", sr, br)
	}
	if first.Code != runner.ExitIncomplete || !strings.Contains(s.StopReason, "--max-cost") || s.Unfinished == 0 {
		t.Errorf("exit %d, %d unfinished, stop %q: want exit 4 (resumable), stopped by --max-cost", first.Code, s.Unfinished, s.StopReason)
	}
	if s.Batches != nil && s.Batches.Open > 0 {
		// Left running, they would bill past the cap after the run says
		// it stopped.
		t.Errorf("%d batches left open at a --max-cost stop", s.Batches.Open)
	}
	if t.Failed() {
		return
	}
	// Resume without the cap (and without a deadline: every free item by
	// batch).
	out := run(0, 0)
	if out.Code != runner.ExitOK {
		t.Fatalf("the resume: exit %d, %v", out.Code, out.Err)
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
