// Package batch is the batch route of apidispatch: the same request file in,
// the same results file and store out as the sync route (package dispatch),
// at half the price and with the latency of a batch. Anthropic items go in
// Message Batches on the Anthropic orgs; OpenAI items in OpenAI batches on
// the OpenAI orgs (an uploaded JSONL input file, purpose batch, and a
// create naming it, one model a batch; the results are its output and
// error files, in the OpenAI batch output line the sync route writes too).
// Each API is an implementation of one seam (api: create, retrieve, list,
// cancel, results, the custom_ids a batch was created with); everything
// below is the route's, for both.
//
// A run's pending items are cut into batches (at most Config.Size requests
// and Config.MaxBytes of create body each), placed on the org with the most
// processing-queue headroom, polled per org with back-off and harvested into
// the run's store and results.jsonl exactly once.
//
// Never lost, never paid twice, never someone else's: a batch is recorded
// in the store as submitting, with its items and a random custom_id prefix
// made for it alone, before its create call; its requests are sent under
// that prefix and each item's Seq, and mapped back to the item's own
// custom_id when harvested. When the answer to a create is lost (a 5xx, a
// reset, a timeout, a stop mid-upload, or the process died) the route lists
// that org's batches and adopts a candidate (created in the window, with the
// same request count, naming no other prefix in its metadata) only when
// the custom_ids it holds prove it the record's: exactly the custom_ids the
// record wrote (a message batch's results, once ended; an OpenAI batch's
// input file, at once). It waits for candidates that have not
// ended, holding the items, until their expiry plus an hour at most; a
// record no batch of the org proves, once the API has had time to show it,
// is abandoned and its items are free again. Harvesting commits each result
// with the store's guard, so a batch harvested twice (after a crash) writes
// each line once; a batch whose results are past retention sends its items
// again. Every call to the batch endpoints is paced per org under the org's
// batch RPM. An org's queue is kept under its cap: Anthropic's processing
// queue in requests, OpenAI's enqueued prompt tokens per model (an OpenAI
// batch that fails for that limit is sent again, smaller). Failures every
// resume would repeat wrap ErrNeedsPerson.
//
// Per request: succeeded is done; errored with a non-retryable type
// (invalid_request_error) is terminal with its error; errored with a
// retryable type, expired, canceled or missing from the results goes back to
// pending and is sent again, in a later batch or by the sync route. No count
// of failures ever makes an item terminal.
package batch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// Limits of the Message Batches API (docs/design.md §19).
const (
	MaxRequests = 100_000
	MaxBytes    = 256 << 20
)

// DefaultQueueCap is the processing-queue cap assumed for an org whose cap
// is not known: the lowest tier's (docs/design.md §24: T1 100k).
const DefaultQueueCap = 100_000

// Times in API seconds (divided by Config.Speed).
const (
	pollMin       = 5 * time.Second
	pollMax       = 60 * time.Second
	reconcileWait = 5 * time.Minute  // how long a lost create may stay invisible in lists
	listSkew      = 2 * time.Minute  // clock difference allowed between us and the API
	notFoundWarn  = 10 * time.Minute // a submitted batch 404 this long is worth a warning
	notFoundLost  = time.Hour        // … and this long, the API does not have it
	orgHoldMin    = 60 * time.Second // an org that answered a create with 429 rests this long at least
	createTimeout = 10 * time.Minute
)

