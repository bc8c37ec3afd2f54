package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
)

// Routes a run can take (docs/design.md §12).
const (
	RouteSync  = "sync"
	RouteBatch = "batch"
	RouteAuto  = "auto"
)

// ErrInput: the input cannot go by the route asked for; nothing was sent.
var ErrInput = errors.New("runner: input unfit for the route")

// Exec is how Execute sends a job's pending items.
type Exec struct {
	// Route is RouteSync (the default), RouteBatch or RouteAuto.
	Route string
	// Sync configures the sync route (the engine); the job fills in its
	// store, input and results. Its Deadline stops admission. Its Spend is
	// the run's one spend gate, given to every engine and to the batch
	// route (nil: Execute makes one from MaxCost and what the store says
	// was spent).
	Sync dispatch.Config
	// Batch configures the batch route: its size, bytes, queue caps,
	// Cancel. Orgs, BaseURL, Speed, Prices, MaxCost and transport come
	// from Sync.
	Batch batch.Config
	// Split is auto's decision: how many of the pending items go by sync
	// (the first ones in input order); the rest go by batch. LateAt says
	// when an open batch is cancelled so its unprocessed work goes by sync.
	SyncItems int64
	// SyncOpenAI are the OpenAI items among SyncItems (the rest are
	// Anthropic items).
	SyncOpenAI int64
	LateAt     func(b store.BatchRecord, ahead int64) (time.Time, string)
	// OnEngine, when set, is called with each engine before it runs (a
	// progress display, an Aborter); the function it returns is called
	// when that engine's run ends.
	OnEngine func(*dispatch.Engine) (done func())
	// OnBatch is OnEngine for the batch route.
	OnBatch func(*batch.Route) (done func())
	// OnAttach, when set, is called once the batch route (batch and auto)
	// has loaded the run's open batches, each holding its worst case in
	// the spend gate, before anything is sent.
	OnAttach func()
	// Shared, when its URL is set, is a shared budget Execute opens for
	// this execution alone and closes at its end (an A/B arm); its gates
	// replace Sync.NewGate. Run opens one for the whole run instead.
	Shared Shared
}

// Result is what Execute returns.
type Result struct {
	Summary  *rundir.Summary
	Complete bool
	// Stop is how it ended: Complete, or Incomplete with the reason and
	// whether a stop condition ended it (Halted).
	Stop Stop
	// Batch is the batch route's result (batch and auto).
	Batch *batch.Result
}

