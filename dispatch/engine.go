// Package dispatch is the engine of apidispatch: it completes every request of
// a Message Batches request file against the Messages API, fanning out over
// several organisations' keys with one polite lane per (org, model pool),
// losing and duplicating nothing, and counting every cent.
//
// A run is resumable: its state lives in a store (see package store) and
// results.jsonl is only appended after a result is durable there. Run the
// same input against the same store again and only unfinished items are sent.
package dispatch

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/promptcache"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// Errors callers can branch on.
var (
	// ErrIncomplete: the run stopped before every item ended (signal,
	// deadline, --max-cost, or no usable lane). It is resumable.
	ErrIncomplete = errors.New("dispatch: run incomplete")
)

// Config is everything a run needs. Zero fields take the defaults noted.
type Config struct {
	Orgs    []org.Org
	BaseURL string // default https://api.anthropic.com
	// Caps are polite per-key concurrency caps by model family ("sonnet",
	// "haiku", "opus", "other"); missing families take upstream.DefaultCaps.
	Caps map[string]int
	// Speed is the server's time compression (the simulator's K); 1 for the
	// real API. The controller's time constants are divided by it.
	Speed  float64
	Store  store.Store
	Body   rundir.BodyReader
	Prices *cost.Table
	// ResultsPath is results.jsonl; EventsPath events.jsonl (optional).
	ResultsPath string
	// Sink, when set, is the run's results writer, shared with the batch
	// route (the engine then neither opens nor closes it); otherwise the
	// engine opens ResultsPath itself.
	Sink *rundir.Sink
	// Skip, when set, leaves out the pending items it returns true for
	// (those an open batch holds).
	Skip func(seq int64) bool
	// JournalDir, when set, holds the attempt journal (the run directory):
	// a run that starts there after one that died counts the requests the
	// dead one may have had billed without recording them (in flight, or
	// answered but not yet durable) in possible_duplicate_billing. One
	// engine at a time per directory (OpenJob locks the run directory).
	JournalDir string
	Events     *rundir.EventLog
	// MaxCost stops admission when spent plus the worst case of in-flight
	// requests would pass it (0: no cap). It covers the whole run directory.
	// Without Spend, Run makes the gate that keeps it (seeded with what the
	// store says was spent).
	MaxCost cost.Nanos
	// Spend, when set, is the run's one spend gate, shared with every other
	// route and engine of the run (the batch route, auto's later engines, a
	// pilot): each request reserves its worst case there before it is sent
	// and settles it from usage. Its cap is the run's --max-cost, and
	// MaxCost is then not read.
	Spend *spend.Gate
	// WorstEvery prices every item's worst case even when no gate has a
	// cap, so that an attempt that may have been billed without an answer
	// is counted at it (possible_duplicate_billing_nanos): for a caller
	// that bills from the store what the API may have billed (the
	// gateway's batches). Without it only a capped run prices them.
	WorstEvery bool
	// MaxSeq, when positive, limits this Run to items 1..MaxSeq of the input
	// (a pilot); the rest stay pending for a later Run.
	MaxSeq int64
	// Deadline stops admission at this time (zero: none).
	Deadline time.Time
	// Timeout bounds one attempt (default 10 min of server time).
	Timeout time.Duration
	// Grace is how long in-flight requests may finish after a stop (default 30 s).
	Grace time.Duration
	// GiveUpAfter stops admission when requests have kept failing to
	// connect and none has reached the API for this long (a wrong base
	// URL, the network down): the run ends incomplete and resumable, with
	// nothing lost. Zero means DefaultGiveUpAfter; negative never gives
	// up. It is wall time, not divided by Speed.
	GiveUpAfter time.Duration
	// Client overrides the HTTP client (default: a tuned transport).
	Client *http.Client
	// WrapTransport, when set, wraps the client's transport (the default
	// one or Client's); 'run --debug-http' uses it to write the headers of
	// every exchange.
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// Lane tunes every lane's controller (Org, Pool, Cap and Speed are set
	// per lane).
	Lane gate.LaneConfig
	// NewGate makes a lane's gate (default: NewLane, in-process) when the
	// engine makes its own lanes. A shared implementation lets several
	// processes keep one budget per key.
	NewGate func(gate.LaneConfig) gate.Gate
	// Lanes, when set, are the lanes the engine sends through, shared with
	// their owner (the gateway's, for its batches: one cap per key for its
	// single requests and its batches' items), under the owner's
	// same-organisation rule, which the owner feeds. Nil: the engine makes
	// its own of Orgs, Lane and NewGate, and learns each key's
	// organisation itself.
	Lanes *upstream.Lanes
	Log   *slog.Logger
	// SampleEvery is the period of "sample" events for the report (default 1 s; <0 disables).
	SampleEvery time.Duration
	// Cache, when set, answers requests it holds without sending them and
	// stores every success (as CacheMode says; "" is readwrite); items with
	// the same canonical request inside the input are sent once. A sampled
	// request (temperature above 0 or absent: the API's default is 1.0)
	// is neither looked up, stored nor shared unless CacheSampled.
	Cache        *cache.Cache
	CacheMode    cache.Mode
	CacheSampled bool
	// PromptCaches is where the API's prompt caches are warm, for
	// cache-affine placement (affinity.go): engines sending through the
	// same orgs (the gateway's) share one. Nil: the engine's own.
	PromptCaches *promptcache.Places
}

// DefaultGiveUpAfter is Config.GiveUpAfter's default.
const DefaultGiveUpAfter = 10 * time.Minute

// CapFor returns the cap for model's family (upstream.CapFor of Caps).
func (c *Config) CapFor(model string) int { return upstream.CapFor(c.Caps, model) }

// capOf returns the cap of model, of provider p, from Caps.
func (c *Config) capOf(p *upstream.Provider, model string) int { return p.CapFor(c.Caps, model) }

// NewTransport returns the tuned transport the engine uses: enough idle
// connections for every in-flight request, TLS verification always on. It
// is apihttp.NewTransport.
func NewTransport(maxConns int) *http.Transport { return apihttp.NewTransport(maxConns) }

// laneRef is one lane's gate with its org.
type laneRef struct {
	gate.Gate
	cap  int
	org  *orgState
	pool anthropic.Pool
	key  string // lane key "org/pool"
	// attempts and rateLimited count this invocation's attempts through
	// the lane and the 429s among them.
	attempts, rateLimited atomic.Int64
}