// Config is everything the route needs. Zero fields take the defaults noted.
type Config struct {
	Orgs    []org.Org
	BaseURL string // default https://api.anthropic.com
	Client  *http.Client
	// WrapTransport, when set, wraps the client's transport (--debug-http).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// Speed is the server's time compression (the simulator's K).
	Speed  float64
	Store  store.Store
	Sink   *rundir.Sink
	Body   rundir.BodyReader
	Prices *cost.Table
	Events *rundir.EventLog
	Log    *slog.Logger
	// Size is the most requests per batch (default and maximum MaxRequests);
	// MaxBytes the most bytes of create body (default and maximum MaxBytes).
	Size     int
	MaxBytes int64
	// QueueCap is each org's processing-queue cap, by org name (missing:
	// DefaultQueueCap). A create refused with 429 lowers what the route
	// places there.
	QueueCap map[string]int64
	// MaxCost, when positive, bounds the run's spend: a batch is created
	// only when spent plus the worst case of every open batch and of it
	// stays within it, so the cap holds even if every request used its
	// max_tokens. It covers the whole run directory, as the sync route's.
	// Without Spend, the route makes the gate that keeps it (seeded with
	// what the store says was spent).
	MaxCost cost.Nanos
	// Spend, when set, is the run's one spend gate, shared with the sync
	// engines of the run (MaxCost is then not read): each batch's worst
	// case is reserved there before its create and settled as its results
	// are harvested; the reservation of a batch whose billing cannot be
	// known (left running when Run returns, or given up on) stays counted.
	Spend *spend.Gate
	// Take selects the pending items this route carries (nil: all).
	Take func(it store.Item) bool
	// SubmitOnce: after the first pass that placed everything Take selects
	// (or when submitting stops for another reason) no more batches are
	// created; items that come back to pending are left to the sync route.
	// SubmitDone is closed then.
	SubmitOnce bool
	// NoSubmit: create nothing; re-attach to the run's open batches and
	// harvest them.
	NoSubmit bool
	// Cancel: cancel every open batch of the run, harvest what they did,
	// and create nothing.
	Cancel bool
	// LateAt, when set, says when an open batch that has not ended is
	// cancelled so that its unstarted work can go by sync (auto), and why.
	// ahead is the requests of the org's earlier open batches, which the
	// API processes first.
	LateAt func(b store.BatchRecord, ahead int64) (time.Time, string)
	// Deadline, when set, ends Run then as a signal does: nothing more is
	// created and open batches are left running (the same command
	// re-attaches to them).
	Deadline time.Time
	// PollMax is the longest wait between two polls of a batch, in API
	// time (default 60 s); auto shortens it for a short deadline.
	PollMax time.Duration
	// RPM is each org's requests per API minute over every batch endpoint
	// together (create, retrieve, list, results, cancel), by org name
	// (missing: DefaultRPM, the lowest tier's). The route paces its calls
	// to 90 % of it, and slower after a 429.
	RPM map[string]float64
	// QueueTokens is each OpenAI org's enqueued-token limit per model, by
	// org name (missing: DefaultQueueTokens): the prompt tokens its
	// unfinished batches of one model may hold. The route places at most
	// 90 % of it (its token counts are estimates); a batch that fails for
	// the limit lowers what it places there.
	QueueTokens map[string]int64
}

// DefaultQueueTokens is the enqueued-token limit per model assumed for an
// OpenAI org whose limit is not known. It is low on purpose: a limit too
// low only makes smaller batches, one too high fails them.
const DefaultQueueTokens = 2_000_000

// queueShare is the part of an OpenAI org's enqueued-token limit the
// route fills: its token counts are local estimates.
const queueShare = 0.9

// Result is what Run returns.
type Result struct {
	Created, Adopted, Abandoned, Harvested int
	// Open is how many batches were still running on the API when Run
	// returned (left there on a stop; the same command re-attaches).
	Open int
	// Retried counts results that went back to pending, Expired those of
	// them that had expired.
	Retried, Expired int64
	// BrokenDownloads counts results streams that broke off and were read
	// again.
	BrokenDownloads int
	// FilesLeft counts OpenAI input files the route could not delete once
	// nothing needed them (their batch harvested, or its create refused):
	// they stay on the org until they expire.
	FilesLeft int
	// Archived counts batches whose results were past retention: their
	// items went back to pending.
	Archived int
	// Requests counts requests sent in batches by this Run.
	Requests int64
	// StopReason says why submitting stopped early ("" when it did not).
	StopReason string
	// StopErr is the error behind StopReason when it was one: a spend
	// cap's *spend.CapError, which callers tell by errors.As (a gateway
	// batch refused by its client's max_cost ends on it).
	StopErr error
	WallS   float64
	// CostNanos is what this Run's harvests committed.
	CostNanos int64
}

// orgState is one org as the route sees it.
type orgState struct {
	org.Org
	cl        api
	openai    bool // an OpenAI org: one model per batch, a token queue per model
	holdUntil time.Time
	disabled  string
	capSeen   int64 // 0: none observed
	// tokSeen is, per model, the enqueued tokens of ours a batch failed
	// beyond (OpenAI).
	tokSeen map[string]int64
}

