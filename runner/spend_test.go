package runner_test

import (
	"errors"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/spend"
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
