package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/report"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
)

// Exit codes (design.md §10).
const (
	ExitOK         = 0 // complete, data-loss check passed
	ExitUsage      = 1 // usage, configuration or input error; nothing sent
	ExitPaused     = 2 // paused by a cost gate
	ExitRefused    = 3 // --confirm missing or a precondition failed
	ExitIncomplete = 4 // stopped early; resumable
	ExitDataLoss   = 5 // data-loss check failed
	// ExitNeedsPerson: a failure that would repeat on every resume (a
	// batch whose results hold custom_ids it was not given, a batch the
	// API has not known for an hour, a lost create whose candidates never
	// end); the error says what to do (design.md §13).
	ExitNeedsPerson = 6
)

// Config is one 'apidispatch run'.
type Config struct {
	// Input is the request file; RunDir and ResultsPath default as
	// dispatch.JobConfig's.
	Input, RunDir, ResultsPath string
	// SummaryPath, when set, also gets summary.json.
	SummaryPath string
	Prices      *cost.Table
	// Sync is the sync route's configuration: Orgs, BaseURL, Caps, Speed,
	// MaxCost, Grace, GiveUpAfter, Log, the cache, the transport and gate
	// factories. Its Deadline is set from Deadline.
	Sync dispatch.Config
	// The pre-flight gate (design.md §7).
	Budget    cost.Nanos
	Tolerance float64
	Confirm   bool
	// Limits and ExpectOutput feed the projection.
	Limits       *plan.Limits
	ExpectOutput int64
	// Pilot, when positive, sends the first Pilot items by sync first,
	// re-projects from what they cost and applies the gates again.
	Pilot int64
	// Deadline, when positive, is how long the run may take (wall-clock):
	// admission stops then, and auto plans to end before it.
	Deadline time.Duration
	// Route is RouteSync (default), RouteBatch or RouteAuto; BatchSize the
	// most requests per batch (0: the API's 100,000).
	Route     string
	BatchSize int
	// Cancel cancels the run's open batches, harvests what they did and
	// sends nothing new.
	Cancel bool
	// OnJob is called once the run directory is open, before anything is
	// sent; it may change the sync configuration (the shared budget's
	// gates, metrics). The cleanup it returns runs when the run ends.
	OnJob func(job *rundir.Job, sync *dispatch.Config) (cleanup func(), err error)
	// OnEngine and OnBatch are Exec's.
	OnEngine func(*dispatch.Engine) (done func())
	OnBatch  func(*batch.Route) (done func())
	// Finish, when set, adds to the summary before it is written (the
	// shared budget's figures).
	Finish func(*rundir.Summary)
	// Stderr gets the gate's arithmetic, the router's decision and
	// warnings (nil: discarded).
	Stderr io.Writer
}

// Outcome is what Run returns: the exit code, the summary (nil when the
// run never started), where its results are, and the error, if any.
type Outcome struct {
	Code        int
	Summary     *rundir.Summary
	Dir         string
	ResultsPath string
	Err         error
}

func fail(code int, format string, a ...any) Outcome {
	return Outcome{Code: code, Err: fmt.Errorf(format, a...)}
}

