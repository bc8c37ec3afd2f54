package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/host"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
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
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, mutate)
	input := simtest.Judge(t, t.TempDir(), n, 3)
	return &bench{t: t, sim: r, input: input, orgs: r.Server.Orgs(), speed: speed, n: n}
}

// exec runs x on a run directory dir (made under the test's temp dir when
// empty) and returns the result, its error and the directory.
func (b *bench) exec(ctx context.Context, dir string, x runner.Exec) (*runner.Result, error, string) {
	b.t.Helper()
	if dir == "" {
		dir = filepath.Join(b.t.TempDir(), "run")
	}
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: b.input, RunDir: dir, Prices: cost.Default()}, nil)
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
	c, err := soak.CheckResults(b.input, filepath.Join(dir, rundir.ResultsFile))
	if err != nil {
		b.t.Fatal(err)
	}
	if c.Lost() {
		b.t.Fatalf("results lost or repeated: %+v", c)
	}
	return c
}

// batchLedger is sim.BatchBilling.
var batchLedger = sim.BatchBilling

// batchRouteHalfPrice (TestBatchRouteHalfPrice): the batch route completes
// n items once, spread over every org, and costs what the simulator billed,
// which is exactly half of what the same items cost by sync.
//
// APIDISPATCH_BATCH_N sets n (the Phase 6 job is 141,600).
func batchRouteHalfPrice(t *testing.T, n int) {
	if v := os.Getenv("APIDISPATCH_BATCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 3 {
			t.Fatalf("APIDISPATCH_BATCH_N=%q: want a number of items, at least 3", v)
		}
	}
	b := newBench(t, n, 2000, nil)
	ctx := t.Context()
	t0 := time.Now()
	res, err, dir := b.exec(ctx, "", runner.Exec{Route: runner.RouteBatch})
	batchWall := time.Since(t0)
	if err != nil {
		t.Fatalf("batch route: %v", err)
	}
	s := res.Summary
	if !res.Complete || s.Succeeded != int64(n) || !s.DataLoss.Passed {
		t.Fatalf("batch route: complete %v, %d succeeded, data loss %+v", res.Complete, s.Succeeded, s.DataLoss)
	}
	b.audit(dir)
	mark := b.sim.Server.Mark()
	total, billed, twice := batchLedger(b.sim.Server.Ledger())
	if billed != n || twice != 0 {
		t.Fatalf("the simulator billed %d batch requests (%d twice); want %d, none twice", billed, twice, n)
	}
	if s.Cost.TotalNanos != total {
		t.Fatalf("summary cost %d nanos, simulator ledger %d", s.Cost.TotalNanos, total)
	}
	if s.Batches == nil || s.Batches.Created != 3 || len(s.ByOrg) != 3 {
		t.Fatalf("batches %+v over orgs %v; want 3, one per org", s.Batches, s.ByOrg)
	}
	for name, o := range s.ByOrg {
		if o.Succeeded != int64(n/3) && o.Succeeded != int64(n/3+1) {
			t.Fatalf("org %s carried %d items, want %d (an even share)", name, o.Succeeded, n/3)
		}
	}
	br := s.ByRoute[store.RouteBatch]
	if br == nil || br.Items != int64(n) || br.CostNanos != total {
		t.Fatalf("by_route batch = %+v", br)
	}
	// The same items by sync, on the same simulator.
	t0 = time.Now()
	sres, err, _ := b.exec(ctx, "", runner.Exec{Route: runner.RouteSync})
	syncWall := time.Since(t0)
	if err != nil || !sres.Complete {
		t.Fatalf("sync route: %v", err)
	}
	// Each request once: a sync request retried after a timeout (a loaded
	// machine at K = 2000) can be billed twice, and that is the sync
	// route's duplicate billing, not its price.
	var syncTotal int64
	seen := map[sim.BodyHash]bool{}
	for _, e := range b.sim.Server.LedgerSince(mark) {
		if e.ServiceTier == "" && !seen[e.BodySHA256] {
			seen[e.BodySHA256] = true
			syncTotal += e.CostNanos
		}
	}
	if syncTotal != 2*total || sres.Summary.Cost.TotalNanos != syncTotal {
		t.Fatalf("sync cost %d nanos (summary %d), batch %d: want exactly twice", syncTotal, sres.Summary.Cost.TotalNanos, total)
	}
	if got := cost.Nanos(syncTotal).USD(); br.SyncPriceUSD != got {
		t.Fatalf("by_route batch sync_price_usd = %v, the sync route cost %v", br.SyncPriceUSD, got)
	}
	t.Logf("N=%d: batch $%.6f (%d nanos) = ledger, %d batches over %d orgs, %.1f s at K=2000; sync $%.6f (%d nanos) = 2 × batch exactly, %.1f s",
		n, cost.Nanos(total).USD(), total, s.Batches.Created, len(s.ByOrg), batchWall.Seconds(), cost.Nanos(syncTotal).USD(), syncTotal, syncWall.Seconds())
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
	b := newBench(t, 2000, 50000, nil)
	// Timed from now (API time; K = 50,000): the errors and the cut streams
	// for 72 s, the stall for batches created in the first 21.6 s (a stalled
	// batch ends at expiry, 1.7 s on; a race build under a load of 10 took
	// more than 7.2 s to create its first batch).
	if _, err := b.sim.Server.AddFault(
		sim.Fault{Kind: sim.FaultBatchErroredAPI, Probability: 0.1, Duration: 1000 * time.Hour, FromNow: true},
		sim.Fault{Kind: sim.FaultBatchErroredOverloaded, Probability: 0.1, Duration: 1000 * time.Hour, FromNow: true},
		sim.Fault{Kind: sim.FaultBatchErroredInvalid, Probability: 0.05, Duration: 1000 * time.Hour, FromNow: true},
		sim.Fault{Kind: sim.FaultBatchStall, Org: "batch", Fraction: 0.5, Duration: 300 * time.Hour, FromNow: true},
		sim.Fault{Kind: sim.FaultBatchResultsCut, Probability: 0.5, Duration: 1000 * time.Hour, FromNow: true},
	); err != nil {
		t.Fatal(err)
	}
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