// rec is a batch record with what the route keeps about it in memory.
type rec struct {
	store.BatchRecord
	org       *orgState
	next      time.Time // when to look at it again
	wait      time.Duration
	lost404   time.Time // first 404 of a run of them
	warned404 bool
	ended     bool
	lateDone  bool
	// fails counts the reads of its results that failed.
	fails readFails
	// rejected are the candidate batches proven not this record's (a
	// record whose create's answer was lost); waitNoted: the wait for
	// candidates that have not ended was announced.
	rejected  map[string]bool
	waitNoted bool
	// upload is the input file an OpenAI create uploaded before the
	// answer to its batch create was lost (known to this process only):
	// deleted if the record is abandoned.
	upload string
	// hold is the batch's worst case in the spend gate.
	hold *spend.Reservation
	// last is the batch as last seen on the API (nil: not seen yet).
	last *apiBatch
	// model and tokens: an OpenAI batch's one model and the prompt tokens
	// it enqueues there (estimated).
	model  string
	tokens int64
}

// Route runs the batch route of one run. Use New, then Run once.
type Route struct {
	cfg  Config
	orgs []*orgState
	log  *slog.Logger

	mu   sync.Mutex
	held map[int64]int64 // seq → local batch, for every open batch

	recs []*rec
	// known maps the API id of every batch of the run (open or settled)
	// to its record.
	known      map[string]int64
	gate       *spend.Gate     // the run's spend gate (Config.Spend, or the route's own)
	costWait   <-chan struct{} // the gate's Changed while creating waits for room for costNeed
	costNeed   cost.Nanos
	changed    chan struct{}
	submitDone chan struct{}
	closedSub  bool
	stopReason string
	stopErr    error // see Result.StopErr
	res        Result
	start      time.Time
	loaded     bool
}

// New checks cfg and returns a route.
func New(cfg Config) (*Route, error) {
	if len(cfg.Orgs) == 0 {
		return nil, org.ErrNoOrgs
	}
	if cfg.Store == nil || cfg.Sink == nil || cfg.Body == nil || cfg.Prices == nil {
		return nil, errors.New("batch: Config needs Store, Sink, Body and Prices")
	}
	if cfg.Size == 0 {
		cfg.Size = MaxRequests
	}
	if cfg.Size < 1 || cfg.Size > MaxRequests {
		return nil, fmt.Errorf("batch: batch size %d: want 1 to %d requests (the API's limit)", cfg.Size, MaxRequests)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = MaxBytes
	}
	if cfg.MaxBytes < 1 || cfg.MaxBytes > MaxBytes {
		return nil, fmt.Errorf("batch: batch bytes %d: want 1 to %d (256 MB, the API's limit)", cfg.MaxBytes, MaxBytes)
	}
	base, err := apihttp.ResolveBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.PollMax <= 0 {
		cfg.PollMax = pollMax
	}
	// Every client refuses redirects: no key leaves for another host.
	hc := apihttp.Guard(cfg.Client)
	if hc == nil {
		hc = apihttp.NewClient(nil, 16, 0)
	}
	if cfg.WrapTransport != nil {
		c := *hc
		c.Transport = cfg.WrapTransport(c.Transport)
		hc = &c
	}
	r := &Route{cfg: cfg, log: cfg.Log, held: map[int64]int64{}, known: map[string]int64{}, changed: make(chan struct{}, 1), submitDone: make(chan struct{})}
	for _, o := range cfg.Orgs {
		c := newConn(hc, base, o, newPacer(cfg.RPM[o.Name], cfg.Speed))
		st := &orgState{Org: o, cl: messagesAPI{c}}
		if c.prov == upstream.OpenAI {
			st.cl, st.openai, st.tokSeen = openaiAPI{c}, true, map[string]int64{}
		}
		r.orgs = append(r.orgs, st)
	}
	if cfg.NoSubmit || cfg.Cancel {
		r.closeSubmit("")
	}
	return r, nil
}

// Holds reports whether an open batch of the run holds the item seq. It is
// safe to call from any goroutine (the sync engine's Skip).
func (r *Route) Holds(seq int64) bool {
	r.mu.Lock()
	_, ok := r.held[seq]
	r.mu.Unlock()
	return ok
}

// Held is how many items the run's open batches hold. It is safe to call
// from any goroutine (progress displays).
func (r *Route) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// SubmitDone is closed once the route will create no more batches.
func (r *Route) SubmitDone() <-chan struct{} { return r.submitDone }

// Changed receives a value after each harvest (coalesced).
func (r *Route) Changed() <-chan struct{} { return r.changed }