// Snapshot is the gate's snapshot with the lane's attempts and 429s.
func (l *laneRef) Snapshot(now time.Time) gate.LaneSnapshot {
	s := l.Gate.Snapshot(now)
	s.Attempts, s.RateLimited429 = l.attempts.Load(), l.rateLimited.Load()
	if s.Attempts > 0 {
		s.Rate429 = float64(s.RateLimited429) / float64(s.Attempts)
	}
	return s
}

type orgState struct {
	org.Org
	disabled  string
	completed atomic.Int64 // outcomes handed to the committer
}

// work is one item while the engine holds it in memory.
type work struct {
	it        store.Item
	prov      *upstream.Provider // the item's API
	pool      anthropic.Pool
	attempts  int64
	transient int // consecutive transient failures (for back-off)
	notBefore time.Time
	heapIdx   int
	key       cache.Key // the canonical request's key, when keyed
	keyed     bool
	sending   bool       // an attempt is in flight
	worst     cost.Nanos // the most it can cost (fed.worst)
	// pre is the prompt-cache prefix the item marks, when hasPre.
	pre    promptcache.Prefix
	hasPre bool
}

type attempt struct {
	w       *work
	lane    *laneRef
	permit  gate.Permit
	outcome anthropic.Outcome
	latency time.Duration
	body    []byte
	reqID   string
	costN   cost.Nanos
	res     *spend.Reservation // its worst case, in the spend gate
	// usage is a success's usage (hasUsage), as its provider reported it.
	usage    upstream.Usage
	hasUsage bool
	readErr  error
	orgIDHdr string
	// maybeBilled: the request was sent and may have been processed, but
	// no usable answer came back.
	maybeBilled bool
	// reached: the request reached the API (it was written whole, or an
	// answer came back).
	reached bool
	// simulated: the answer came from apidispatch's simulator (cache.go).
	simulated bool
	// fenced: the permit's lease had ended when the request was about to
	// go out, so it was not sent (see Permit.Until).
	fenced bool
}

// Engine runs one dispatch. Use New, then Run once.
type Engine struct {
	cfg    Config
	base   *url.URL
	client *http.Client
	log    *slog.Logger

	orgs   []*orgState
	lanes  map[anthropic.Pool][]*laneRef
	up     *upstream.Lanes     // the lanes' gates (Config.Lanes or the engine's own)
	places *promptcache.Places // where prompt caches are warm
	// sameOrg: two keys of one organisation hold one cap between them.
	sameOrg *upstream.Orgs
	// discoverCtx (set by sendAll) bounds the discovery of the keys'
	// organisations, started with the first lanes (discovering) when the
	// engine owns sameOrg; learnt is set when it learns one, for the
	// scheduler to apply (noteSameOrg).
	discoverCtx context.Context
	discovering bool
	learnt      atomic.Bool
	// laneList is every lane, for readers on other goroutines.
	lanesMu  sync.Mutex
	laneList []*laneRef

	// scheduler-owned state
	ready   map[anthropic.Pool][]*work
	nready  int
	delayed delayHeap
	held    int // items in memory (ready+delayed+in flight+followers)
	// leaders are the keyed items being sent (queued, delayed or in
	// flight), one per key; followers the items of the same key waiting
	// for its answer.
	leaders   map[cache.Key]*work
	followers map[cache.Key][]*work
	// claims holds, in the cache file, the keys this run sends, against
	// the other processes on it (readwrite; during sendAll).
	claims *cache.Claimer
	// noOrgs says why items of a provider without orgs wait (enqueue):
	// they stay pending, and the run ends with it once nothing else can go.
	noOrgs string

	inflight    int
	inflightPub atomic.Int64
	gate        *spend.Gate     // the run's spend gate (Config.Spend, or this Run's own)
	costWait    <-chan struct{} // the gate's Changed while admission waits for room another route holds
	costErr     error           // the spend gate's refusal, when it is the stop reason
	results     chan *attempt
	wake        chan struct{}
	stopReason  string
	costStop    bool
	// lastReached is when an attempt last reached the API (zero: none
	// has yet); unreachable is set once GiveUpAfter has passed since then
	// (or since Run started) with attempts failing to connect.
	lastReached time.Time
	unreachable string
	warnedDown  bool // the "cannot reach the API" warning is out
	abortCtx    context.Context
	abortCancel context.CancelFunc

	// counters (atomic: read by progress while the run goes on)
	c counters
	// jr is this run's attempt journal (nil without Config.JournalDir).
	jr *rundir.Journal

	start time.Time
	// progress is what Progress needs of start, total and doneStart,
	// published once restore has set them: Progress may be called from
	// another goroutine before Run has begun (nil until then).
	progress  atomic.Pointer[progressBase]
	total     int64 // N
	doneStart int64 // terminal at start
}

type counters struct {
	attempts, rateLimited, overloaded, otherRetries atomic.Int64
	// maybeBilled counts attempts the server may have billed although no
	// result came back (a connection lost after sending, a truncated 2xx):
	// their retry can bill the same request twice.
	maybeBilled                                     atomic.Int64
	maybeBilledN                                    atomic.Int64 // their worst cases (nano-USD), under --max-cost
	succeeded, errored                              atomic.Int64 // this run, committed
	costN                                           atomic.Int64 // this run, committed
	cacheDamaged, cachePutFailed                    atomic.Int64 // damaged cache entries seen; entries not written
	cacheElsewhere                                  elsewhere    // cache entries of other origins (cached.go)
	cacheHits, cacheSaved                           atomic.Int64 // this run, committed
	lastAttempts, lastRL, lastOL, lastOther, lastMB int64        // flushed to the store
	lastMBN                                         int64
}