// Run is the lifecycle of one run: validate → project → gate → open the
// run directory → pilot → routes → finish (summary, events, report).
func Run(ctx context.Context, cfg Config) Outcome {
	w := cfg.Stderr
	if w == nil {
		w = io.Discard
	}
	prices := cfg.Prices
	switch cfg.Route {
	case "":
		cfg.Route = RouteSync
	case RouteSync, RouteBatch, RouteAuto:
	default:
		return fail(ExitUsage, "--route %q: want sync, batch or auto", cfg.Route)
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > batch.MaxRequests {
		return fail(ExitUsage, "--batch-size %d: a batch holds 1 to %d requests (the API's limit)", cfg.BatchSize, batch.MaxRequests)
	}
	if cfg.Route != RouteSync && cfg.Sync.Cache != nil {
		return fail(ExitUsage, "--cache answers and stores results of the sync route only; use --route sync with --cache, or leave --cache off")
	}
	if cfg.Cancel && cfg.Route == RouteSync {
		return fail(ExitUsage, "--cancel cancels a run's open batches: it needs --route batch or auto")
	}
	ws, err := rundir.Validate(cfg.Input, prices)
	if err != nil {
		return fail(ExitUsage, "%s: %w", cfg.Input, err)
	}
	orgNames := make([]string, len(cfg.Sync.Orgs))
	for i, o := range cfg.Sync.Orgs {
		orgNames[i] = o.Name
	}
	pin := plan.Input{Workload: ws, Prices: prices, Orgs: orgNames, Caps: cfg.Sync.Caps, Limits: cfg.Limits,
		ExpectOutput: cfg.ExpectOutput, Speed: cfg.Sync.Speed}
	if err := ProjectCache(ctx, cfg.Input, &pin, cfg.Sync.Cache, cfg.Sync.CacheMode, cfg.Sync.CacheSampled, cfg.Sync.BaseURL); err != nil {
		return fail(ExitUsage, "%w", err)
	}
	gcfg := plan.GateConfig{Budget: cfg.Budget, Tolerance: cfg.Tolerance, Confirm: cfg.Confirm}
	pr, err := cfg.project(pin)
	if err != nil {
		return fail(ExitUsage, "projecting: %w", err)
	}
	if code := pr.gate(ws.N, gcfg, w); code != ExitOK {
		return Outcome{Code: code}
	}
	for _, r := range RotationReminders(cfg.Sync.Orgs, time.Now()) {
		fmt.Fprintln(w, r)
	}

	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: cfg.Input, RunDir: cfg.RunDir, ResultsPath: cfg.ResultsPath, Prices: prices}, ws)
	if err != nil {
		if errors.Is(err, rundir.ErrRunDirBusy) {
			return Outcome{Code: ExitRefused, Err: err}
		}
		return Outcome{Code: ExitUsage, Err: err}
	}
	defer job.Close()
	out := Outcome{Dir: job.Dir, ResultsPath: job.ResultsPath}
	if cfg.OnJob != nil {
		cleanup, err := cfg.OnJob(job, &cfg.Sync)
		if err != nil {
			out.Code, out.Err = ExitUsage, err
			return out
		}
		if cleanup != nil {
			defer cleanup()
		}
	}
	if cfg.Route != RouteSync {
		if err := batch.CheckItems(ctx, job.Store, 0); err != nil {
			out.Code, out.Err = ExitUsage, err
			return out
		}
	}
	open, err := openBatches(ctx, job.Store)
	if err != nil {
		out.Code, out.Err = ExitIncomplete, fmt.Errorf("reading the run's batches: %w", err)
		return out
	}
	if len(open) > 0 && cfg.Route == RouteSync {
		// Their items are still pending: a sync run would send them again
		// and the API bill them twice when the batches end.
		out.Code, out.Err = ExitRefused, fmt.Errorf("%d batches of this run are still open on the API (%s): their items would be sent and paid twice by sync; rerun with --route batch (or auto) to re-attach and harvest them, adding --cancel to cancel them first", len(open), strings.Join(open, ", "))
		return out
	}
	if cfg.Sync.Spend == nil {
		// One spend gate for the whole run (the pilot and every route),
		// seeded with what the run directory spent before: a resume goes
		// on against the same cap.
		// What a process that died on this directory may have had billed
		// counts too.
		if err := job.ReplayJournals(ctx); err != nil {
			out.Code, out.Err = ExitIncomplete, fmt.Errorf("reading the attempt journals: %w", err)
			return out
		}
		agg, err := job.Store.Aggregate(ctx)
		if err != nil {
			out.Code, out.Err = ExitIncomplete, fmt.Errorf("reading what the run spent: %w", err)
			return out
		}
		cfg.Sync.Spend = spend.New("--max-cost", cfg.Sync.MaxCost, rundir.SpentBefore(agg))
	}
	start := time.Now()
	if cfg.Deadline > 0 {
		cfg.Sync.Deadline = start.Add(cfg.Deadline)
	}
	x := Exec{Route: cfg.Route, Sync: cfg.Sync, OnEngine: cfg.OnEngine, OnBatch: cfg.OnBatch,
		Batch: batch.Config{Size: cfg.BatchSize, Cancel: cfg.Cancel, QueueCap: queueCaps(cfg.Limits, orgNames), RPM: batchRPM(cfg.Limits, orgNames)}}

	if cfg.Pilot > 0 && cfg.Pilot < ws.N && !cfg.Cancel && len(open) == 0 {
		// (With batches open the pilot is past: its sync sends would not
		// skip the items they hold.)
		if cfg.Route != RouteSync {
			// The pilot measures what requests cost before the rest are
			// sent; a batch would take up to 24 h to say it.
			msg := fmt.Sprintf("pilot: the first %d items go by sync, at the full (sync) price, twice their batch price, to measure their cost before the rest go by %s", cfg.Pilot, cfg.Route)
			fmt.Fprintln(w, msg)
			job.Events.Emit(rundir.EventBatch, msg, map[string]any{"pilot": cfg.Pilot, "route": RouteSync})
		}
		px := x
		px.Route = RouteSync
		px.Sync.MaxSeq = cfg.Pilot
		res, err := Execute(ctx, job, px)
		if err != nil && !errors.Is(err, dispatch.ErrIncomplete) {
			return cfg.finish(job, out, res, err, pr, ws.N, gcfg)
		}
		if ctx.Err() != nil || (res != nil && res.StopReason != "" && res.StopReason != "stopped") {
			return cfg.finish(job, out, res, err, pr, ws.N, gcfg)
		}
		ps, perr := plan.PilotFromStore(ctx, job.Store, cfg.Pilot)
		if perr != nil {
			out.Code, out.Err = ExitIncomplete, fmt.Errorf("reading the pilot: %w", perr)
			return out
		}
		pin.Pilot = ps
		if pr, err = cfg.project(pin); err != nil {
			out.Code, out.Err = ExitIncomplete, fmt.Errorf("re-projecting: %w", err)
			return out
		}
		fmt.Fprintf(w, "pilot of %d items done; re-projected expected cost %s (worst case %s)\n", cfg.Pilot, pr.gated.ExpectedCost, pr.gated.WorstCase)
		if code := pr.gate(ws.N, gcfg, w); code != ExitOK {
			out.Code = code
			return out
		}
	}
	if cfg.Route == RouteAuto {
		cfg.router(job, pr, &x, start, w)
	}
	res, err := Execute(ctx, job, x)
	if errors.Is(err, ErrInput) {
		out.Code, out.Err = ExitUsage, err
		return out
	}
	if res != nil && res.Summary != nil && pr.routes != nil && pr.routes.Auto != nil {
		res.Summary.Router = pr.routes.Doc().Auto
	}
	return cfg.finish(job, out, res, err, pr, ws.N, gcfg)
}