// closeSubmit ends creating for good; a reason (a stop) is kept even when
// creating had ended already (SubmitOnce).
func (r *Route) closeSubmit(reason string) {
	if reason != "" && r.stopReason == "" {
		r.stopReason = reason
	}
	if r.closedSub {
		return
	}
	r.closedSub = true
	close(r.submitDone)
}

// api converts API time to wall time at the server's speed.
func (r *Route) api(d time.Duration) time.Duration {
	return time.Duration(float64(d) / r.cfg.Speed)
}

func (r *Route) orgNamed(name string) *orgState {
	for _, o := range r.orgs {
		if o.Name == name {
			return o
		}
	}
	return nil
}

// emit records a step of the route. Batch steps are few and each changes
// what a crash leaves behind, so the log is flushed at once.
func (r *Route) emit(note string, data map[string]any) {
	r.cfg.Events.Emit(rundir.EventBatch, note, data)
	r.cfg.Events.Flush()
	r.log.Info(note)
}

// Load reads the run's batches and holds the items of the open ones, so
// that Holds answers for them before Run starts (Run loads them itself
// otherwise). Call it at most once, before Run.
func (r *Route) Load(ctx context.Context) error {
	if r.loaded {
		return nil
	}
	r.loaded = true
	return r.load(ctx)
}

// load reads the run's batches and holds the items of the open ones.
func (r *Route) load(ctx context.Context) error {
	recs, err := r.cfg.Store.Batches(ctx)
	if err != nil {
		return fmt.Errorf("reading the run's batches: %w", err)
	}
	if r.gate = r.cfg.Spend; r.gate == nil {
		agg, err := r.cfg.Store.Aggregate(ctx)
		if err != nil {
			return err
		}
		r.gate = spend.New("--max-cost", r.cfg.MaxCost, rundir.SpentBefore(agg))
	}
	now := time.Now()
	for _, b := range recs {
		if b.ID != "" {
			r.known[b.ID] = b.Local
		}
		if b.QueueTokens > 0 {
			if err := r.relearn(ctx, b); err != nil {
				return err
			}
		}
		if !b.Status.Open() {
			continue
		}
		o := r.orgNamed(b.Org)
		if o == nil {
			return fmt.Errorf("batch %d of this run (%s) is on org %q, which is not configured now; configure that org again to harvest it", b.Local, cmp.Or(b.ID, "id not known"), b.Org)
		}
		its, err := r.cfg.Store.BatchItems(ctx, b.Local)
		if err != nil {
			return err
		}
		r.mu.Lock()
		for _, it := range its {
			r.held[it.Seq] = b.Local
		}
		r.mu.Unlock()
		// Created by an earlier process: its worst case is held whatever
		// the cap says, since it may be billed.
		rc := &rec{BatchRecord: b, org: o, next: now, wait: r.api(pollMin), hold: r.gate.Hold(cost.Nanos(b.WorstNanos))}
		if o.openai && len(its) > 0 {
			rc.model = its[0].Model
			for _, it := range its {
				rc.tokens += it.EstInput
			}
		}
		r.recs = append(r.recs, rc)
		r.emit(fmt.Sprintf("batch %d (%s, org %s, %d requests, %s): re-attached", b.Local, cmp.Or(b.ID, "id not known yet"), b.Org, b.N, b.Status), recData(&b))
	}
	return nil
}

// relearn takes up the enqueued-token limit batch b's failure taught an
// earlier process: its org places no more of the model than that.
func (r *Route) relearn(ctx context.Context, b store.BatchRecord) error {
	o := r.orgNamed(b.Org)
	if o == nil || !o.openai {
		return nil
	}
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil || len(its) == 0 {
		return err
	}
	m := its[0].Model
	if s := o.tokSeen[m]; s == 0 || b.QueueTokens < s {
		o.tokSeen[m] = b.QueueTokens
		r.log.Info("an enqueued-token limit learnt earlier", "org", o.Name, "model", m, "tokens", b.QueueTokens, "batch", b.Local)
	}
	return nil
}

func recData(b *store.BatchRecord) map[string]any {
	return map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "n": b.N, "status": b.Status}
}