// autoSim is a simulator whose batches start 30 API seconds after their
// create and process 3,000 requests a minute per org, with the limits file
// that tells the planner so.
func autoSim(t *testing.T, n int, speed float64, faults ...sim.Fault) (*bench, *plan.Limits) {
	b := newBench(t, n, speed, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute, c.Orgs[i].Batch.CancelS = 30, 3000, 1
		}
		c.Faults = faults
	})
	return b, &plan.Limits{Batch: &plan.BatchModel{QueueWaitS: 30, PerMinute: 3000, PollS: 10}}
}

// raceBuild is set in a build with the race detector.
var raceBuild bool

// lenient reports whether wall-clock deadlines of seconds say more about
// this machine than about the router: a race build, or load above the
// cores. It widens the wall-clock margin (wallMargin); it never turns a
// miss into a log line.
func lenient() bool {
	return raceBuild || host.LoadAverage() > float64(runtime.NumCPU())
}

// wallMargin is how many deadlines the wall-clock of an auto run may take
// in all, resumes included: 1 on a quiet machine; on a race build or a
// loaded one, where a deadline of seconds is a figure of the machine, a
// generous multiple: 4, times the load per core above 1 (measured at 5× on
// -race with a load of 9 per core). It still catches a run that does not
// end or ignores its deadline. The router's own projected finish is
// asserted against the deadline itself (checkAutoDeadline), whatever the
// machine.
func wallMargin() float64 {
	if lenient() {
		return 4 * max(1, host.LoadAverage()/float64(runtime.NumCPU()))
	}
	return 1
}

// autoRun is an auto run to its end: the first invocation's outcome (the
// router's split and projection), the last one's, and the wall-clock of
// them all.
type autoRun struct {
	first, out runner.Outcome
	wallS      float64
	resumes    int
}

