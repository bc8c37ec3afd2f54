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
	"github.com/apidispatch/apidispatch/workload"
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
	// The pre-flight gate (docs/design.md §7).
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
	// most requests per batch (0: an even share of the orgs, at most the
	// API's 100,000).
	Route     string
	BatchSize int
	// Cancel cancels the run's open batches, harvests what they did and
	// sends nothing new.
	Cancel bool
	// Shared is the shared budget (--shared); Run opens it once the run
	// directory is open, gives its gates to every engine, adds what it
	// saw to the summary and closes it at the end. The batch route holds
	// no request slots, so a batch run without a pilot goes without it.
	Shared Shared
	// MetricsAddr, when set, is where Run serves the lanes' Prometheus
	// metrics while it runs.
	MetricsAddr string
	// OnJob, when set, is called once the run directory is open, before
	// anything is sent: a library front door (the gateway) takes the
	// job's store and may set the sync configuration's spend gate. The
	// cleanup it returns runs when the run ends.
	OnJob func(job *rundir.Job, sync *dispatch.Config) (cleanup func(), err error)
	// OnAttach, when set, is called once the batch route (batch and auto)
	// has loaded the run's open batches, each holding its worst case in
	// the spend gate, before anything is sent: until then the gateway
	// holds a resumed batch's worst case in its client's gate itself.
	OnAttach func()
	// Abort, when set, abandons the requests in flight when its Abort is
	// called (the second signal).
	Abort *Aborter
	// Progress shows the run's progress on Stderr (the engines' lines,
	// and the open batches every few seconds); TTY says Stderr is a
	// terminal (the progress line is redrawn in place).
	Progress, TTY bool
	// Stderr gets the gate's arithmetic, the router's decision, progress
	// and warnings (nil: discarded).
	Stderr io.Writer
}

// Outcome is what Run returns: how it stopped, the summary (nil when the
// run never started), where its results are, and the error, if any.
type Outcome struct {
	Stop        Stop
	Summary     *rundir.Summary
	Dir         string
	ResultsPath string
	Err         error
}

// Code is the outcome's process exit code (docs/design.md §10).
func (o Outcome) Code() int { return o.Stop.Kind.ExitCode() }

// fail is an outcome that stopped for err, of kind k.
func fail(k StopKind, err error) Outcome {
	return Outcome{Stop: Stop{Kind: k}, Err: err}
}

// failf is fail with a formatted error.
func failf(k StopKind, format string, a ...any) Outcome {
	return fail(k, fmt.Errorf(format, a...))
}

// with is o stopped for err, of kind k, keeping where its results are.
func (o Outcome) with(k StopKind, err error) Outcome {
	o.Stop, o.Err = Stop{Kind: k}, err
	return o
}

// check validates what Run can judge before reading the input.
func (cfg *Config) check() error {
	switch cfg.Route {
	case "":
		cfg.Route = RouteSync
	case RouteSync, RouteBatch, RouteAuto:
	default:
		return fmt.Errorf("--route %q: want sync, batch or auto", cfg.Route)
	}
	switch {
	case cfg.BatchSize < 0 || cfg.BatchSize > batch.MaxRequests:
		return fmt.Errorf("--batch-size %d: a batch holds 1 to %d requests (the API's limit)", cfg.BatchSize, batch.MaxRequests)
	case cfg.Deadline < 0:
		return fmt.Errorf("--deadline %s: want a positive duration", cfg.Deadline)
	case cfg.Route != RouteSync && cfg.Sync.Cache != nil:
		return errors.New("--cache answers and stores results of the sync route only; use --route sync with --cache, or leave --cache off")
	case cfg.Cancel && cfg.Route == RouteSync:
		return errors.New("--cancel cancels a run's open batches: it needs --route batch or auto")
	}
	return nil
}