// Execute sends the job's pending items by the route x names and sums the
// run. The store is consistent however it returns; an error leaves the run
// resumable (as dispatch.Engine.Run does).
func Execute(ctx context.Context, job *rundir.Job, x Exec) (*Result, error) {
	start := time.Now()
	agg0, err := job.Store.Aggregate(ctx)
	if err != nil {
		return nil, err
	}
	sink, err := rundir.OpenSink(ctx, job.ResultsPath, job.Store)
	if err != nil {
		return nil, err
	}
	if sink.Rebuilt > 0 {
		job.Events.Emit(rundir.EventWarning, fmt.Sprintf("results file was %d lines short of the run's state; rebuilt them", sink.Rebuilt), map[string]any{"rebuilt": sink.Rebuilt})
	}
	if x.Sync.Spend == nil {
		x.Sync.Spend = spend.New("--max-cost", x.Sync.MaxCost, rundir.SpentBefore(agg0))
	}
	if x.Route == RouteBatch || x.Route == RouteAuto {
		if err := batch.CheckItems(ctx, job.Store, x.Batch.MaxBytes); err != nil {
			sink.Close()
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
	}
	if x.Shared.URL != "" {
		svc, err := StartServices(ctx, ServicesConfig{Shared: x.Shared, Orgs: x.Sync.Orgs, Events: job.Events, Log: x.Sync.Log})
		if err != nil {
			sink.Close()
			return nil, err
		}
		defer svc.Stop()
		x.Sync.NewGate = svc.NewGate(x.Sync.NewGate)
	}
	ex := &execution{job: job, x: x, sink: sink}
	var runErr error
	switch x.Route {
	case "", RouteSync:
		x.Route = RouteSync
		runErr = ex.sync(ctx, x.Sync)
	case RouteBatch:
		runErr = ex.batchOnly(ctx)
	case RouteAuto:
		runErr = ex.auto(ctx)
	default:
		runErr = fmt.Errorf("unknown route %q: want sync, batch or auto", x.Route)
	}
	if err := sink.Close(); err != nil && runErr == nil {
		runErr = err
	}
	sctx := context.WithoutCancel(ctx)
	s, _, serr := rundir.BuildSummary(sctx, rundir.SummaryInput{
		Store: job.Store, ResultsPath: job.ResultsPath, Orgs: x.Sync.Orgs, Start: start,
		DoneStart: agg0.Succeeded + agg0.Errored, Speed: x.Sync.Speed, Lanes: ex.lanes, StopReason: ex.stopReason,
	})
	if serr != nil {
		if runErr == nil {
			runErr = serr
		}
		return &Result{Stop: ex.stop(false)}, runErr
	}
	s.Route = x.Route
	s.Cache = ex.cacheSum
	if r := s.ByRoute[store.RouteSync]; r != nil {
		r.WallS = ex.syncWall.Seconds()
	}
	if r := s.ByRoute[store.RouteBatch]; r != nil && ex.batchRes != nil {
		r.WallS = ex.batchRes.WallS
	}
	if x.Route != RouteSync {
		bs, err := batchesSummary(sctx, job.Store, s)
		if err != nil && runErr == nil {
			runErr = err
		}
		s.Batches = bs
	}
	open := s.Batches != nil && s.Batches.Open > 0
	complete := s.Unfinished == 0 && !open && runErr == nil
	res := &Result{Summary: s, Complete: complete, Stop: ex.stop(complete), Batch: ex.batchRes}
	if runErr != nil && !errors.Is(runErr, dispatch.ErrIncomplete) {
		job.Events.Emit(rundir.EventFailure, runErr.Error(), nil)
		return res, runErr
	}
	if !res.Complete {
		if res.Stop.Reason == "" {
			res.Stop.Reason = "stopped"
		}
		if open {
			res.Stop.Reason += fmt.Sprintf("; %d batches still running on the API; the same command re-attaches to them", s.Batches.Open)
		}
		s.StopReason = res.Stop.Reason
		if x.Route != RouteSync {
			// The sync engine emits its own incomplete event.
			job.Events.Emit(rundir.EventIncomplete, res.Stop.Reason, s)
		}
		cause := runErr
		ex.mu.Lock()
		if se := ex.stopErr; se != nil && !errors.Is(cause, se) {
			cause = errors.Join(cause, se)
		}
		ex.mu.Unlock()
		return res, &incompleteError{msg: dispatch.ErrIncomplete.Error() + ": " + res.Stop.Reason, cause: cause}
	}
	if x.Route != RouteSync {
		job.Events.Emit(rundir.EventCompleted, fmt.Sprintf("%d succeeded, %d errored", s.Succeeded, s.Errored), s)
	}
	return res, nil
}

// execution is one Execute's state.
type execution struct {
	job   *rundir.Job
	x     Exec
	sink  *rundir.Sink
	lanes []gate.LaneSnapshot
	// mu guards stopReason and stopErr: auto's batch route runs on its
	// own goroutine.
	mu         sync.Mutex
	stopReason string
	stopErr    error // the error behind stopReason, when it was one
	syncWall   time.Duration
	batchRes   *batch.Result
	cacheSum   *rundir.CacheSummary
	// lastLanes and lastEnd are the previous engine's lanes and end.
	lastLanes []gate.LaneSnapshot
	lastEnd   time.Time
}

// warmStart is the fraction of the cap the next engine's lanes start at:
// the smallest the previous engine's lanes ended at, if it ended within
// warmFor; 0 (the default ramp) otherwise.
func (ex *execution) warmStart(speed float64) float64 {
	if speed <= 0 {
		speed = 1
	}
	if len(ex.lastLanes) == 0 || time.Since(ex.lastEnd) > time.Duration(float64(warmFor)/speed) {
		return 0
	}
	f := 1.0
	for _, l := range ex.lastLanes {
		if l.Disabled == "" && l.Cap > 0 {
			f = min(f, l.Limit/float64(l.Cap))
		}
	}
	return f
}

// stop is how the execution ended: Complete, or Incomplete with the
// reason a stop condition gave (Halted), if one did.
func (ex *execution) stop(complete bool) Stop {
	if complete {
		return Stop{Kind: Complete}
	}
	reason := ex.stopped()
	return Stop{Kind: Incomplete, Halted: reason != "", Reason: reason}
}

// stopped is why the run stopped, or "".
func (ex *execution) stopped() string {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.stopReason
}

func (ex *execution) setStop(reason string) { ex.setStopErr(reason, nil) }

// setStopErr is setStop with the error behind the reason (a spend cap's,
// from the batch route), kept under the run's incomplete error.
func (ex *execution) setStopErr(reason string, err error) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.stopReason == "" {
		ex.stopReason, ex.stopErr = reason, err
	}
}