// runAuto is 'run --route auto --deadline d' on b, resumed with the same
// deadline while it stops at the deadline (at most 8 times), so that the
// rest can be checked; the caller asserts the wall-clock against
// wallMargin deadlines.
func (b *bench) runAuto(t *testing.T, limits *plan.Limits, deadline time.Duration) autoRun {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	run := func(d time.Duration) runner.Outcome {
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteAuto,
			Deadline: d, Limits: limits, Stderr: &log,
			Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1},
		})
		t.Logf("run:\n%s", log.String())
		return out
	}
	var a autoRun
	a.out = run(deadline)
	a.first = a.out
	if a.out.Summary != nil {
		a.wallS += a.out.Summary.WallS
	}
	for i := 0; i < 8 && a.out.Code() == runner.ExitIncomplete && a.out.Summary != nil && strings.Contains(a.out.Summary.StopReason, "deadline reached"); i++ {
		t.Logf("the deadline was missed (race build %v, load %.1f, %d CPUs); resuming, with the same deadline, to check the rest", raceBuild, host.LoadAverage(), runtime.NumCPU())
		a.out = run(deadline)
		a.resumes++
		if a.out.Summary != nil {
			a.wallS += a.out.Summary.WallS
		}
	}
	return a
}

// routesOf is the router's projection of the routes, from the summary of
// the run it split.
func routesOf(t *testing.T, s *rundir.Summary) plan.RoutesJSON {
	t.Helper()
	var doc struct {
		Routes *plan.RoutesJSON `json:"routes"`
	}
	if s == nil || json.Unmarshal(s.Projection, &doc) != nil || doc.Routes == nil || doc.Routes.Auto == nil {
		t.Fatalf("the summary holds no auto projection: %+v", s)
	}
	return *doc.Routes
}

// checkAutoDeadline asserts the router's own projected finish, in API
// seconds, within the deadline (a figure of the router, not of the
// machine), and the wall-clock of every invocation together within
// wallMargin deadlines.
func checkAutoDeadline(t *testing.T, a autoRun, deadline time.Duration, speed float64) plan.RoutesJSON {
	t.Helper()
	r := routesOf(t, a.first.Summary)
	if r.Auto.Meets == nil || !*r.Auto.Meets || r.Auto.WallS > deadline.Seconds()*speed {
		t.Fatalf("the router projected %.1f API s (meets %v) for a deadline of %.1f API s", r.Auto.WallS, r.Auto.Meets != nil && *r.Auto.Meets, deadline.Seconds()*speed)
	}
	if limit := wallMargin() * deadline.Seconds(); a.wallS > limit {
		t.Fatalf("auto took %.1f s in %d invocations; the deadline was %s (at most %.1f s on this machine: race %v, load %.1f)",
			a.wallS, a.resumes+1, deadline, limit, raceBuild, host.LoadAverage())
	}
	return r
}

// allSyncUSD is what the run's items would have cost by sync: its sync
// route's cost plus its batch route's at the sync price.
func allSyncUSD(s *rundir.Summary) float64 {
	v := 0.0
	if r := s.ByRoute[store.RouteSync]; r != nil {
		v += r.CostUSD
	}
	if r := s.ByRoute[store.RouteBatch]; r != nil {
		v += r.SyncPriceUSD
	}
	return v
}

func readEvents(t *testing.T, dir string) []rundir.Event {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []rundir.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var e rundir.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// TestBatchCutByBytes: batches are cut at the byte limit as well as the
// count, so no create body passes it; a request that alone passes it is
// refused before anything is sent, naming its line.
func TestBatchCutByBytes(t *testing.T) {
	b := newBench(t, 900, 2000, nil)
	fi, err := os.Stat(b.input)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 64 << 10
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Batch: batch.Config{MaxBytes: limit}})
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	b.audit(dir)
	st, err := sqlite.Open(filepath.Join(dir, rundir.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Batches(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if min := fi.Size() / limit; int64(len(recs)) <= min {
		t.Fatalf("%d batches for %d bytes of requests at %d bytes a batch", len(recs), fi.Size(), limit)
	}
	for _, r := range recs {
		if r.Bytes > limit {
			t.Fatalf("batch %d: %d bytes, over the %d limit", r.Local, r.Bytes, limit)
		}
	}
	t.Logf("%d bytes of requests in %d batches of at most %d bytes", fi.Size(), len(recs), limit)

	b2 := newBench(t, 10, 2000, nil)
	_, err, _ = b2.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Batch: batch.Config{MaxBytes: 400}})
	if !errors.Is(err, runner.ErrInput) || !strings.Contains(err.Error(), "line 1 (custom_id phase6_000000)") {
		t.Fatalf("a request over the byte limit: %v; want ErrInput naming line 1", err)
	}
	if _, created := simCreated(b2.sim); created != 0 {
		t.Fatalf("%d batches created after the refusal", created)
	}
}

