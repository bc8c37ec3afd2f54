//go:build long

package runner_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store"
)

// TestAutoMeetsDeadlineCheaper: a deadline shorter than the batch route's
// expected completion; auto sends part by batch and the rest by sync, ends
// before the deadline and costs less than all-sync would.
func TestAutoMeetsDeadlineCheaper(t *testing.T) {
	const n, k = 6000, 5
	b, limits := autoSim(t, n, k)
	deadline := 12 * time.Second // 60 API s; all by batch would take 80
	a := b.runAuto(t, limits, deadline)
	out := a.out
	if out.Code() != runner.ExitOK || out.Err != nil {
		t.Fatalf("auto: exit %d, %v", out.Code(), out.Err)
	}
	s := out.Summary
	b.audit(out.Dir)
	br, sr := s.ByRoute[store.RouteBatch], s.ByRoute[store.RouteSync]
	if br == nil || sr == nil || br.Items == 0 || sr.Items == 0 || br.Items+sr.Items != n {
		t.Fatalf("by_route %+v %+v: want both routes, %d items in all", br, sr, n)
	}
	// The router's figures are the first invocation's (a resume splits
	// what is left).
	r := checkAutoDeadline(t, a, deadline, k)
	// Cheaper than all-sync as the router projected it, and by as much:
	// the run's cost over what its items would cost by sync is the
	// router's projected ratio within 0.02 (not merely "some item went by
	// batch", which holds whatever the split).
	if !(r.Auto.ExpectedUSD < r.Sync.ExpectedUSD) {
		t.Fatalf("the router projected auto at $%.6f, all sync at $%.6f: not cheaper", r.Auto.ExpectedUSD, r.Sync.ExpectedUSD)
	}
	// A resume (a missed deadline on a race build or a loaded machine)
	// splits what is left again, by its own projection: then the run must
	// still cost less than all-sync.
	got, want := s.Cost.Total/allSyncUSD(s), r.Auto.ExpectedUSD/r.Sync.ExpectedUSD
	tol := 0.02
	if a.resumes > 0 {
		tol = 1 - want
	}
	if math.Abs(got-want) > tol || got >= 1 {
		t.Fatalf("auto cost %.3f of all-sync ($%.6f of $%.6f); the router projected %.3f ($%.6f of $%.6f)",
			got, s.Cost.Total, allSyncUSD(s), want, r.Auto.ExpectedUSD, r.Sync.ExpectedUSD)
	}
	if total, _, twice := batchLedger(b.sim.Server.Ledger()); total != br.CostNanos || twice != 0 {
		t.Fatalf("batch route %d nanos, ledger %d (%d twice)", br.CostNanos, total, twice)
	}
	t.Logf("N=%d, deadline %s (%g API s): %d by batch ($%.6f) + %d by sync ($%.6f) in %.1f s (projected %.1f API s); $%.6f (projected $%.6f) against $%.6f all by sync (%.1f%% less)",
		n, deadline, deadline.Seconds()*k, br.Items, br.CostUSD, sr.Items, sr.CostUSD, a.wallS, r.Auto.WallS, s.Cost.Total, r.Auto.ExpectedUSD, allSyncUSD(s), 100*(1-s.Cost.Total/allSyncUSD(s)))
}

// TestAutoCancelsLateBatches: one org's batch stalls (it would only end at
// expiry, 24 h on); auto cancels it when it has not ended by when the
// batch model expects, harvests what it finished, and sends the rest by
// sync, in time: the split left room for one org's batch to be redone.
func TestAutoCancelsLateBatches(t *testing.T) {
	const n, k = 8000, 10
	b, limits := autoSim(t, n, k, sim.Fault{Kind: sim.FaultBatchStall, Org: "low_prio", Fraction: 0.3})
	deadline := 12 * time.Second // 120 API s
	a := b.runAuto(t, limits, deadline)
	out := a.out
	if out.Code() != runner.ExitOK || out.Err != nil {
		t.Fatalf("auto: exit %d, %v", out.Code(), out.Err)
	}
	s := out.Summary
	evs := readEvents(t, out.Dir)
	for _, e := range evs {
		if e.Kind != rundir.EventSample && e.Kind != rundir.EventProgress {
			t.Logf("%6.2f s  %s: %s", e.TS.Sub(evs[0].TS).Seconds(), e.Kind, e.Note)
		}
	}
	b.audit(out.Dir)
	br := s.ByRoute[store.RouteBatch]
	if br == nil || br.Items == 0 || s.Batches.Retried == 0 {
		t.Fatalf("by_route batch %+v, batches %+v: want a part harvested and the rest sent again", br, s.Batches)
	}
	checkAutoDeadline(t, a, deadline, k)
	late := 0
	for _, e := range evs {
		if e.Kind == rundir.EventBatch && strings.Contains(e.Note, "is late") {
			late++
		}
	}
	if late == 0 {
		t.Fatal("no batch was cancelled as late")
	}
	t.Logf("%d batches cancelled as late; %d items by batch, %d by sync, %.1f s of a %s deadline", late, br.Items, s.ByRoute[store.RouteSync].Items, s.WallS, deadline)
}

// TestBatchRouteHalfPrice: 3,000 items.
func TestBatchRouteHalfPrice(t *testing.T) { batchRouteHalfPrice(t, 3000) }