// New checks cfg and returns an engine.
func New(cfg Config) (*Engine, error) {
	if len(cfg.Orgs) == 0 {
		return nil, org.ErrNoOrgs
	}
	if cfg.Store == nil || cfg.Body == nil || cfg.Prices == nil || cfg.ResultsPath == "" {
		return nil, errors.New("dispatch: Config needs Store, Body, Prices and ResultsPath")
	}
	base, err := apihttp.ResolveBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Duration(float64(10*time.Minute) / cfg.Speed)
	}
	if cfg.Grace == 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.GiveUpAfter == 0 {
		cfg.GiveUpAfter = DefaultGiveUpAfter
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.CacheMode == "" {
		cfg.CacheMode = cache.ModeReadWrite
	}
	e := &Engine{cfg: cfg, base: base, log: cfg.Log, lanes: map[anthropic.Pool][]*laneRef{}, ready: map[anthropic.Pool][]*work{},
		leaders: map[cache.Key]*work{}, followers: map[cache.Key][]*work{}}
	// Every client refuses redirects: no key leaves for another host.
	e.client = apihttp.Guard(cfg.Client)
	if e.client == nil {
		conns := 0
		for _, c := range upstream.DefaultCaps {
			conns += c
		}
		for _, c := range cfg.Caps {
			conns += c
		}
		e.client = apihttp.NewClient(nil, max(256, conns*len(cfg.Orgs)), 0)
	}
	if cfg.WrapTransport != nil {
		c := *e.client
		c.Transport = cfg.WrapTransport(c.Transport)
		e.client = &c
	}
	for _, o := range cfg.Orgs {
		e.orgs = append(e.orgs, &orgState{Org: o})
	}
	if cfg.Lanes != nil {
		has := map[string]bool{}
		for _, o := range cfg.Lanes.Orgs() {
			has[o.Name] = true
		}
		for _, o := range cfg.Orgs {
			if !has[o.Name] {
				return nil, fmt.Errorf("dispatch: Config.Lanes has no lane for org %q", o.Name)
			}
		}
	}
	if e.up = cfg.Lanes; e.up == nil {
		e.up = upstream.NewLanes(upstream.LanesConfig{Orgs: cfg.Orgs, Lane: cfg.Lane, Speed: cfg.Speed, NewGate: cfg.NewGate})
	}
	e.sameOrg = e.up.SameOrg()
	if e.places = cfg.PromptCaches; e.places == nil {
		e.places = promptcache.NewPlaces(cfg.Speed)
	}
	return e, nil
}

// lanesFor returns (creating on first use) the lanes of a pool, one per org.
// The lanes of a pool are those of the orgs of its provider (p).
func (e *Engine) lanesFor(pool anthropic.Pool, model string, p *upstream.Provider) []*laneRef {
	if ls, ok := e.lanes[pool]; ok {
		return ls
	}
	var ls []*laneRef
	byOrg := map[string]*upstream.Lane{}
	for _, u := range e.up.Pool(pool, e.cfg.capOf(p, model)) {
		byOrg[u.Org] = u
	}
	for _, o := range e.orgs {
		u := byOrg[o.Name] // New checked that Config.Lanes has every org
		if u == nil {
			continue // an org of another provider
		}
		// Every lane probes first (see LaneConfig.ProbeFirst), whoever
		// makes its gate: the shared gate, the metrics wrapper's lane.
		l := &laneRef{Gate: u, cap: u.Cap, org: o, pool: pool, key: o.Name + "/" + string(pool)}
		if o.disabled != "" {
			l.Disable(o.disabled)
		}
		ls = append(ls, l)
	}
	e.lanes[pool] = ls
	if !e.discovering && e.discoverCtx != nil && e.cfg.Lanes == nil {
		// The first work to send: learn each key's organisation from a
		// request of its own, beside the lanes' first messages (an org
		// rule that is not the engine's is its owner's to feed).
		e.discovering = true
		e.sameOrg.Discover(e.discoverCtx, upstream.Discovery{Client: e.client, Base: e.base.String(),
			Orgs: e.cfg.Orgs, Timeout: min(e.cfg.Timeout, upstream.DiscoverTimeout), Speed: e.cfg.Speed})
	}
	e.lanesMu.Lock()
	e.laneList = append(slices.Clone(e.laneList), ls...)
	e.lanesMu.Unlock()
	return ls
}

func (e *Engine) lanesSnapshotSafe() []*laneRef {
	e.lanesMu.Lock()
	defer e.lanesMu.Unlock()
	return e.laneList
}

// emitSample writes a "sample" event: every lane's state and completions
// per org since the previous sample, for the report's time series.
func (e *Engine) emitSample(now, last time.Time, lastDone map[string]int64) {
	if e.cfg.Events == nil {
		return
	}
	lanes := e.lanesSnapshotSafe()
	snaps := make([]gate.LaneSnapshot, 0, len(lanes))
	for _, l := range lanes {
		snaps = append(snaps, l.Snapshot(now))
	}
	done := map[string]int64{}
	for _, o := range e.orgs {
		v := o.completed.Load()
		done[o.Name] = v - lastDone[o.Name]
		lastDone[o.Name] = v
	}
	e.cfg.Events.Emit(rundir.EventSample, "", map[string]any{
		"t_s": now.Sub(e.start).Seconds(), "dt_s": now.Sub(last).Seconds(),
		"completed_by_org": done, "lanes": snaps,
		"rate_limited_429": e.c.rateLimited.Load(), "retries": e.c.overloaded.Load() + e.c.otherRetries.Load(),
		"cost_usd": cost.Nanos(e.c.costN.Load()).USD(), "in_flight": e.inflightPub.Load(),
	})
}

func (e *Engine) allLanes() []*laneRef {
	var out []*laneRef
	pools := make([]anthropic.Pool, 0, len(e.lanes))
	for p := range e.lanes {
		pools = append(pools, p)
	}
	slices.Sort(pools)
	for _, p := range pools {
		out = append(out, e.lanes[p]...)
	}
	return out
}

// Result is what Run returns.
type Result struct {
	Summary  *rundir.Summary
	Complete bool
	// StopReason says why an incomplete run stopped.
	StopReason string
	// Stopped: a stop condition ended it (a signal, the deadline,
	// --max-cost, no usable lane, the API unreachable, a failed write),
	// not the end of the items it was given (a pilot, Skip).
	Stopped bool
}

// Run sends every unfinished item. Cancelling ctx stops admission; requests
// in flight get Config.Grace to finish before they are abandoned (their
// items stay pending). Abort abandons them at once. Run returns ErrIncomplete
// (wrapped, with the reason) when it stopped early; the store is consistent
// either way.
//
// Its steps: restore the run's state (counts, the journal of a process that
// died, the spend gate, the results sink), open the committer, sendAll (the
// feeder and the admission loop, until both end and every request's
// outcome is committed), close what the run wrote, and finish (the
// summary, the last event and the result).
func (e *Engine) Run(ctx context.Context) (*Result, error) {
	e.start = time.Now()
	e.abortCtx, e.abortCancel = context.WithCancel(context.Background())
	defer e.abortCancel()
	sink, closeSink, err := e.restore(ctx)
	if err != nil {
		return nil, err
	}
	com, err := e.openCommitter(sink)
	if err != nil {
		closeSink()
		return nil, err
	}
	runErr := e.sendAll(ctx, com)
	runErr = e.closeWrites(runErr, com, closeSink)
	return e.finish(ctx, runErr)
}