// Run creates, polls and harvests until every item it carries has ended or
// is back with the sync route, or ctx is cancelled (then open batches keep
// running on the API and Run returns at once; the same command
// re-attaches). The store is consistent however it returns.
func (r *Route) Run(ctx context.Context) (*Result, error) {
	r.start = time.Now()
	defer func() { r.res.WallS = time.Since(r.start).Seconds() }()
	if err := r.Load(ctx); err != nil {
		return nil, err
	}
	r.sweep(ctx) // what earlier processes of the run left
	defer r.keepOpen()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if ctx.Err() != nil {
			r.closeSubmit("stopped by signal")
			break
		}
		if d := r.cfg.Deadline; !d.IsZero() && time.Now().After(d) {
			r.closeSubmit("deadline reached")
			break
		}
		if r.cfg.Cancel {
			r.cancelAll(ctx)
		}
		// Counted before the submit, whose creates may settle a batch
		// too (abandoned: an org refused it, or its upload's answer was
		// lost).
		settled := r.res.Harvested + r.res.Abandoned + r.res.Archived
		if !r.closedSub && r.mayHaveRoom() {
			if err := r.submit(ctx); err != nil {
				if ctx.Err() != nil {
					continue // the stop, not a failure: the loop's top ends it
				}
				return r.result(), err
			}
		}
		now := time.Now()
		next := now.Add(time.Hour)
		for _, b := range r.recs {
			if !b.Status.Open() {
				continue
			}
			if !b.next.After(now) {
				if err := r.step(ctx, b); err != nil {
					if ctx.Err() != nil {
						break // a read cut short by the stop; the loop's top ends it
					}
					return r.result(), err
				}
				if ctx.Err() != nil {
					break
				}
			}
			if b.Status.Open() && b.next.Before(next) {
				next = b.next
			}
		}
		open := r.openCount()
		if open == 0 && (r.closedSub || !r.anyTakeable(ctx)) {
			r.closeSubmit(r.unserved(ctx))
			break
		}
		if !r.closedSub && r.res.Harvested+r.res.Abandoned+r.res.Archived != settled {
			// A batch settled: its items, its queue room and its reserve
			// may go into new batches now.
			next = now
		}
		if !r.closedSub {
			// Orgs on hold may take batches again later.
			for _, o := range r.orgs {
				if o.holdUntil.After(now) && o.holdUntil.Before(next) {
					next = o.holdUntil
				}
			}
		}
		if d := r.cfg.Deadline; !d.IsZero() && d.Before(next) {
			next = d.Add(time.Millisecond)
		}
		timer.Reset(max(time.Until(next), time.Millisecond))
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-r.costWait:
		}
	}
	if ctx.Err() == nil {
		r.sweep(ctx) // what this process left (a stop leaves it to the next start)
	}
	return r.result(), nil
}

// waitRoom is submit's answer to a spend gate without room for the least
// batch it would create (its first n requests, whose worst case is need):
// wait while anything the gate holds may yet free room (an open batch of
// this route, another route's requests in flight); stop creating, with the
// cap's figures, when nothing can.
func (r *Route) waitRoom(need cost.Nanos, n int) {
	ch := r.gate.Changed()
	err := r.gate.Check(need)
	switch {
	case err == nil:
		r.costWait, r.costNeed = closedWait, need // room came free: look again at once
	case r.gate.Open() == 0:
		what := "the next batch's first request"
		if n > 1 {
			what = fmt.Sprintf("the next batch's first %d requests", n)
		}
		if r.stopReason == "" {
			r.stopErr = err
		}
		r.closeSubmit(fmt.Sprintf("%v (%s)", err, what))
	default:
		r.costWait, r.costNeed = ch, need
	}
}

// closedWait is a closed channel: a wait that is over.
var closedWait = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// mayHaveRoom reports whether submit may find room in the spend gate: it
// is not waiting for room, or room has come free for the batch it waits
// to create, or no reservation is left that could free any (then submit
// stops creating). While it waits, costWait is renewed.
func (r *Route) mayHaveRoom() bool {
	if r.costWait == nil {
		return true
	}
	ch := r.gate.Changed()
	if r.gate.Check(r.costNeed) == nil || r.gate.Open() == 0 {
		r.costWait = nil
		return true
	}
	r.costWait = ch
	return false
}

// keepOpen keeps counted, for good, the worst case of every batch still
// open when Run returns: it runs on (or may) and its billing is not known.
func (r *Route) keepOpen() {
	for _, b := range r.recs {
		if b.Status.Open() {
			b.hold.Keep()
		}
	}
}

