package runner_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
)

// A batch run stopped (a signal, or kill -9) leaves its batches running on
// the API; rerunning the same directory with --route sync used to send
// their items again by sync, and the API billed them twice when the batches
// ended (measured from outside: 256 items billed twice, $3.28 on a
// --max-cost of $3). A sync run over a directory with open batches must not
// send their items: nothing is billed twice, and a batch run after it
// harvests them, every item ending once.
func TestSyncResumeDoesNotResendOpenBatchItems(t *testing.T) {
	t.Run("route sync", func(t *testing.T) {
		resumeOverOpenBatches(t, func(c *runner.Config) { c.Route = runner.RouteSync })
	})
	// The pilot goes by sync too: --pilot added on the resume of a batch
	// run sent the first items, held by the open batch, again.
	t.Run("route batch with a pilot", func(t *testing.T) {
		resumeOverOpenBatches(t, func(c *runner.Config) { c.Pilot = 100 })
	})
}

func resumeOverOpenBatches(t *testing.T, second func(*runner.Config)) {
	const n, k = 400, 20
	b := newBench(t, n, k, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute = 40, 30000
		}
	})
	dir := filepath.Join(t.TempDir(), "run")
	cfg := runner.Config{
		Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, Grace: time.Second},
	}
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		for ctx.Err() == nil {
			if _, created := simCreated(b.sim); created >= 1 {
				stop()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	first := runner.Run(ctx, cfg)
	stop()
	if first.Summary == nil || first.Summary.Batches == nil || first.Summary.Batches.Open == 0 {
		t.Fatalf("the stopped batch run: exit %d, %v; want batches left open", first.Code(), first.Err)
	}
	sc := cfg
	second(&sc)
	out := runner.Run(t.Context(), sc)
	t.Logf("the %s run (pilot %d) over open batches: exit %d, %v", sc.Route, sc.Pilot, out.Code(), out.Err)
	deadline := time.Now().Add(time.Minute)
	for simInProgress(b.sim) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if _, requests, twice := ledgerAudit(b.sim); twice != 0 {
		t.Fatalf("%d of %d requests billed twice: the sync run sent items its open batches hold", twice, requests)
	}
	last := runner.Run(t.Context(), cfg)
	if last.Code() != runner.ExitOK {
		t.Fatalf("the batch run after: exit %d, %v", last.Code(), last.Err)
	}
	b.audit(dir)
	if _, _, twice := ledgerAudit(b.sim); twice != 0 {
		t.Fatalf("%d requests billed twice", twice)
	}
}