// restore reads where the run stands: the item count and what is done,
// replays the attempt journal of a process that died, seeds the spend
// gate, opens the results sink (unless Config.Sink is the run's) and
// emits the started event. closeSink closes the sink when restore opened
// it.
func (e *Engine) restore(ctx context.Context) (sink *rundir.Sink, closeSink func() error, err error) {
	st := e.cfg.Store
	meta, err := st.Meta(ctx)
	if err != nil {
		return nil, nil, err
	}
	e.total = meta.N
	agg, err := st.Aggregate(ctx)
	if err != nil {
		return nil, nil, err
	}
	var replayedN cost.Nanos
	if e.cfg.JournalDir != "" {
		// A journal left by a process that died says what it may have had
		// billed that the store never recorded (the runner replays it
		// before it seeds the run's spend gate; an engine run alone does
		// it here). The replay only adds counters, which nothing below
		// reads: agg stays valid.
		if replayedN, err = rundir.Replay(ctx, e.cfg.JournalDir, st, agg.Counters, e.cfg.Events, e.log); err != nil {
			return nil, nil, err
		}
	}
	e.doneStart = agg.Succeeded + agg.Errored
	e.progress.Store(&progressBase{start: e.start, total: e.total, doneStart: e.doneStart})
	if e.gate = e.cfg.Spend; e.gate == nil {
		e.gate = spend.New("--max-cost", e.cfg.MaxCost, rundir.SpentBefore(agg))
	}
	if replayedN > 0 {
		// What the dead process may have had billed: counted for good, as
		// it would have been had it lived (agg, and a gate seeded before
		// this replay, do not hold it).
		e.gate.Hold(replayedN).Keep()
	}
	sink = e.cfg.Sink
	if sink == nil {
		if sink, err = rundir.OpenSink(ctx, e.cfg.ResultsPath, st); err != nil {
			return nil, nil, err
		}
		if sink.Rebuilt > 0 {
			e.cfg.Events.Emit(rundir.EventWarning, fmt.Sprintf("results file was %d lines short of the run's state; rebuilt them", sink.Rebuilt), map[string]any{"rebuilt": sink.Rebuilt})
		}
	}
	closeSink = func() error {
		if e.cfg.Sink == nil {
			return sink.Close()
		}
		return nil
	}
	var orgNames []map[string]string
	for _, o := range e.orgs {
		orgNames = append(orgNames, map[string]string{"org": o.Name, "key": o.Key.Fingerprint()})
	}
	e.cfg.Events.Emit(rundir.EventStarted, fmt.Sprintf("%d items, %d already done, %d orgs", e.total, e.doneStart, len(e.orgs)),
		map[string]any{"n": e.total, "done": e.doneStart, "orgs": orgNames, "base_url": e.base.Redacted(), "speed": e.cfg.Speed})
	return sink, closeSink, nil
}

// openCommitter opens the attempt journal (with Config.JournalDir) and
// makes the committer, which makes outcomes durable, then appends their
// lines to sink.
func (e *Engine) openCommitter(sink *rundir.Sink) (*committer, error) {
	e.results = make(chan *attempt, 1024)
	e.wake = make(chan struct{}, 1)
	if e.cfg.JournalDir != "" {
		var err error
		if e.jr, err = rundir.OpenJournal(e.cfg.JournalDir); err != nil {
			return nil, err
		}
	}
	com := newCommitter(sink, &e.c, e.cfg.Events)
	if e.caching() && e.cfg.CacheMode.Writes() {
		com.cache = e.cfg.Cache
	}
	if e.jr != nil {
		com.journalKey = e.jr.Key()
	}
	return com, nil
}

// sendAll runs the committer and the feeder, and the admission loop over
// what the feeder streams until it ends; then it stops the feeder, waits
// for every request's worker and drains the committer. When sendAll returns
// no goroutine it started is left and every outcome is committed (or
// com.err says why not).
func (e *Engine) sendAll(ctx context.Context, com *committer) error {
	var comDone sync.WaitGroup
	comDone.Go(com.run)
	if e.caching() && e.cfg.CacheMode.Reads() && e.cfg.CacheMode.Writes() {
		if e.cfg.JournalDir != "" {
			// The run directory's own claims, left by a pass that was
			// killed, are taken over at once: one process holds it.
			e.claims = e.cfg.Cache.NewClaimerAs(cache.RunOwner(e.cfg.JournalDir), 0)
		} else {
			e.claims = e.cfg.Cache.NewClaimer(0)
		}
		defer func() {
			if err := e.claims.Close(); err != nil {
				e.log.Warn("releasing the result cache's claims (they lapse after their lease)", "error", err)
			}
		}()
	}
	var stopDiscover context.CancelFunc
	e.discoverCtx, stopDiscover = context.WithCancel(ctx)
	defer stopDiscover()
	// Any release on the lanes (the owner's too, when they are shared)
	// and any gate's own wake-up may let the scheduler admit.
	defer e.up.Subscribe(e.signal)()
	defer e.sameOrg.OnLearn(func() {
		e.learnt.Store(true)
		e.signal()
	})()
	f := e.startFeeder(ctx, com)
	var workers sync.WaitGroup
	runErr := e.schedule(ctx, f.out, com, &workers)
	feedErr := f.stop()
	workers.Wait()
	com.close()
	comDone.Wait()
	if feedErr != nil && runErr == nil {
		runErr = fmt.Errorf("reading pending items: %w", feedErr)
	}
	return runErr
}

// closeWrites closes what the run wrote (the sink when the engine opened
// it, then the journal, emptied only when every outcome and counter is
// durable) and returns the run's error: runErr, else the committer's,
// else a close's.
func (e *Engine) closeWrites(runErr error, com *committer, closeSink func() error) error {
	if com.err != nil && runErr == nil {
		runErr = fmt.Errorf("the run's state could not be written, so the run stopped; nothing unwritten is marked done, and the same command resumes once there is room: %w", com.err)
	}
	closeErr := closeSink()
	// Every attempt has ended; once every outcome and counter is durable
	// the journal has nothing left to say.
	if err := e.jr.Close(com.err == nil); err != nil && closeErr == nil {
		closeErr = err
	}
	if runErr == nil && closeErr != nil {
		runErr = closeErr
	}
	return runErr
}