// Run is the lifecycle of one run: validate → project → gate → open the
// run directory and the services → pilot → routes → finish (summary,
// events, report). Everything it starts it stops before it returns.
func Run(ctx context.Context, cfg Config) Outcome {
	w := cfg.Stderr
	if w == nil {
		w = io.Discard
	}
	if err := cfg.check(); err != nil {
		return fail(Usage, err)
	}
	ws, prices, estimates, err := rundir.ValidatePricing(cfg.Input, cfg.Prices, cfg.Sync.MaxCost > 0)
	if err != nil {
		return failf(Usage, "%s: %w", cfg.Input, err)
	}
	cfg.Prices, cfg.Sync.Prices = prices, prices
	for _, e := range estimates {
		fmt.Fprintf(w, "warning: model %s has no price in the price table: its cost is an estimate, at the prices of %s (its pool's most expensive known model); add it with --prices FILE for exact costs\n", e.Model, e.As)
	}
	if err := cfg.checkProviders(ws); err != nil {
		return failf(Usage, "%s: %w", cfg.Input, err)
	}
	if ws.OpenAI > 0 {
		fmt.Fprintf(w, "note: %d OpenAI items go by the %s route to the OpenAI orgs; the projection, the budget gate and --max-cost cover both providers\n", ws.OpenAI, cfg.Route)
	}
	pin := plan.Input{Workload: ws, Prices: cfg.Prices, Orgs: orgNames(providerOrgs(cfg.Sync.Orgs, org.Anthropic)),
		OpenAIOrgs: orgNames(providerOrgs(cfg.Sync.Orgs, org.OpenAI)), Caps: cfg.Sync.Caps, Limits: cfg.Limits,
		ExpectOutput: cfg.ExpectOutput, Speed: cfg.Sync.Speed}
	if err := ProjectCache(ctx, cfg.Input, &pin, cfg.Sync.Cache, cfg.Sync.CacheMode, cfg.Sync.CacheSampled, cfg.Sync.BaseURL); err != nil {
		return fail(Usage, err)
	}
	gcfg := plan.GateConfig{Budget: cfg.Budget, Tolerance: cfg.Tolerance, Confirm: cfg.Confirm}
	pr, err := cfg.project(pin)
	if err != nil {
		return failf(Usage, "projecting: %w", err)
	}
	if k := pr.gate(ws.N, gcfg, w); k != Complete {
		return Outcome{Stop: Stop{Kind: k}}
	}
	for _, r := range RotationReminders(cfg.Sync.Orgs, time.Now()) {
		fmt.Fprintln(w, r)
	}
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: cfg.Input, RunDir: cfg.RunDir, ResultsPath: cfg.ResultsPath, Prices: cfg.Prices}, ws)
	if err != nil {
		if errors.Is(err, rundir.ErrRunDirBusy) {
			return fail(Refused, err)
		}
		return fail(Usage, err)
	}
	defer job.Close()
	for _, e := range estimates {
		job.Events.Emit(rundir.EventWarning, "model "+e.Model+" has no price in the price table: its costs are estimates at the prices of "+e.As,
			map[string]any{"model": e.Model, "priced_as": e.As, "estimated": true})
	}
	out := Outcome{Dir: job.Dir, ResultsPath: job.ResultsPath}
	svc, err := cfg.startServices(ctx, job, w)
	if err != nil {
		return out.with(Usage, err)
	}
	defer svc.Stop()
	cfg.Sync.NewGate = svc.NewGate(cfg.Sync.NewGate)
	if cfg.OnJob != nil {
		cleanup, err := cfg.OnJob(job, &cfg.Sync)
		if err != nil {
			return out.with(Usage, err)
		}
		if cleanup != nil {
			defer cleanup()
		}
	}
	r := &run{cfg: &cfg, job: job, ws: ws, pin: pin, pr: pr, gcfg: gcfg, svc: svc, w: w, out: out}
	return r.send(ctx)
}