// projection is a run's projection and the routes beside it.
type projection struct {
	*plan.Projection
	routes *plan.Routes
	// gated is the projection the gates judge: the chosen route's cost.
	gated *plan.Projection
	route string
}

// project projects pin for cfg's route: both routes side by side, and the
// auto split for the deadline.
func (cfg *Config) project(pin plan.Input) (*projection, error) {
	p, err := plan.Project(pin)
	if err != nil {
		return nil, err
	}
	m := plan.DefaultBatchModel()
	if cfg.Limits != nil {
		m = cfg.Limits.BatchModel()
	}
	if cfg.BatchSize > 0 {
		m.MaxBatch = int64(cfg.BatchSize)
	}
	speed := cfg.Sync.Speed
	if speed <= 0 {
		speed = 1
	}
	deadlineS := cfg.Deadline.Seconds() * speed // API seconds
	r, err := plan.ProjectRoutes(p, pin, m, deadlineS)
	if err != nil {
		return nil, err
	}
	pr := &projection{Projection: p, routes: r, route: cfg.Route}
	g := *p
	switch cfg.Route {
	case RouteBatch:
		g.ExpectedCost, g.WorstCase = r.Batch.ExpectedCost, r.Batch.WorstCase
	case RouteAuto:
		if r.Auto != nil {
			g.ExpectedCost, g.WorstCase = r.Auto.ExpectedCost, r.Auto.WorstCase
		} else {
			g.ExpectedCost, g.WorstCase = r.Batch.ExpectedCost, r.Batch.WorstCase
		}
	}
	g.PerArmExpected, g.PerArmWorst = g.ExpectedCost, g.WorstCase
	pr.gated = &g
	return pr, nil
}