// finish sums the run, emits its last event (failure, incomplete,
// progress or completed) and returns its result.
func (e *Engine) finish(ctx context.Context, runErr error) (*Result, error) {
	sum, serr := e.summarize(context.WithoutCancel(ctx))
	if serr != nil && runErr == nil {
		runErr = serr
	}
	res := &Result{Summary: sum, StopReason: e.stopReason, Stopped: e.stopReason != ""}
	if runErr != nil {
		e.cfg.Events.Emit(rundir.EventFailure, runErr.Error(), nil)
		return res, runErr
	}
	res.Complete = sum != nil && sum.Unfinished == 0
	if !res.Complete {
		if res.StopReason == "" && e.cfg.MaxSeq > 0 {
			res.StopReason = fmt.Sprintf("pilot of the first %d items done", e.cfg.MaxSeq)
		}
		if res.StopReason == "" {
			res.StopReason = "stopped"
		}
		kind := rundir.EventIncomplete
		if !res.Stopped && (e.cfg.MaxSeq > 0 || e.cfg.Skip != nil) {
			// It did what it was given (a pilot, a route's share); the
			// run goes on.
			kind = rundir.EventProgress
		}
		e.cfg.Events.Emit(kind, res.StopReason, sum)
		if e.costErr != nil {
			// Callers tell a --max-cost stop by spend.ErrCapReached.
			return res, fmt.Errorf("%w: %w", ErrIncomplete, e.costErr)
		}
		return res, fmt.Errorf("%w: %s", ErrIncomplete, res.StopReason)
	}
	e.cfg.Events.Emit(rundir.EventCompleted, fmt.Sprintf("%d succeeded, %d errored", sum.Succeeded, sum.Errored), sum)
	return res, nil
}

// feeder streams a run's pending items to the admission loop, in input
// order and keyed (items the cache answers are committed on the way, not
// fed). Start it with startFeeder; stop waits for its goroutine.
type feeder struct {
	out    chan []fed
	cancel context.CancelFunc
	done   sync.WaitGroup
	err    error // written by the goroutine, read after done
}

// startFeeder starts the feeder on a goroutine it owns, until ctx ends,
// stop is called or every pending item was fed.
func (e *Engine) startFeeder(ctx context.Context, com *committer) *feeder {
	fctx, cancel := context.WithCancel(ctx)
	f := &feeder{out: make(chan []fed, 2), cancel: cancel}
	f.done.Go(func() {
		defer close(f.out)
		f.err = e.feed(fctx, com, f.out)
	})
	return f
}

// stop ends the feeder, drains what it had ready (its items stay pending
// in the store), waits for its goroutine and returns the error that ended
// it, if any.
func (f *feeder) stop() error {
	f.cancel()
	for range f.out {
	}
	f.done.Wait()
	return f.err
}