// warmFor is how long (API time) after an engine of this run ended the
// next one starts its lanes where the last left them rather than at a
// quarter of the cap: the keys carried that load moments ago.
const warmFor = 60 * time.Second

// sync runs the engine once with c.
func (ex *execution) sync(ctx context.Context, c dispatch.Config) error {
	c.Sink = ex.sink
	if f := ex.warmStart(c.Speed); f > 0 && c.Lane.StartFraction == 0 {
		c.Lane.StartFraction = f
	}
	eng, err := dispatch.NewForJob(ex.job, c)
	if err != nil {
		return err
	}
	done := func() {}
	if ex.x.OnEngine != nil {
		done = ex.x.OnEngine(eng)
	}
	t0 := time.Now()
	res, err := eng.Run(ctx)
	ex.syncWall += time.Since(t0)
	ex.lastEnd = time.Now()
	done()
	if res != nil && res.Summary != nil {
		if ex.lanes == nil {
			ex.lanes = res.Summary.Lanes
		}
		ex.lastLanes = res.Summary.Lanes
		if res.Summary.Cache != nil {
			ex.cacheSum = res.Summary.Cache
		}
	}
	if err == nil || !errors.Is(err, dispatch.ErrIncomplete) {
		return err
	}
	if res != nil && !res.Stopped {
		return nil // the end of the items it was given (auto's share), not a stop
	}
	if res != nil {
		ex.setStop(res.StopReason)
	}
	return err
}

// batchConfig is the batch route's configuration for this job.
func (ex *execution) batchConfig() batch.Config {
	c := ex.x.Batch
	s := ex.x.Sync
	c.Orgs, c.BaseURL, c.Speed, c.Prices, c.MaxCost, c.Log, c.Deadline = s.Orgs, s.BaseURL, s.Speed, s.Prices, s.MaxCost, s.Log, s.Deadline
	// Every org: Anthropic items go to the Anthropic orgs' Message
	// Batches, OpenAI items to the OpenAI orgs' Batch API.
	c.WrapTransport = s.WrapTransport
	c.Spend = s.Spend // one gate for every route of the run
	if c.Client == nil {
		c.Client = s.Client
	}
	c.Store, c.Sink, c.Body, c.Events = ex.job.Store, ex.sink, ex.job.Body, ex.job.Events
	return c
}

// runBatch runs route to its end and records its result.
func (ex *execution) runBatch(ctx context.Context, rt *batch.Route) error {
	done := func() {}
	if ex.x.OnBatch != nil {
		done = ex.x.OnBatch(rt)
	}
	res, err := rt.Run(ctx)
	done()
	ex.batchRes = res
	if res != nil && res.StopReason != "" {
		ex.setStopErr(res.StopReason, res.StopErr)
	}
	return err
}

func (ex *execution) batchOnly(ctx context.Context) error {
	rt, err := batch.New(ex.batchConfig())
	if err != nil {
		return err
	}
	if err := rt.Load(ctx); err != nil {
		return err
	}
	ex.attached()
	return ex.runBatch(ctx, rt)
}

// attached tells Exec.OnAttach that the batch route holds its open
// batches' worst cases.
func (ex *execution) attached() {
	if ex.x.OnAttach != nil {
		ex.x.OnAttach()
	}
}