// checkProviders refuses, before anything is sent, a request file with
// items of a provider that no configured org serves (naming the first such
// line), and OpenAI items on a route that cannot carry them yet.
func (cfg *Config) checkProviders(ws *workload.Summary) error {
	has := map[string]bool{}
	for _, o := range cfg.Sync.Orgs {
		has[o.ProviderName()] = true
	}
	switch {
	case ws.FirstOpenAILine > 0 && !has[org.OpenAI]:
		return fmt.Errorf("line %d is an OpenAI request (url %s), and no OpenAI org is configured: set OPENAI_API_KEY or OPENAI_API_KEY_<NAME>, or add an org with provider = \"openai\" to the orgs file", ws.FirstOpenAILine, workload.OpenAIEndpoint)
	case ws.FirstAnthropicLine > 0 && !has[org.Anthropic]:
		return fmt.Errorf("line %d is an Anthropic request (params), and no Anthropic org is configured: set ANTHROPIC_API_KEY or ANTHROPIC_API_KEY_<NAME>, or add an org to the orgs file", ws.FirstAnthropicLine)
	case ws.OpenAI > 0 && cfg.Pilot > 0:
		return fmt.Errorf("line %d is an OpenAI request: --pilot re-projects Anthropic models only; run without --pilot", ws.FirstOpenAILine)
	}
	return nil
}

// providerOrgs are the orgs of provider among orgs.
func providerOrgs(orgs []org.Org, provider string) []org.Org {
	var out []org.Org
	for _, o := range orgs {
		if o.ProviderName() == provider {
			out = append(out, o)
		}
	}
	return out
}

// startServices starts the shared budget and the metrics the run asks for.
func (cfg *Config) startServices(ctx context.Context, job *rundir.Job, w io.Writer) (*Services, error) {
	sh := cfg.Shared
	if cfg.Route == RouteBatch && sh.URL != "" && cfg.Pilot <= 0 {
		// The batch route holds no request slots: nothing to share (a
		// pilot sends its items by sync, on the key's slots).
		msg := "--shared is not used by --route batch (the Message Batches API holds no request slots of a key); going on without Redis"
		fmt.Fprintln(w, "note: "+msg)
		job.Events.Emit(rundir.EventWarning, msg, nil)
		sh = Shared{}
	}
	return StartServices(ctx, ServicesConfig{Shared: sh, MetricsAddr: cfg.MetricsAddr, Orgs: cfg.Sync.Orgs, Events: job.Events, Stderr: w, Log: cfg.Sync.Log})
}

// run is one Run once its run directory is open.
type run struct {
	cfg  *Config
	job  *rundir.Job
	ws   *workload.Summary
	pin  plan.Input
	pr   *Projection
	gcfg plan.GateConfig
	svc  *Services
	w    io.Writer
	out  Outcome
}