// feed sends the pending items (up to Config.MaxSeq, less those
// Config.Skip leaves out) to out in chunks, keyed, until every one was
// sent or ctx ends. A store error after ctx ended is no error.
func (e *Engine) feed(ctx context.Context, com *committer, out chan<- []fed) error {
	var after int64
	// waiting are the items whose key another process is sending: fed
	// when it stores the answer (a hit) or lets the key go (claimed).
	var waiting []fed
	send := func(fs []fed) bool {
		if len(fs) == 0 {
			return true
		}
		select {
		case out <- fs:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// key keys a chunk and feeds its misses; false: stop feeding.
	key := func(items []store.Item) (bool, error) {
		fs, held, err := e.keyItems(ctx, e.skip(items), com)
		if err != nil {
			return false, err
		}
		waiting = append(waiting, held...)
		if len(waiting) > 0 && len(held) < len(waiting) {
			// Those that waited from earlier chunks, once per chunk.
			var ready []fed
			if ready, waiting, _, err = e.recheck(ctx, waiting, com); err != nil {
				return false, err
			}
			fs = append(fs, ready...)
		}
		return send(fs), nil
	}
	for {
		items, err := e.cfg.Store.Pending(ctx, after, 1024)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		last := false
		if e.cfg.MaxSeq > 0 {
			n := 0
			for n < len(items) && items[n].Seq <= e.cfg.MaxSeq {
				n++
			}
			if n < len(items) {
				items, last = items[:n], true
			}
		}
		if len(items) == 0 {
			break
		}
		after = items[len(items)-1].Seq
		more, err := key(items)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		if !more {
			return nil
		}
		if last {
			break
		}
	}
	return e.awaitOthers(ctx, waiting, com, send)
}

// Polling the cache file for the answers other processes are sending:
// from claimPollMin, doubling to claimPollMax, never past the end of the
// earliest of their claims.
const (
	claimPollMin = 10 * time.Millisecond
	claimPollMax = 250 * time.Millisecond
)

// awaitOthers feeds the waiting items as the other processes that hold
// their keys answer them or let them go, until none waits or ctx ends
// (the rest stay pending in the store). It runs on the feeder goroutine,
// after every pending item was keyed.
func (e *Engine) awaitOthers(ctx context.Context, waiting []fed, com *committer, send func([]fed) bool) error {
	poll := claimPollMin
	for len(waiting) > 0 {
		ready, rest, until, err := e.recheck(ctx, waiting, com)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		if len(rest) < len(waiting) {
			poll = claimPollMin // answers come: look again soon
		}
		waiting = rest
		if !send(ready) {
			return nil
		}
		if len(waiting) == 0 {
			break
		}
		t := time.NewTimer(max(min(poll, time.Until(until)+time.Millisecond), time.Millisecond))
		poll = min(2*poll, claimPollMax)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
	return nil
}

// skip drops the items Config.Skip leaves out, in place.
func (e *Engine) skip(items []store.Item) []store.Item {
	if e.cfg.Skip == nil {
		return items
	}
	return slices.DeleteFunc(items, func(it store.Item) bool { return e.cfg.Skip(it.Seq) })
}

// Abort abandons in-flight requests at once (a second signal).
func (e *Engine) Abort() {
	if e.abortCancel != nil {
		e.abortCancel()
	}
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// schedule is the admission loop. It owns the item queues.
func (e *Engine) schedule(ctx context.Context, feed chan []fed, com *committer, workers *sync.WaitGroup) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sample := time.NewTicker(max(e.cfg.SampleEvery, time.Millisecond))
	if e.cfg.SampleEvery < 0 {
		sample.Stop()
	}
	defer sample.Stop()
	lowWater := 0
	stopping := false
	var graceC <-chan time.Time
	feedDone := false
	var lastSample = time.Now()
	var lastDone = map[string]int64{}
	milestone := int64(0)
	for {
		now := time.Now()
		if e.learnt.Swap(false) {
			e.noteSameOrg()
		}
		if !stopping {
			if reason := e.stopCondition(ctx, now, com); reason != "" {
				stopping = true
				e.stopReason = reason
				e.dropQueued()
				if e.inflight > 0 {
					graceC = time.After(e.cfg.Grace)
				}
			}
		}
		next := time.Duration(math.MaxInt64)
		e.costWait = nil
		if !stopping {
			next = e.admit(now, workers)
		}
		if lowWater == 0 {
			lowWater = 512
		}
		for _, ls := range e.lanes {
			for _, l := range ls {
				lowWater = max(lowWater, 2*l.cap*len(ls))
			}
		}
		wantFeed := !stopping && !feedDone && e.nready < lowWater
		if (feedDone || stopping) && e.held == 0 && e.inflight == 0 {
			return nil
		}
		if !wantFeed && e.nready > 0 && e.inflight == 0 && next == time.Duration(math.MaxInt64) && !stopping && e.costWait == nil && !e.costStop {
			// Work, nothing in flight, and no lane will ever admit: every lane
			// of these pools is disabled.
			e.stopReason = "no usable lane: " + e.laneReasons()
			if e.noOrgs != "" {
				e.stopReason = e.noOrgs
			}
			stopping = true
			e.dropQueued()
			continue
		}
		if next != time.Duration(math.MaxInt64) {
			timer.Reset(max(next, 200*time.Microsecond))
		}
		var feedC chan []fed
		if wantFeed {
			feedC = feed
		}
		select {
		case <-e.wake:
		case <-e.costWait:
		case <-timer.C:
		case <-ctx.Done():
		case <-graceC:
			e.Abort()
		case items, ok := <-feedC:
			if !ok {
				feedDone = true
				continue
			}
			for _, f := range items {
				e.enqueue(f)
			}
		case a := <-e.results:
			e.handle(a, com, stopping)
			// Drain whatever else is ready without re-running admission each time.
			for more := true; more; {
				select {
				case a := <-e.results:
					e.handle(a, com, stopping)
				default:
					more = false
				}
			}
		case t := <-sample.C:
			e.emitSample(t, lastSample, lastDone)
			lastSample = t
			done := e.c.succeeded.Load() + e.c.errored.Load() + e.doneStart
			if e.total > 0 {
				m := done * 10 / e.total
				if m > milestone {
					milestone = m
					e.cfg.Events.Emit(rundir.EventProgress, fmt.Sprintf("%d%% done", m*10), e.Progress())
				}
			}
		}
	}
}

// stopCondition returns why admission must stop now, or "".
func (e *Engine) stopCondition(ctx context.Context, now time.Time, com *committer) string {
	switch {
	case ctx.Err() != nil:
		return "stopped by signal"
	case !e.cfg.Deadline.IsZero() && now.After(e.cfg.Deadline):
		return "deadline reached"
	case com.failed.Load():
		return "the run's state could not be written"
	case e.costStop:
		return e.stopReason
	case e.unreachable != "":
		return e.unreachable
	}
	return ""
}

// downWarnAfter is how long attempts must have failed to connect, once
// one has reached the API, before noteReach warns: a lone failure (a stale
// keep-alive connection) is not news.
const downWarnAfter = 10 * time.Second

// noteReach keeps track of whether attempts reach the API: a warning when
// the first attempts of a run fail to connect, or when none has reached it
// for downWarnAfter, a note when it answers again, and a stop once
// GiveUpAfter has passed without any attempt reaching it.
func (e *Engine) noteReach(now time.Time, a *attempt) {
	since := e.lastReached
	if since.IsZero() {
		since = e.start
	}
	if a.reached {
		if e.warnedDown {
			e.log.Info("the API answers again", "after", now.Sub(since).Round(time.Second))
		}
		e.lastReached, e.warnedDown = now, false
		return
	}
	if a.outcome.ErrorType != anthropic.ErrTypeConnection {
		return
	}
	if !e.warnedDown && (e.lastReached.IsZero() || now.Sub(since) >= downWarnAfter) {
		e.warnedDown = true
		e.log.Warn("cannot reach the API; retrying", "base_url", e.base.Redacted(), "error", a.outcome.Reason)
		e.cfg.Events.Emit(rundir.EventWarning, "cannot reach the API: "+a.outcome.Reason, map[string]any{"base_url": e.base.Redacted()})
	}
	if d := e.cfg.GiveUpAfter; d > 0 && e.unreachable == "" && now.Sub(since) >= d {
		e.unreachable = fmt.Sprintf("no request reached %s for %s (last error: %s)", e.base.Redacted(), d, a.outcome.Reason)
	}
}

// dropQueued forgets queued items (they stay pending in the store).
func (e *Engine) dropQueued() {
	for p, q := range e.ready {
		e.held -= len(q)
		e.ready[p] = nil
	}
	e.nready = 0
	e.held -= len(e.delayed)
	e.delayed = e.delayed[:0]
	e.dropFollowers()
}

func (e *Engine) laneReasons() string {
	var b bytes.Buffer
	for _, l := range e.allLanes() {
		if r := l.Disabled(); r != "" {
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s: %s", l.key, r)
		}
	}
	return b.String()
}

// admit starts every request that can start now and returns how long until
// something might change without an event.
func (e *Engine) admit(now time.Time, workers *sync.WaitGroup) time.Duration {
	// Due retries go to the front of their pool's queue.
	for len(e.delayed) > 0 && !e.delayed[0].notBefore.After(now) {
		w := heap.Pop(&e.delayed).(*work)
		e.ready[w.pool] = append([]*work{w}, e.ready[w.pool]...)
		e.nready++
	}
	next := time.Duration(math.MaxInt64)
	if len(e.delayed) > 0 {
		next = e.delayed[0].notBefore.Sub(now)
	}
	for pool, q := range e.ready {
		if len(q) == 0 {
			continue
		}
		lanes := e.lanes[pool]
		// Prefer the lane with the most free slots (relative to its limit).
		order := slices.Clone(lanes)
		slices.SortStableFunc(order, func(a, b *laneRef) int {
			sa, sb := a.Snapshot(now), b.Snapshot(now)
			return cmp.Compare(float64(sb.InFlight)/max(sb.Limit, 1), float64(sa.InFlight)/max(sa.Limit, 1)) * -1
		})
		if anyPrefixed(q) {
			rest, stop := e.admitPlaced(now, q, order, workers, &next)
			e.ready[pool] = rest
			if stop {
				return next
			}
			continue
		}
		blocked := make([]bool, len(order))
		for len(q) > 0 {
			progressed := false
			for i, l := range order {
				if blocked[i] || len(q) == 0 {
					continue
				}
				w := q[0]
				res, err := e.reserve(w)
				if err != nil {
					e.ready[pool] = q
					return next
				}
				p, wait, ok := l.TryAdmit(now, w.prov.Demand(upItem(w.it)))
				if !ok {
					res.Release()
					blocked[i] = true
					if wait > 0 {
						next = min(next, wait)
					}
					continue
				}
				q = q[1:]
				e.nready--
				e.start1(w, l, p, res, workers)
				progressed = true
			}
			if !progressed {
				break
			}
		}
		e.ready[pool] = q
	}
	return next
}

// reserve reserves w's worst case in the spend gate. When the cap has no
// room for it, admission waits: for this engine's requests in flight, or
// for the gate's room (costWait) while another route holds some of it
// (open batches, another engine); with nothing held anywhere, nothing
// will free room, and the run stops.
func (e *Engine) reserve(w *work) (*spend.Reservation, error) {
	worst := w.worst // 0 without a cap
	res, err := e.gate.Reserve(worst)
	if err == nil {
		return res, nil
	}
	// Take the channel before looking again, so no release is missed.
	ch := e.gate.Changed()
	if res, err = e.gate.Reserve(worst); err == nil {
		return res, nil
	}
	switch {
	case e.inflight > 0:
	case e.gate.Open() > 0:
		e.costWait = ch
	default:
		e.stopReasonCost(err)
	}
	return nil, err
}

func (e *Engine) stopReasonCost(err error) {
	if e.stopReason == "" {
		e.stopReason, e.costErr = err.Error(), err
	}
	// Wake the loop so it notices via costStop.
	e.costStop = true
	e.signal()
}

// worstCase is the most item it can cost: cost.Table.WorstCase of the
// bound of its params (body; nil when they could not be read, which bounds
// it at every multiplier). It runs on the feeder goroutine, which reads the
// body.
func (e *Engine) worstCase(it store.Item, body []byte) cost.Nanos {
	n, err := upstream.Named(it.Provider).WorstCase(e.cfg.Prices, upItem(it), body, false)
	if err != nil {
		return cost.Unpriceable
	}
	return n
}

// upItem is what the upstream layer needs of it.
func upItem(it store.Item) upstream.Item {
	return upstream.Item{Model: it.Model, EstInput: it.EstInput, Length: it.Length, MaxTokens: it.MaxTokens, Choices: it.Choices}
}

func (e *Engine) start1(w *work, l *laneRef, p gate.Permit, res *spend.Reservation, workers *sync.WaitGroup) {
	e.inflight++
	e.inflightPub.Store(int64(e.inflight))
	w.sending = true
	w.attempts++
	e.c.attempts.Add(1)
	l.attempts.Add(1)
	a := &attempt{w: w, lane: l, permit: p, res: res}
	e.prefixSent(time.Now(), a)
	workers.Go(func() {
		e.send(a)
		e.results <- a
	})
}

// send performs one HTTP attempt and classifies it. It runs on its own goroutine.
func (e *Engine) send(a *attempt) {
	body, err := e.cfg.Body(a.w.it)
	if err != nil {
		a.readErr = err
		a.lane.Done(time.Now(), a.permit, gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable}})
		return
	}
	ctx, cancel := apihttp.AttemptContext(e.abortCtx, e.cfg.Timeout)
	defer cancel()
	prov := a.w.prov
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base.JoinPath(prov.Endpoint()).String(), bytes.NewReader(body))
	if err != nil {
		a.readErr = err
		a.lane.Done(time.Now(), a.permit, gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable}})
		return
	}
	prov.SetHeaders(req.Header, a.lane.org.Org, true)
	req.Header.Set("x-stainless-retry-count", strconv.FormatInt(a.w.attempts-1, 10))
	t0 := time.Now()
	if a.permit.Lapsed(t0) {
		// The process was paused (or starved of CPU) past the lease it
		// was admitted on: Redis may have given the slot away. Not sent.
		a.fenced = true
		a.outcome = anthropic.Outcome{Kind: anthropic.Retryable, Reason: "not sent: the shared lease ended before the request went out"}
		a.lane.Done(t0, a.permit, gate.Feedback{Outcome: a.outcome})
		return
	}
	r := prov.Send(e.client, req, 64<<20, func() {
		e.jr.Sent(a.w.it.Seq, a.w.attempts, a.res.Worst())
	})
	now, hdr := r.At, r.Header
	a.latency = r.Latency
	a.reached = r.Status != 0 || r.Wrote
	a.outcome = r.Outcome
	a.body = r.Body
	a.maybeBilled = r.MayHaveBilled
	if a.outcome.Kind == anthropic.Success {
		e.jr.Succeeded(a.w.it.Seq, a.w.attempts)
	} else {
		mb := a.maybeBilled && a.outcome.Kind == anthropic.Retryable
		// Journal first, count second: the committer never flushes a
		// count the journal does not hold.
		e.jr.Ended(a.w.it.Seq, a.w.attempts, mb)
		if mb {
			// The worst case first: a flush between the two counts it
			// with a record the replay will count again (never passing
			// the cap), rather than miss it.
			e.c.maybeBilledN.Add(int64(a.res.Worst()))
			e.c.maybeBilled.Add(1)
		}
	}
	if r.Usage != nil {
		a.usage, a.hasUsage = *r.Usage, true
		// Priced as the requested model, which validation checked has a price.
		a.costN, _ = prov.Cost(e.cfg.Prices, a.w.it.Model, r.Usage, false)
	}
	fb := prov.Feedback(a.outcome, hdr, now, r.Usage, upItem(a.w.it), a.costN)
	if hdr != nil {
		a.reqID = prov.RequestID(hdr)
		a.simulated = hdr.Get(cache.SimulatorHeader) != ""
		a.orgIDHdr = fb.Limits.OrganizationID
	}
	a.lane.Done(now, a.permit, fb)
}