// auto sends SyncItems of the pending items by sync (the first ones in
// input order of each provider: SyncOpenAI OpenAI items and the rest
// Anthropic ones, the split the projection priced) and the rest by batch,
// at once; then whatever comes back from the batches (late ones
// cancelled, retryable results) by sync, until nothing is left.
func (ex *execution) auto(ctx context.Context) error {
	// The sync share is chosen among the free items; the items of
	// batches still open from an earlier run stay with the batches
	// (re-attached), never sent by sync as well.
	var share map[int64]bool
	bc := ex.batchConfig()
	bc.Take = func(it store.Item) bool { return !share[it.Seq] }
	bc.SubmitOnce = true
	bc.LateAt = ex.x.LateAt
	rt, err := batch.New(bc)
	if err != nil {
		return err
	}
	if err := rt.Load(ctx); err != nil {
		return err
	}
	ex.attached()
	var last int64
	if share, last, err = ex.syncShare(ctx, ex.x.SyncItems, ex.x.SyncOpenAI, rt); err != nil {
		return err
	}
	bctx, bstop := context.WithCancel(ctx)
	defer bstop()
	batchDone := make(chan error, 1)
	go func() { batchDone <- ex.runBatch(bctx, rt) }()

	var syncErr error
	if len(share) > 0 {
		c := ex.x.Sync
		c.MaxSeq = last
		c.Skip = func(seq int64) bool { return !share[seq] || rt.Holds(seq) }
		syncErr = ex.sync(ctx, c)
	}
	// Once the batches are placed, whatever is pending and in no open
	// batch is the sync route's. A batch route that ends before placing
	// them all (a full disk, a failed store read) never closes SubmitDone.
	var bErr error
	finished := false
	select {
	case <-rt.SubmitDone():
	case bErr = <-batchDone:
		finished = true
	case <-ctx.Done():
	}
	for syncErr == nil && ctx.Err() == nil && ex.stopped() == "" {
		free, err := ex.freePending(ctx, rt)
		if err != nil {
			syncErr = err
			break
		}
		if free > 0 {
			c := ex.x.Sync
			c.Skip = rt.Holds
			if syncErr = ex.sync(ctx, c); syncErr != nil {
				break
			}
			continue
		}
		if finished {
			break
		}
		select {
		case <-rt.Changed():
		case bErr = <-batchDone:
			finished = true
		case <-ctx.Done():
		}
	}
	if !finished {
		// A --max-cost stop of the sync engine leaves the batch route to
		// harvest its open batches (paid for, or reserved, already) and
		// to stop creating by the same gate; any other stop stops it.
		capped := errors.Is(syncErr, spend.ErrCapReached)
		if ctx.Err() != nil || syncErr != nil && !capped || ex.stopped() != "" && !capped {
			bstop()
		}
		bErr = <-batchDone
	}
	return errors.Join(syncErr, bErr)
}

// syncShare is auto's sync share: the first n − oa free pending
// Anthropic items and the first oa free pending OpenAI items (free: in no
// open batch), and the largest seq among them (0 when empty).
func (ex *execution) syncShare(ctx context.Context, n, oa int64, rt *batch.Route) (map[int64]bool, int64, error) {
	if n <= 0 {
		return nil, 0, nil
	}
	want := map[bool]int64{false: n - oa, true: oa}
	share := map[int64]bool{}
	var last int64
	err := store.EachPending(ctx, ex.job.Store, func(it store.Item) bool {
		if rt.Holds(it.Seq) {
			return true
		}
		p := it.Provider == org.OpenAI
		if want[p] > 0 {
			want[p]--
			share[it.Seq] = true
			last = max(last, it.Seq)
		}
		return want[false] > 0 || want[true] > 0
	})
	return share, last, err
}

// freePending counts pending items no open batch holds.
func (ex *execution) freePending(ctx context.Context, rt *batch.Route) (int64, error) {
	var n int64
	err := store.EachPending(ctx, ex.job.Store, func(it store.Item) bool {
		if !rt.Holds(it.Seq) {
			n++
		}
		return true
	})
	return n, err
}

// batchesSummary counts the run's batches.
func batchesSummary(ctx context.Context, st store.Store, s *rundir.Summary) (*rundir.BatchesSummary, error) {
	recs, err := st.Batches(ctx)
	if err != nil {
		return nil, err
	}
	agg, err := st.Aggregate(ctx)
	if err != nil {
		return nil, err
	}
	b := &rundir.BatchesSummary{Created: agg.Counters[rundir.CounterBatches], Adopted: agg.Counters[rundir.CounterBatchAdopted],
		Requests: agg.Counters[rundir.CounterBatchRequests], Retried: agg.Counters[rundir.CounterBatchRetried]}
	for _, r := range recs {
		switch {
		case r.Status.Open():
			b.Open++
		case r.Status == store.BatchHarvested:
			b.Harvested++
		case r.Status == store.BatchAbandoned:
			b.Abandoned++
		}
	}
	return b, nil
}

// incompleteError is a run's stop before its end: dispatch.ErrIncomplete
// with the stop's reason, and the engine's own error under it when it has
// one (a spend cap's refusal, which callers tell by errors.As).
type incompleteError struct {
	msg   string
	cause error
}

func (e *incompleteError) Error() string { return e.msg }

func (e *incompleteError) Unwrap() []error {
	if e.cause == nil {
		return []error{dispatch.ErrIncomplete}
	}
	return []error{dispatch.ErrIncomplete, e.cause}
}