// send checks the run's batches and spend, runs the pilot and the routes,
// and finishes.
func (r *run) send(ctx context.Context) Outcome {
	cfg, job, out := r.cfg, r.job, r.out
	if cfg.Route != RouteSync {
		if err := batch.CheckItems(ctx, job.Store, 0); err != nil {
			return out.with(Usage, err)
		}
	}
	open, err := openBatches(ctx, job.Store)
	if err != nil {
		return out.with(Incomplete, fmt.Errorf("reading the run's batches: %w", err))
	}
	if len(open) > 0 && cfg.Route == RouteSync {
		// Their items are still pending: a sync run would send them again
		// and the API bill them twice when the batches end.
		return out.with(Refused, fmt.Errorf("%d batches of this run are still open on the API (%s): their items would be sent and paid twice by sync; rerun with --route batch (or auto) to re-attach and harvest them, adding --cancel to cancel them first", len(open), strings.Join(open, ", ")))
	}
	if cfg.Sync.Spend == nil {
		// One spend gate for the whole run (the pilot and every route),
		// seeded with what the run directory spent before: a resume goes
		// on against the same cap.
		// What a process that died on this directory may have had billed
		// counts too.
		if err := job.ReplayJournals(ctx); err != nil {
			return out.with(Incomplete, fmt.Errorf("reading the attempt journals: %w", err))
		}
		agg, err := job.Store.Aggregate(ctx)
		if err != nil {
			return out.with(Incomplete, fmt.Errorf("reading what the run spent: %w", err))
		}
		cfg.Sync.Spend = spend.New("--max-cost", cfg.Sync.MaxCost, rundir.SpentBefore(agg))
	}
	start := time.Now()
	if cfg.Deadline > 0 {
		cfg.Sync.Deadline = start.Add(cfg.Deadline)
	}
	names := orgNames(cfg.Sync.Orgs)
	x := Exec{Route: cfg.Route, Sync: cfg.Sync, OnEngine: cfg.onEngine(r.w), OnAttach: cfg.OnAttach,
		Batch: batch.Config{Size: cfg.BatchSize, Cancel: cfg.Cancel, QueueCap: queueCaps(cfg.Limits, names), RPM: batchRPM(cfg.Limits, names),
			QueueTokens: queueTokens(cfg.Limits, names)}}
	if cfg.Progress {
		x.OnBatch = func(rt *batch.Route) func() { return watchBatches(rt, r.w) }
	}
	if cfg.Pilot > 0 && cfg.Pilot < r.ws.N && !cfg.Cancel && len(open) == 0 {
		// (With batches open the pilot is past: its sync sends would not
		// skip the items they hold.)
		if o, done := r.pilot(ctx, x); done {
			return o
		}
	}
	if cfg.Route == RouteAuto {
		cfg.router(job, r.pr, &x, start, r.w)
	}
	res, err := Execute(ctx, job, x)
	if errors.Is(err, ErrInput) {
		return out.with(Usage, err)
	}
	if res != nil && res.Summary != nil && r.pr.Routes != nil && r.pr.Routes.Auto != nil {
		res.Summary.Router = r.pr.Routes.Doc().Auto
	}
	return r.finish(res, err)
}

// pilot sends the first Pilot items by sync, re-projects from what they
// cost and gates again. done is true when the run ends with o.
func (r *run) pilot(ctx context.Context, x Exec) (o Outcome, done bool) {
	cfg, out := r.cfg, r.out
	if cfg.Route != RouteSync {
		// The pilot measures what requests cost before the rest are
		// sent; a batch would take up to 24 h to say it.
		msg := fmt.Sprintf("pilot: the first %d items go by sync, at the full (sync) price, twice their batch price, to measure their cost before the rest go by %s", cfg.Pilot, cfg.Route)
		fmt.Fprintln(r.w, msg)
		r.job.Events.Emit(rundir.EventBatch, msg, map[string]any{"pilot": cfg.Pilot, "route": RouteSync})
	}
	px := x
	px.Route = RouteSync
	px.Sync.MaxSeq = cfg.Pilot
	res, err := Execute(ctx, r.job, px)
	if err != nil && !errors.Is(err, dispatch.ErrIncomplete) {
		return r.finish(res, err), true
	}
	if ctx.Err() != nil || (res != nil && res.Stop.Halted) {
		return r.finish(res, err), true
	}
	ps, perr := plan.PilotFromStore(ctx, r.job.Store, cfg.Pilot)
	if perr != nil {
		return out.with(Incomplete, fmt.Errorf("reading the pilot: %w", perr)), true
	}
	r.pin.Pilot = ps
	if r.pr, err = cfg.project(r.pin); err != nil {
		return out.with(Incomplete, fmt.Errorf("re-projecting: %w", err)), true
	}
	fmt.Fprintf(r.w, "pilot of %d items done; re-projected expected cost %s (worst case %s)\n", cfg.Pilot, r.pr.Gated.ExpectedCost, r.pr.Gated.WorstCase)
	if k := r.pr.gate(r.ws.N, r.gcfg, r.w); k != Complete {
		return out.with(k, nil), true
	}
	return Outcome{}, false
}