// handle applies one finished attempt. It runs on the scheduler goroutine.
func (e *Engine) handle(a *attempt, com *committer, stopping bool) {
	e.inflight--
	e.inflightPub.Store(int64(e.inflight))
	now := time.Now()
	defer e.signal()
	w, l, o := a.w, a.lane, a.outcome
	w.sending = false
	e.prefixAnswered(now, a, o.Kind == anthropic.Success && !a.fenced && a.readErr == nil)
	e.noteReach(now, a)
	if a.orgIDHdr != "" {
		e.noteSameOrg()
	}
	e.settle(a)
	if a.fenced {
		// Never sent: not an attempt; the item goes back to the queue.
		w.attempts--
		e.c.attempts.Add(-1)
		l.attempts.Add(-1)
		e.cfg.Events.Emit(rundir.EventLane, l.key+": "+a.outcome.Reason, map[string]any{"custom_id": w.it.CustomID, "fenced": true})
		w.notBefore = now
		if stopping {
			e.held--
			e.settleKey(a, false, true, com)
			return
		}
		heap.Push(&e.delayed, w)
		return
	}
	if a.readErr != nil {
		// The input file cannot be read: stop, nothing is lost.
		e.held--
		if e.stopReason == "" {
			e.stopReason = "reading the input: " + a.readErr.Error()
		}
		com.fail(fmt.Errorf("reading item %s: %w", w.it.CustomID, a.readErr))
		return
	}
	switch o.Kind {
	case anthropic.Success:
		e.held--
		l.org.completed.Add(1)
		q := queued{Outcome: e.outcome(a, store.Succeeded)}
		if w.keyed {
			q.put = e.cacheEntry(a, now)
		}
		com.submitQ(q)
		e.settleKey(a, true, stopping, com)
		return
	case anthropic.Terminal:
		e.held--
		l.org.completed.Add(1)
		com.submit(e.outcome(a, store.Errored))
		e.settleKey(a, false, stopping, com)
		return
	case anthropic.LaneFatal:
		reason := o.Reason
		if o.Scope == anthropic.ScopeOrg {
			e.disableOrg(l.org, reason)
		} else {
			l.Disable(reason)
			e.cfg.Events.Emit(rundir.EventLane, l.key+" stopped: "+reason, l.Snapshot(now))
		}
		w.transient = 0
		w.notBefore = now
	case anthropic.Retryable:
		switch {
		case o.RateLimited:
			e.c.rateLimited.Add(1)
			a.lane.rateLimited.Add(1)
		case o.Overloaded:
			e.c.overloaded.Add(1)
		default:
			e.c.otherRetries.Add(1)
		}
		if gate.Congested(o) {
			// The lane holds (for retry-after, or its back-off and one
			// probe at a time) and reopens when the storm ends; other
			// lanes may take the item now.
			w.notBefore = now
		} else {
			w.transient++
			w.notBefore = now.Add(gate.RetryWait(o, w.transient, e.cfg.Speed, rand.Float64()))
		}
	}
	if stopping {
		e.held-- // stays pending in the store
		e.settleKey(a, false, true, com)
		return
	}
	heap.Push(&e.delayed, w)
}