// gate prints the gate's arithmetic for the chosen route and returns the
// exit code it demands.
func (pr *projection) gate(n int64, g plan.GateConfig, w io.Writer) int {
	gr := plan.Gate(pr.gated, n, g)
	if pr.route != RouteSync {
		fmt.Fprintf(w, "route %s: projected at its prices\n", pr.route)
	}
	switch gr.Decision {
	case plan.Pause:
		fmt.Fprintln(w, "paused by the budget gate; nothing sent:")
		fmt.Fprintln(w, gr.Explain)
		return ExitPaused
	case plan.ConfirmRequired:
		fmt.Fprintln(w, "refused: --confirm is required for this run; nothing sent:")
		fmt.Fprintln(w, gr.Explain)
		return ExitRefused
	}
	if gr.Explain != "" {
		fmt.Fprintln(w, gr.Explain)
	}
	return ExitOK
}

// router sets auto's split from the projection, and when a batch is late:
// when, at the projected sync rate, its requests would no longer end by
// the deadline if it were cancelled and they were sent by sync.
func (cfg *Config) router(job *rundir.Job, pr *projection, x *Exec, start time.Time, w io.Writer) {
	r := pr.routes
	nb, ns := r.Split()
	x.SyncItems = ns
	msg := fmt.Sprintf("route auto: %d by batch, %d by sync", nb, ns)
	if r.Auto != nil {
		msg += ": " + r.Auto.Explain
	} else {
		msg += ": no --deadline, so every item that can goes by batch (the cheapest)"
	}
	fmt.Fprintln(w, msg)
	job.Events.Emit(rundir.EventBatch, msg, map[string]any{"batch_items": nb, "sync_items": ns, "deadline_s": r.DeadlineS})
	if cfg.Deadline <= 0 {
		return
	}
	speed := cfg.Sync.Speed
	if speed <= 0 {
		speed = 1
	}
	m := r.Model()
	// Batches show no progress until they end, so a batch is late when it
	// has not ended by when the model expects it: then it is cancelled,
	// what it finished is harvested and the rest goes by sync. The split
	// left time for one org's batch to be sent again so.
	x.Batch.PollMax = min(max(time.Duration(r.DeadlineS/40*float64(time.Second)), 5*time.Second), 60*time.Second)
	x.LateAt = func(b store.BatchRecord, ahead int64) (time.Time, string) {
		apiS := m.QueueWaitS + float64(ahead+b.N)/m.PerMinute*60 + m.PollS
		at := b.CreatedAt.Add(time.Duration(apiS / speed * float64(time.Second)))
		return at, fmt.Sprintf("the batch model expects it to end %s after its create (%s queue wait + %d requests, %d of them ahead of it on the org, at %s a minute + %s for the poll), at %s; the deadline is %s",
			time.Duration(apiS*float64(time.Second)).Round(time.Second), time.Duration(m.QueueWaitS*float64(time.Second)), ahead+b.N, ahead, fmtRate(m.PerMinute),
			time.Duration(m.PollS*float64(time.Second)), at.UTC().Format(time.TimeOnly), start.Add(cfg.Deadline).UTC().Format(time.TimeOnly))
	}
}

func fmtRate(v float64) string { return fmt.Sprintf("%g", v) }

// queueCaps are the orgs' batch queue caps from a limits file's batch
// model (0: unknown).
func queueCaps(l *plan.Limits, orgs []string) map[string]int64 {
	if l == nil || l.Batch == nil || l.Batch.Queue <= 0 {
		return nil
	}
	out := map[string]int64{}
	for _, o := range orgs {
		out[o] = l.Batch.Queue
	}
	return out
}