func simCreated(r *sim.Running) (requests, created int64) {
	for _, st := range r.Server.BatchStats() {
		requests += st.Requests
		created += st.Created
	}
	return requests, created
}

// TestBatchMaxCost: with --max-cost the route creates a batch only when
// its worst case fits beside what is spent and what open batches reserve,
// so the cap holds even if every request used its max_tokens; it stops,
// resumable, when the next request would not fit.
func TestBatchMaxCost(t *testing.T) {
	b := newBench(t, 3000, 2000, nil)
	const capUSD = 1.0
	maxCost := cost.Nanos(capUSD * 1e9)
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Sync: dispatch.Config{MaxCost: maxCost}})
	if !errors.Is(err, dispatch.ErrIncomplete) || res == nil || !strings.Contains(res.Stop.Reason, "--max-cost") {
		t.Fatalf("want an incomplete run stopped by --max-cost; got %v (%+v)", err, res)
	}
	s := res.Summary
	total, billed, _ := batchLedger(b.sim.Server.Ledger())
	if cost.Nanos(total) > maxCost || s.Cost.TotalNanos != total || s.Unfinished == 0 || s.Succeeded == 0 || s.Batches.Open != 0 {
		t.Fatalf("ledger %d nanos (cap %d), summary %d, %d succeeded, %d unfinished, batches %+v", total, maxCost, s.Cost.TotalNanos, s.Succeeded, s.Unfinished, s.Batches)
	}
	c, err := soak.CheckResults(b.input, filepath.Join(dir, rundir.ResultsFile))
	if err != nil || c.Repeated+c.Unknown != 0 || c.Lines != s.Succeeded {
		t.Fatalf("results %+v, %v", c, err)
	}
	t.Logf("cap $%.2f: %d items in %d batches billed $%.6f, %d left pending: %s", capUSD, billed, s.Batches.Created, cost.Nanos(total).USD(), s.Unfinished, res.Stop.Reason)
}

// TestBatchPoll404: 404s while polling (eventual consistency) are polled
// through; a batch that answers 404 for an hour of API time is not known to
// the API behind the key, and the run stops naming it rather than sending
// its items again.
func TestBatchPoll404(t *testing.T) {
	b := newBench(t, 300, 20000, nil)
	if _, err := b.sim.Server.AddFault(sim.Fault{Kind: sim.FaultBatchPoll404, Duration: 20 * time.Minute, FromNow: true}); err != nil {
		t.Fatal(err)
	}
	res, err, _ := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		t.Fatalf("20 API min of 404s: %v", err)
	}
	b2 := newBench(t, 300, 20000, nil)
	if _, err := b2.sim.Server.AddFault(sim.Fault{Kind: sim.FaultBatchPoll404, FromNow: true}); err != nil {
		t.Fatal(err)
	}
	_, err, _ = b2.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
	if !errors.Is(err, batch.ErrNeedsPerson) || !strings.Contains(err.Error(), "has answered 404 not_found_error for") || !strings.Contains(err.Error(), "not sent again") {
		t.Fatalf("a batch 404 for good: %v; want the run stopped naming it", err)
	}
	if req, created := simCreated(b2.sim); created != 3 || req != 300 {
		t.Fatalf("%d batches (%d requests) created: want the 3 first, nothing sent again", created, req)
	}
}