// settle ends a's reservation in the spend gate: a success costs its
// usage; an answer that may have been billed although none came back (a
// connection lost after the request went out, a truncated 2xx) keeps its
// worst case counted, since its cost cannot be known; any other answer
// bills nothing.
func (e *Engine) settle(a *attempt) {
	switch {
	case a.readErr != nil:
		a.res.Release()
	case a.outcome.Kind == anthropic.Success && !a.hasUsage:
		// A success that reported no usage: its cost cannot be known, so
		// its worst case stays counted.
		a.res.Keep()
	case a.outcome.Kind == anthropic.Success:
		a.res.Settle(a.costN)
	case a.maybeBilled:
		a.res.Keep()
	default:
		a.res.Release()
	}
}

func (e *Engine) disableOrg(o *orgState, reason string) {
	if o.disabled != "" {
		return
	}
	o.disabled = reason
	for _, ls := range e.lanes {
		for _, l := range ls {
			if l.org == o {
				l.Disable(reason)
			}
		}
	}
	e.cfg.Events.Emit(rundir.EventLane, "org "+o.Name+" ("+o.Key.String()+") stopped: "+reason, map[string]any{"org": o.Name, "reason": reason})
	e.log.Warn("org stopped", "org", o.Name, "key", o.Key.Fingerprint(), "reason", reason)
}

// noteSameOrg stops, with a warning, every org the same-organisation rule
// (upstream.Orgs, which learns each key's organisation from its answers)
// has found to reach the organisation of an org listed before it: a
// second key of one organisation adds no capacity, and the earlier org's
// lanes carry the work. Called when an answer names an organisation.
func (e *Engine) noteSameOrg() {
	for _, o := range e.orgs {
		if o.disabled != "" {
			continue
		}
		reason, keep, id := e.sameOrg.Drop(o.Name)
		if reason == "" {
			continue
		}
		e.cfg.Events.Emit(rundir.EventWarning, "org "+o.Name+": "+reason, map[string]any{"org": o.Name, "same_as": keep, "organization_id": id})
		e.log.Warn("two keys reach one organisation", "org", o.Name, "same_as", keep)
		e.disableOrg(o, reason)
	}
}

// outcome builds the durable outcome and its results.jsonl line.
func (e *Engine) outcome(a *attempt, st store.State) store.Outcome {
	out := store.Outcome{
		Seq: a.w.it.Seq, State: st, Org: a.lane.org.Name, Route: store.RouteSync, Attempts: a.w.attempts,
		LatencyMs: a.latency.Milliseconds(), CostNanos: int64(a.costN),
		InputTok: a.usage.Input, OutputTok: a.usage.Output,
		CacheRead: a.usage.CacheRead, CacheWrite: a.usage.CacheWrite,
	}
	if st == store.Errored {
		out.ErrorType = a.outcome.ErrorType
	}
	d := rundir.Dispatch{Org: a.lane.org.Name, Route: store.RouteSync,
		Attempts: a.w.attempts, LatencyMs: out.LatencyMs, Cost: a.costN, RequestID: a.reqID}
	if a.w.prov == upstream.OpenAI {
		// The OpenAI batch output line: the API's answer as it came (a
		// completion, or its error envelope), or the local cause.
		out.Line = rundir.OpenAIResultLine(a.w.it.CustomID, a.outcome.Status, a.body, a.outcome.ErrorType, a.outcome.Reason, d)
		return out
	}
	var res []byte
	if st == store.Succeeded {
		// Classify parsed the body, so it is valid JSON.
		res = rundir.SucceededResult(a.body)
	} else {
		res = rundir.ErroredResult(a.outcome)
	}
	out.Line = rundir.ResultLine(a.w.it.CustomID, res, d)
	return out
}

// delayHeap orders retries by not-before time.
type delayHeap []*work

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].notBefore.Before(h[j].notBefore) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].heapIdx = i; h[j].heapIdx = j }
func (h *delayHeap) Push(x any)        { w := x.(*work); w.heapIdx = len(*h); *h = append(*h, w) }
func (h *delayHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	return w
}