// harvestSpend harvests b and charges what its results cost to its
// reservation in the spend gate; once every result is read, the rest of
// its worst case is free again.
func (r *Route) harvestSpend(ctx context.Context, b *rec) error {
	before := r.res.CostNanos
	err := r.harvest(ctx, b)
	b.hold.Charge(cost.Nanos(r.res.CostNanos - before))
	if b.Status == store.BatchHarvested {
		b.hold.Release()
	}
	return err
}

func (r *Route) result() *Result {
	res := r.res
	res.Open = r.openCount()
	res.StopReason, res.StopErr = r.stopReason, r.stopErr
	res.WallS = time.Since(r.start).Seconds()
	return &res
}

func (r *Route) openCount() int {
	n := 0
	for _, b := range r.recs {
		if b.Status.Open() {
			n++
		}
	}
	return n
}

// step looks at one open batch: reconcile a submitting one, poll a
// submitted one, harvest it once ended.
func (r *Route) step(ctx context.Context, b *rec) error {
	if b.Status == store.BatchSubmitting {
		return r.reconcile(ctx, b)
	}
	if b.ended {
		return r.harvestSpend(ctx, b)
	}
	return r.poll(ctx, b)
}

// backoff schedules b's next look after its wait, growing it.
func (r *Route) backoff(b *rec, now time.Time, extra time.Duration) {
	b.wait = min(max(b.wait*3/2, r.api(min(pollMin, r.cfg.PollMax))), r.api(r.cfg.PollMax))
	b.next = now.Add(max(b.wait, extra))
}

func (r *Route) poll(ctx context.Context, b *rec) error {
	now := time.Now()
	ab, err := b.org.cl.retrieve(ctx, b.ID)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.status == http.StatusNotFound {
			// Just after a create, or for minutes mid-poll, the API may not
			// find a batch it has (eventual consistency): keep polling.
			if b.lost404.IsZero() {
				b.lost404 = now
			}
			if !b.warned404 && now.Sub(b.lost404) > r.api(notFoundWarn) {
				b.warned404 = true
				r.cfg.Events.Emit(rundir.EventWarning, fmt.Sprintf("batch %d (%s, org %s): the API has answered 404 not_found_error for %s; still polling", b.Local, b.ID, b.Org, now.Sub(b.lost404).Round(time.Second)), recData(&b.BatchRecord))
			}
			if now.Sub(b.lost404) > r.api(notFoundLost) {
				// Not resubmitted: it may exist (and be billed) where this
				// key cannot see it. The run stops and names it.
				return fmt.Errorf("%w: batch %d of this run (%s, org %s, %d requests) has answered 404 not_found_error for %s: the API behind --base-url does not know it (deleted, another workspace, or another API); its items stay held and are not sent again, so check the org's batches", ErrNeedsPerson, b.Local, b.ID, b.Org, b.N, now.Sub(b.lost404).Round(time.Second))
			}
		}
		if ctx.Err() == nil {
			r.backoff(b, now, retryAfter(err))
		}
		return nil
	}
	b.lost404 = time.Time{}
	b.last = ab
	if ab.Ended {
		b.ended = true
		b.EndedAt = cmp.Or(derefTime(ab.EndedAt), now)
		b.next = now
		if ab.ArchivedAt != nil {
			return r.pastRetention(ctx, b, *ab.ArchivedAt)
		}
		return r.harvestSpend(ctx, b)
	}
	var lateAt time.Time
	if r.cfg.LateAt != nil && !b.CancelRequested && !b.lateDone {
		at, why := r.cfg.LateAt(b.BatchRecord, r.ahead(b))
		if !at.IsZero() && now.After(at) {
			b.lateDone = true
			r.emit(fmt.Sprintf("batch %d (%s, org %s, %d requests) is late: %s; cancelling it so that its unprocessed requests go by sync", b.Local, b.ID, b.Org, b.N, why), recData(&b.BatchRecord))
			r.cancelOne(ctx, b)
		}
		lateAt = at
	}
	// Poll less often as the batch ages, up to PollMax; a cancelled batch
	// soon ends, and a batch is looked at when it would turn late.
	age := now.Sub(b.SubmittedAt)
	b.wait = min(max(age/8, r.api(min(pollMin, r.cfg.PollMax))), r.api(r.cfg.PollMax))
	// Polls of the org's open batches together take at most half its
	// batch-endpoint budget, however many small batches it holds.
	b.wait = max(b.wait, time.Duration(2*r.openOn(b.org))*b.org.cl.pacer().base)
	if b.CancelRequested {
		b.wait = min(b.wait, r.api(time.Second))
	}
	b.next = now.Add(b.wait)
	if lateAt.After(now) && lateAt.Before(b.next) {
		b.next = lateAt.Add(time.Millisecond)
	}
	return nil
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func retryAfter(err error) time.Duration {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.retryAfter
	}
	return 0
}