// batchRPM is the orgs' batch-endpoint RPM from a limits file's batch
// model (nil: the route's default).
func batchRPM(l *plan.Limits, orgs []string) map[string]float64 {
	if l == nil || l.Batch == nil || l.Batch.RPM <= 0 {
		return nil
	}
	out := map[string]float64{}
	for _, o := range orgs {
		out[o] = l.Batch.RPM
	}
	return out
}

// finish writes the summary, events and report, and picks the exit code.
func (cfg *Config) finish(job *rundir.Job, out Outcome, res *Result, runErr error, pr *projection, n int64, g plan.GateConfig) Outcome {
	out.Err = runErr
	if res == nil || res.Summary == nil {
		out.Code = ExitIncomplete
		if errors.Is(runErr, batch.ErrNeedsPerson) {
			out.Code = ExitNeedsPerson
		}
		return out
	}
	s := res.Summary
	s.Projection, _ = pr.JSON(plan.Gate(pr.gated, n, g))
	if cfg.Finish != nil {
		cfg.Finish(s)
	}
	out.Summary = s
	var errs []error
	if err := job.WriteSummary(s, cfg.SummaryPath); err != nil {
		errs = append(errs, fmt.Errorf("writing the summary: %w", err))
	}
	if err := job.Events.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("writing events: %w", err))
	}
	if err := report.Write(job.Dir); err != nil {
		errs = append(errs, fmt.Errorf("writing the report: %w", err))
	}
	if len(errs) > 0 && cfg.Stderr != nil {
		for _, e := range errs {
			fmt.Fprintln(cfg.Stderr, "apidispatch:", e)
		}
	}
	switch {
	case !s.DataLoss.Passed:
		out.Code = ExitDataLoss
		out.Err = fmt.Errorf("DATA-LOSS CHECK FAILED: %+v", s.DataLoss)
	case errors.Is(runErr, batch.ErrNeedsPerson):
		out.Code = ExitNeedsPerson
	case runErr != nil || !res.Complete:
		out.Code = ExitIncomplete
	default:
		out.Code = ExitOK
	}
	return out
}

// ProjectCache narrows a projection's input to what the result cache cc
// does not answer (nothing to do without a cache): 'plan' and 'run' project
// only the misses. baseURL is the API the run asks: only its answers count.
func ProjectCache(ctx context.Context, input string, in *plan.Input, cc *cache.Cache, mode cache.Mode, sampled bool, baseURL string) error {
	if cc == nil {
		return nil
	}
	origin, err := plan.CacheOrigin(baseURL)
	if err != nil {
		return err
	}
	ch, err := plan.ProjectCache(ctx, input, in.Workload, cc, mode, sampled, origin)
	if err != nil {
		return fmt.Errorf("looking the input up in the cache: %w", err)
	}
	in.Workload, in.Cached = ch.Misses, plan.Cached{Hits: ch.Hits, Saved: ch.Saved}
	return nil
}

// RotationReminders returns a line per org whose key is older than 90 days.
func RotationReminders(orgs []org.Org, now time.Time) []string {
	var out []string
	for _, o := range orgs {
		if o.NeedsRotation(now) {
			out = append(out, fmt.Sprintf("reminder: the key of org %s (%s) was last rotated %s, over 90 days ago; rotate it", o.Name, o.Key.Fingerprint(), o.Rotated.Format("2006-01-02")))
		}
	}
	return out
}

// openBatches names the run's batches still open on the API ("id on org, N
// requests", or the record's number before its id is known).
func openBatches(ctx context.Context, st store.Store) ([]string, error) {
	bs, err := st.Batches(ctx)
	if err != nil {
		return nil, err
	}
	var open []string
	for _, b := range bs {
		if !b.Status.Open() {
			continue
		}
		id := b.ID
		if id == "" {
			id = fmt.Sprintf("batch %d (create unconfirmed)", b.Local)
		}
		open = append(open, fmt.Sprintf("%s on %s, %d requests", id, b.Org, b.N))
	}
	return open, nil
}
