package runner_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// bench is a simulator with a judge request file.
type bench struct {
	t     *testing.T
	sim   *sim.Running
	input string
	orgs  []org.Org
	speed float64
	n     int
}

func newBench(t *testing.T, n int, speed float64, mutate func(*sim.Config)) *bench {
	t.Helper()
	cfg, err := sim.Preset("origin-3org")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = speed
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	input := filepath.Join(t.TempDir(), "req.jsonl")
	f, err := os.Create(input)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateJudge(f, n, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var orgs []org.Org
	for _, o := range cfg.Orgs {
		orgs = append(orgs, org.Org{Name: o.Name, Key: org.NewKey(r.Server.Keys()[o.Name][0])})
	}
	return &bench{t: t, sim: r, input: input, orgs: orgs, speed: speed, n: n}
}

// exec runs x on a run directory dir (made under the test's temp dir when
// empty) and returns the result, its error and the directory.
func (b *bench) exec(ctx context.Context, dir string, x runner.Exec) (*runner.Result, error, string) {
	b.t.Helper()
	if dir == "" {
		dir = filepath.Join(b.t.TempDir(), "run")
	}
	job, err := dispatch.OpenJob(ctx, dispatch.JobConfig{InputPath: b.input, RunDir: dir, Prices: cost.Default()}, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer job.Close()
	x.Sync.Orgs, x.Sync.BaseURL, x.Sync.Speed, x.Sync.Prices, x.Sync.SampleEvery = b.orgs, b.sim.URL, b.speed, cost.Default(), -1
	if testing.Verbose() {
		x.Sync.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	res, err := runner.Execute(ctx, job, x)
	return res, err, dir
}

// audit checks that every custom_id of the input has exactly one result.
func (b *bench) audit(dir string) soak.Check {
	b.t.Helper()
	c, err := soak.CheckResults(b.input, filepath.Join(dir, dispatch.ResultsFile))
	if err != nil {
		b.t.Fatal(err)
	}
	if c.Lost() {
		b.t.Fatalf("results lost or repeated: %+v", c)
	}
	return c
}

// batchLedger sums the simulator's ledger entries of the batch tier, and
// counts those whose custom_id was billed more than once.
func batchLedger(entries []sim.LedgerEntry) (total int64, n int, twice int) {
	seen := map[string]int{}
	for _, e := range entries {
		if e.ServiceTier != "batch" {
			continue
		}
		total += e.CostNanos
		n++
		seen[e.CustomID]++
	}
	for _, k := range seen {
		if k > 1 {
			twice++
		}
	}
	return total, n, twice
}

// TestBatchRouteHalfPrice: the batch route completes every item once,
// spread over every org, and costs what the simulator billed, which is
// exactly half of what the same items cost by sync.
func TestBatchRouteHalfPrice(t *testing.T) {
	b := newBench(t, 3000, 2000, nil)
	ctx := t.Context()
	res, err, dir := b.exec(ctx, "", runner.Exec{Route: runner.RouteBatch})
	if err != nil {
		t.Fatalf("batch route: %v", err)
	}
	s := res.Summary
	if !res.Complete || s.Succeeded != 3000 || !s.DataLoss.Passed {
		t.Fatalf("batch route: complete %v, %d succeeded, data loss %+v", res.Complete, s.Succeeded, s.DataLoss)
	}
	b.audit(dir)
	mark := b.sim.Server.Mark()
	total, billed, twice := batchLedger(b.sim.Server.Ledger())
	if billed != 3000 || twice != 0 {
		t.Fatalf("the simulator billed %d batch requests (%d twice); want 3000, none twice", billed, twice)
	}
	if s.Cost.TotalNanos != total {
		t.Fatalf("summary cost %d nanos, simulator ledger %d", s.Cost.TotalNanos, total)
	}
	if s.Batches == nil || s.Batches.Created != 3 || len(s.ByOrg) != 3 {
		t.Fatalf("batches %+v over orgs %v; want 3, one per org", s.Batches, s.ByOrg)
	}
	for name, o := range s.ByOrg {
		if o.Succeeded != 1000 {
			t.Fatalf("org %s carried %d items, want 1000 (an even share)", name, o.Succeeded)
		}
	}
	br := s.ByRoute[store.RouteBatch]
	if br == nil || br.Items != 3000 || br.CostNanos != total {
		t.Fatalf("by_route batch = %+v", br)
	}
	// The same items by sync, on the same simulator.
	sres, err, _ := b.exec(ctx, "", runner.Exec{Route: runner.RouteSync})
	if err != nil || !sres.Complete {
		t.Fatalf("sync route: %v", err)
	}
	var syncTotal int64
	for _, e := range b.sim.Server.LedgerSince(mark) {
		if e.ServiceTier == "" {
			syncTotal += e.CostNanos
		}
	}
	if syncTotal != 2*total || sres.Summary.Cost.TotalNanos != syncTotal {
		t.Fatalf("sync cost %d nanos (summary %d), batch %d: want exactly twice", syncTotal, sres.Summary.Cost.TotalNanos, total)
	}
	if got := cost.Nanos(syncTotal).USD(); br.SyncPriceUSD != got {
		t.Fatalf("by_route batch sync_price_usd = %v, the sync route cost %v", br.SyncPriceUSD, got)
	}
	t.Logf("N=3000: batch $%.6f (%d nanos) = ledger; sync $%.6f = 2 × batch", cost.Nanos(total).USD(), total, cost.Nanos(syncTotal).USD())
}

// TestBatchLostCreateAdopted: every create's answer is lost (a 500 after
// the batch exists, then resets); the route finds each batch in its org's
// list and adopts it, so nothing is created twice.
func TestBatchLostCreateAdopted(t *testing.T) {
	for _, kind := range []sim.FaultKind{sim.FaultBatchCreateLost500, sim.FaultBatchCreateLostReset} {
		t.Run(string(kind), func(t *testing.T) {
			b := newBench(t, 1200, 2000, func(c *sim.Config) {
				c.Faults = []sim.Fault{{Kind: kind}, {Kind: sim.FaultBatchNotFound, Window: 30 * time.Second}}
			})
			res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
			if err != nil || !res.Complete {
				t.Fatalf("batch route: %v", err)
			}
			b.audit(dir)
			_, billed, twice := batchLedger(b.sim.Server.Ledger())
			var created int64
			for _, st := range b.sim.Server.BatchStats() {
				created += st.Created
			}
			bs := res.Summary.Batches
			if billed != 1200 || twice != 0 || created != 3 || bs.Adopted != 3 || bs.Created != 3 {
				t.Fatalf("billed %d (%d twice), simulator created %d batches; summary %+v: want 1200, 0, 3 adopted", billed, twice, created, bs)
			}
		})
	}
}

// TestBatchErroredAndExpired: retryable errored results and a batch that
// stalls until it expires come back to pending and succeed in later
// batches; invalid_request_error results are terminal and carry their
// error; nothing is lost.
func TestBatchErroredAndExpired(t *testing.T) {
	b := newBench(t, 2000, 50000, func(c *sim.Config) {
		c.Faults = []sim.Fault{
			{Kind: sim.FaultBatchErroredAPI, Probability: 0.1, Duration: time.Hour},
			{Kind: sim.FaultBatchErroredOverloaded, Probability: 0.1, Duration: time.Hour},
			{Kind: sim.FaultBatchErroredInvalid, Probability: 0.05, Duration: time.Hour},
			{Kind: sim.FaultBatchStall, Org: "batch", Fraction: 0.5, Duration: 10 * time.Hour}, // API time: 0.7 s here
			{Kind: sim.FaultBatchResultsCut, Probability: 0.5, Duration: 30 * time.Hour},
		}
	})
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	c := b.audit(dir)
	s := res.Summary
	bad := c.ErroredByType[anthropic.ErrInvalidRequest]
	if bad == 0 || c.Errored != bad || s.Errored != bad || s.DataLoss.RetryableMarkedTerminal != 0 {
		t.Fatalf("errored %d (%v), summary %d: want only invalid_request_error, at least one", c.Errored, c.ErroredByType, s.Errored)
	}
	if br := res.Batch; br.Expired == 0 || br.BrokenDownloads == 0 {
		t.Fatalf("batch result %+v: the stall (expired requests) and the cut results stream must both have struck", br)
	}
	if s.Batches.Retried == 0 || s.Batches.Created < 4 {
		t.Fatalf("batches %+v: want retried results sent again in later batches", s.Batches)
	}
	_, _, twice := batchLedger(b.sim.Server.Ledger())
	if twice != 0 {
		t.Fatalf("%d custom_ids billed twice", twice)
	}
	t.Logf("%d succeeded, %d errored (invalid_request_error), %d results sent again (%d expired), %d results streams read again, %d batches",
		s.Succeeded, s.Errored, s.Batches.Retried, res.Batch.Expired, res.Batch.BrokenDownloads, s.Batches.Created)
}