func (r *Route) cancelAll(ctx context.Context) {
	for _, b := range r.recs {
		if b.Status == store.BatchSubmitted && !b.CancelRequested && !b.ended {
			r.cancelOne(ctx, b)
		}
	}
}

func (r *Route) cancelOne(ctx context.Context, b *rec) {
	if _, err := b.org.cl.cancel(ctx, b.ID); err != nil {
		var ae *apiError
		if !errors.As(err, &ae) || !ae.certain() || ae.status == http.StatusNotFound || ae.status == http.StatusTooManyRequests {
			// Not cancelled yet (or not found yet): the next pass tries again.
			b.lateDone = false
			r.log.Warn("cancelling a batch failed; trying again", "batch", b.Local, "id", b.ID, "error", err.Error())
			return
		}
		// A batch that has ended cannot be cancelled (400): harvest it.
		r.log.Info("batch could not be cancelled", "batch", b.Local, "id", b.ID, "error", err.Error())
	}
	b.CancelRequested = true
	if err := r.cfg.Store.UpdateBatch(ctx, b.BatchRecord); err != nil {
		r.log.Warn("recording a cancel", "batch", b.Local, "error", err.Error())
	}
	r.emit(fmt.Sprintf("batch %d (%s, org %s): cancel requested; its finished requests will be harvested", b.Local, b.ID, b.Org), recData(&b.BatchRecord))
	b.next = time.Now()
}

// release frees the items of batch b (it is no longer open).
func (r *Route) release(ctx context.Context, b *rec) error {
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return err
	}
	r.mu.Lock()
	for _, it := range its {
		if r.held[it.Seq] == b.Local {
			delete(r.held, it.Seq)
		}
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// discard deletes what batch b keeps on its org that nothing needs any
// more (an OpenAI batch's input file): once b is harvested, nothing will
// read the file to prove a batch ours (a batch of the run is never another
// record's candidate). One try: a failure is logged and counted, and the
// file stays on the org until it expires.
func (r *Route) discard(ctx context.Context, b *rec, file string) {
	if file == "" {
		return
	}
	if err := b.org.cl.discard(ctx, &apiBatch{ID: b.ID, InputFile: file}); err != nil {
		r.res.FilesLeft++
		msg := org.Scrub(err.Error())
		r.log.Warn("deleting a batch's input file failed; it stays on the org until it expires", "batch", b.Local, "id", b.ID, "file", file, "error", msg)
		r.emit(fmt.Sprintf("batch %d (%s, org %s): its input file %s could not be deleted (%s); it stays on the org until it expires", b.Local, cmp.Or(b.ID, "no id"), b.Org, file, msg),
			map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "file": file})
	}
}

// sweep deletes the input files of the run's abandoned OpenAI records
// that their orgs may still hold: an upload whose id no process kept (its
// answer was lost, or the process stopped or died between the upload and
// the create's answer) is a file no batch of the run reads. Each is found
// by its name, its record's prefix (made for that record alone, so a file
// of another run or a colleague is never taken), among the org's files
// uploaded since the earliest such record. A failure is logged and counted
// (FilesLeft); the next start looks again.
func (r *Route) sweep(ctx context.Context) {
	if !slices.ContainsFunc(r.orgs, func(o *orgState) bool { return o.openai }) {
		return
	}
	recs, err := r.cfg.Store.Batches(ctx)
	if err != nil {
		r.log.Warn("reading the run's batches to delete the input files left", "error", err.Error())
		return
	}
	for _, o := range r.orgs {
		if !o.openai {
			continue
		}
		left := map[string]store.BatchRecord{}
		var since time.Time
		for _, b := range recs {
			if b.Org != o.Name || b.Status != store.BatchAbandoned || b.Prefix == "" {
				continue
			}
			left[b.Prefix+".jsonl"] = b
			if since.IsZero() || b.CreatedAt.Before(since) {
				since = b.CreatedAt
			}
		}
		if len(left) == 0 {
			continue
		}
		var found []string
		err := o.cl.uploads(ctx, since.Add(-listSkew), func(name, id string) bool {
			if _, ok := left[name]; ok {
				found = append(found, name, id)
			}
			return true
		})
		if err != nil {
			r.log.Warn("listing an org's files to delete the input files left", "org", o.Name, "error", org.Scrub(err.Error()))
			continue
		}
		for i := 0; i < len(found); i += 2 {
			b := &rec{BatchRecord: left[found[i]], org: o}
			r.discard(ctx, b, found[i+1])
		}
	}
}