// TestAutoResumeKeepsOpenBatches: an auto run stopped with its batches open
// resumes with them re-attached; their items are not sent by sync as well,
// so no request is billed twice.
func TestAutoResumeKeepsOpenBatches(t *testing.T) {
	const n, k = 3000, 10
	b, limits := autoSim(t, n, k)
	dir := filepath.Join(t.TempDir(), "run")
	cfg := runner.Config{
		Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteAuto, Deadline: 6 * time.Second, Limits: limits,
		Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, Grace: time.Second},
	}
	ctx, stop := context.WithCancel(t.Context())
	// Stop once the batches are open and the sync share is mostly sent, so
	// that on the resume the free items' boundary lies past some of the
	// open batches' items.
	go func() {
		for {
			if _, created := simCreated(b.sim); created >= 3 && b.sim.Server.LedgerTotals().Requests >= n/4 {
				stop()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	first := runner.Run(ctx, cfg)
	if first.Code() != runner.ExitIncomplete || first.Summary == nil || first.Summary.Batches.Open == 0 {
		t.Fatalf("the stopped run: exit %d, %+v; want 4 with batches open", first.Code(), first.Summary)
	}
	out := runner.Run(t.Context(), cfg)
	wallS := 0.0
	if out.Summary != nil {
		wallS = out.Summary.WallS
	}
	for i := 0; i < 8 && out.Code() == runner.ExitIncomplete; i++ {
		t.Logf("the resumed run missed its deadline (race build %v, load %.1f); resuming again: %v", raceBuild, host.LoadAverage(), out.Err)
		out = runner.Run(t.Context(), cfg)
		if out.Summary != nil {
			wallS += out.Summary.WallS
		}
	}
	// The resumes' wall-clock together, against the deadline (a generous
	// multiple of it on a race build or a loaded machine).
	if limit := wallMargin() * cfg.Deadline.Seconds(); wallS > limit {
		t.Fatalf("the resumed run took %.1f s; the deadline was %s (at most %.1f s on this machine)", wallS, cfg.Deadline, limit)
	}
	if out.Code() != runner.ExitOK {
		t.Fatalf("the resumed run: exit %d, %v", out.Code(), out.Err)
	}
	b.audit(dir)
	// No item billed by sync and by a re-attached batch; an item billed
	// twice by sync is one whose attempt timed out after the API billed it
	// (a loaded machine), which the summary counts as possibly billed twice.
	byTier := map[sim.BodyHash][2]int{} // [sync, batch]
	for _, e := range b.sim.Server.Ledger() {
		c := byTier[e.BodySHA256]
		if e.ServiceTier == "batch" {
			c[1]++
		} else {
			c[0]++
		}
		byTier[e.BodySHA256] = c
	}
	both, syncTwice := 0, int64(0)
	for _, c := range byTier {
		if c[0] > 0 && c[1] > 0 {
			both++
		}
		if c[0] > 1 {
			syncTwice += int64(c[0] - 1)
		}
	}
	if both != 0 {
		t.Fatalf("%d requests billed by sync and by a re-attached batch", both)
	}
	if syncTwice > out.Summary.PossibleDuplicateBilling {
		t.Fatalf("%d requests billed twice by sync; the summary counts %d that may have been", syncTwice, out.Summary.PossibleDuplicateBilling)
	}
	if br := out.Summary.ByRoute[store.RouteBatch]; br == nil || br.Items == 0 {
		t.Fatalf("by_route batch %+v: the re-attached batches' results are missing", br)
	}
}

// failingBatches is a store whose batch records cannot be written, as on a
// full disk.
type failingBatches struct{ store.Store }

var errDiskFull = errors.New("test: no space left on device")

func (failingBatches) AddBatch(context.Context, store.BatchRecord, []int64) (int64, error) {
	return 0, errDiskFull
}

// TestAutoEndsWhenBatchRouteFailsBeforePlacing: when the batch route of an
// auto run fails before it has placed its batches (its store cannot record
// a batch, as on a full disk), auto ends with the failure instead of
// waiting for ever for batches that will never be placed (the campaign
// found it: a run on a full disk hung).
func TestAutoEndsWhenBatchRouteFailsBeforePlacing(t *testing.T) {
	const n, k = 600, 10
	b, _ := autoSim(t, n, k)
	ctx := t.Context() // Exec.SyncItems 0: every item by batch
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: b.input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	job.Store = failingBatches{job.Store}
	x := runner.Exec{Route: runner.RouteAuto}
	x.Sync.Orgs, x.Sync.BaseURL, x.Sync.Speed, x.Sync.Prices, x.Sync.SampleEvery = b.orgs, b.sim.URL, b.speed, cost.Default(), -1
	done := make(chan error, 1)
	go func() {
		_, err := runner.Execute(ctx, job, x)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errDiskFull) {
			t.Fatalf("auto whose batches cannot be recorded: %v, want the store's failure", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("auto still running 2 minutes after its batch route failed: it waits for batches that will never be placed")
	}
}