// orgNames are the orgs' names.
func orgNames(orgs []org.Org) []string {
	names := make([]string, len(orgs))
	for i, o := range orgs {
		names[i] = o.Name
	}
	return names
}

// router sets auto's split from the projection, and when a batch is late:
// when, at the projected sync rate, its requests would no longer end by
// the deadline if it were cancelled and they were sent by sync.
//
// Without projected routes every item goes by batch, and with a deadline a
// late batch is judged by the batch model of the limits file (or the
// default).
func (cfg *Config) router(job *rundir.Job, pr *Projection, x *Exec, start time.Time, w io.Writer) {
	speed := cfg.Sync.Speed
	if speed <= 0 {
		speed = 1
	}
	r := pr.Routes
	var nb, ns int64
	var msg string
	m, deadlineS := cfg.Limits.BatchModel(), cfg.Deadline.Seconds()*speed
	if r == nil {
		nb = pr.N
		msg = fmt.Sprintf("route auto: %d by batch, 0 by sync: no routes were projected, so every item goes by batch first (the cheapest) and by sync what a late batch gives back", nb)
	} else {
		nb, ns = r.Split()
		x.SyncOpenAI = r.SplitOpenAI(ns)
		m, deadlineS = r.Model(), r.DeadlineS
		msg = fmt.Sprintf("route auto: %d by batch, %d by sync", nb, ns)
		if r.Auto != nil {
			msg += ": " + r.Auto.Explain
		} else {
			msg += ": no --deadline, so every item that can goes by batch (the cheapest)"
		}
	}
	x.SyncItems = ns
	fmt.Fprintln(w, msg)
	job.Events.Emit(rundir.EventBatch, msg, map[string]any{"batch_items": nb, "sync_items": ns, "deadline_s": deadlineS})
	if cfg.Deadline <= 0 {
		return
	}
	// Batches show no progress until they end, so a batch is late when it
	// has not ended by when the model expects it: then it is cancelled,
	// what it finished is harvested and the rest goes by sync. The split
	// left time for one org's batch to be sent again so.
	x.Batch.PollMax = min(max(time.Duration(deadlineS/40*float64(time.Second)), 5*time.Second), 60*time.Second)
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

// queueTokens are the OpenAI orgs' enqueued-token limits per model from a
// limits file's batch model (nil: the route's default).
func queueTokens(l *plan.Limits, orgs []string) map[string]int64 {
	if l == nil || l.Batch == nil || l.Batch.QueueTokens <= 0 {
		return nil
	}
	out := map[string]int64{}
	for _, o := range orgs {
		out[o] = l.Batch.QueueTokens
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

// finish writes the summary, events and report, and says how the run
// stopped.
func (r *run) finish(res *Result, runErr error) Outcome {
	cfg, job, out := r.cfg, r.job, r.out
	out.Err = runErr
	if res == nil || res.Summary == nil {
		out.Stop = Stop{Kind: Incomplete}
		if res != nil {
			out.Stop.Halted, out.Stop.Reason = res.Stop.Halted, res.Stop.Reason
		}
		if errors.Is(runErr, batch.ErrNeedsPerson) {
			out.Stop.Kind = NeedsPerson
		}
		return out
	}
	s := res.Summary
	s.Projection, _ = r.pr.JSON(r.pr.Gate(r.ws.N, r.gcfg))
	if st := r.svc.SharedStats(); st != nil {
		s.Shared = st
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
	out.Stop = res.Stop
	switch {
	case !s.DataLoss.Passed:
		out.Stop.Kind = DataLoss
		out.Err = fmt.Errorf("DATA-LOSS CHECK FAILED: %+v", s.DataLoss)
	case errors.Is(runErr, batch.ErrNeedsPerson):
		out.Stop.Kind = NeedsPerson
	case runErr != nil || !res.Complete:
		out.Stop.Kind = Incomplete
	default:
		out.Stop.Kind = Complete
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