// abandon records that b's create made no batch and frees its items.
func (r *Route) abandon(ctx context.Context, b *rec, why string) error {
	// A create refused for certain released its reservation already; one
	// whose batch was not found may yet be billed somewhere: its worst
	// case stays counted.
	b.hold.Keep()
	b.Status, b.Note = store.BatchAbandoned, why
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording batch %d as abandoned: %w", b.Local, err)
	}
	r.res.Abandoned++
	r.emit(fmt.Sprintf("batch %d (org %s, %d requests) abandoned: %s; its items are free again", b.Local, b.Org, b.N, why), recData(&b.BatchRecord))
	return r.release(ctx, b)
}

// anyTakeable reports whether a pending item the route would carry is in
// no open batch.
func (r *Route) anyTakeable(ctx context.Context) bool {
	if r.closedSub {
		return false
	}
	found := false
	err := store.EachPending(ctx, r.cfg.Store, func(it store.Item) bool {
		found = r.takes(it)
		return !found
	})
	return err == nil && found
}

// unserved says why pending items the route would carry are left (every
// org of their provider can no longer create batches), or "".
func (r *Route) unserved(ctx context.Context) string {
	var left *store.Item
	err := store.EachPending(ctx, r.cfg.Store, func(it store.Item) bool {
		if !r.Holds(it.Seq) && (r.cfg.Take == nil || r.cfg.Take(it)) && !r.serves(it) {
			left = &it
		}
		return left == nil
	})
	if err != nil || left == nil {
		return ""
	}
	s := ""
	for _, o := range r.orgs {
		if o.serves(*left) && o.disabled != "" {
			if s != "" {
				s += "; "
			}
			s += o.Name + ": " + o.disabled
		}
	}
	if s == "" {
		s = "none is configured"
	}
	return fmt.Sprintf("no org of line %d's provider can create batches (%s)", left.Line, s)
}

// ahead is the requests of b's org's open batches made before b and not
// seen ended: the API processes an org's batches one after another.
func (r *Route) ahead(b *rec) int64 {
	var q int64
	for _, o := range r.recs {
		if o.org == b.org && o.Local < b.Local && o.Status.Open() && !o.ended {
			q += o.N
		}
	}
	return q
}

// openOn is how many of the route's batches are open on org o.
func (r *Route) openOn(o *orgState) int {
	n := 0
	for _, b := range r.recs {
		if b.org == o && b.Status.Open() {
			n++
		}
	}
	return n
}

// queued is what the route has in org o's processing queue: the requests
// of its open batches not seen ended.
func (r *Route) queued(o *orgState) int64 {
	var q int64
	for _, b := range r.recs {
		if b.org == o && b.Status.Open() && !b.ended {
			q += b.N
		}
	}
	return q
}

// queuedTokens is what the route has in OpenAI org o's queue of model:
// the prompt tokens of its open batches of the model not seen ended.
func (r *Route) queuedTokens(o *orgState, model string) int64 {
	var q int64
	for _, b := range r.recs {
		if b.org == o && b.model == model && b.Status.Open() && !b.ended {
			q += b.tokens
		}
	}
	return q
}

// tokCapOf is the enqueued tokens the route places in OpenAI org o's
// queue of model.
func (r *Route) tokCapOf(o *orgState, model string) int64 {
	c := int64(DefaultQueueTokens)
	if v, ok := r.cfg.QueueTokens[o.Name]; ok && v > 0 {
		c = v
	}
	c = int64(float64(c) * queueShare)
	if s := o.tokSeen[model]; s > 0 {
		c = min(c, s)
	}
	return c
}

func (r *Route) capOf(o *orgState) int64 {
	c := int64(DefaultQueueCap)
	if v, ok := r.cfg.QueueCap[o.Name]; ok && v > 0 {
		c = v
	}
	if o.capSeen > 0 {
		c = min(c, o.capSeen)
	}
	return c
}
