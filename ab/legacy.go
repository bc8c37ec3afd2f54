package ab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// LegacyConcurrency is the legacy path's fixed concurrency (docs/design.md §22:
// judge_dispatch's Semaphore(50)).
const LegacyConcurrency = 50

// LegacyConfig configures the legacy arm. Zero fields take the defaults
// noted.
type LegacyConfig struct {
	// Org is the one org the legacy path used (the first org's key).
	Org org.Org
	// BaseURL is the API root (default https://api.anthropic.com).
	BaseURL string
	// Concurrency is the fixed number of requests in flight, slots held
	// through the SDK's retry sleeps (default LegacyConcurrency).
	Concurrency int
	// Speed is the server's time compression K (1 for the real API).
	Speed float64
	// Retry is the SDK's policy (default LegacyRetry(Speed)).
	Retry SDKRetry
	// Timeout bounds one attempt (default the SDK's 600 s, divided by Speed).
	Timeout time.Duration
	// Prices prices each response's usage (required).
	Prices *cost.Table
	// Client overrides the HTTP client (default: a transport with 100
	// keep-alive connections, like the Python SDK's pool).
	Client *http.Client
	// Events receives started, sample, progress and completed or
	// incomplete events (nil: none).
	Events *rundir.EventLog
	// SampleEvery is the period of "sample" events (default 1 s; < 0: none).
	SampleEvery time.Duration
	// Jitter returns uniform numbers in [0, 1) for the back-off jitter
	// (default math/rand/v2).
	Jitter func() float64
}

// Legacy runs the legacy baseline arm of the A/B: docs/design.md §22 reproduced
// faithfully. One org's key; a fixed concurrency of 50 workers that each
// hold their slot while the SDK sleeps between retries; the SDK's retry
// policy (SDKRetry) and nothing else: no AIMD, no header watching, no
// re-queueing. A request that still fails after its retries is written as
// an errored result, whatever the cause: that is the legacy behaviour,
// and a 429 storm makes its data-loss check report retryable causes
// marked terminal.
//
// It streams the request file (memory is bounded by the workers, plus one
// latency figure per success for the percentiles) and writes the same
// results.jsonl lines, sample events and summary shape as the dispatcher,
// so the two arms are compared with the same tools. It keeps no durable
// state: an interrupted legacy arm is run again from the start.
//
// Use NewLegacy, then Run once. Progress is safe to call from any
// goroutine while Run runs.
type Legacy struct {
	cfg    LegacyConfig
	base   *url.URL
	client *http.Client
	owned  *http.Transport // the default client's transport, closed by Run
	pool   atomic.Value    // anthropic.Pool of the first item

	mu       sync.Mutex // guards start and n: Run sets them, Progress reads them from any goroutine
	start    time.Time
	n        int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
	c        legacyCounters
}

type legacyCounters struct {
	attempts, rateLimited, overloaded, otherRetries atomic.Int64
	succeeded, errored, costN                       atomic.Int64
}

// NewLegacy checks cfg and returns a legacy arm.
func NewLegacy(cfg LegacyConfig) (*Legacy, error) {
	if cfg.Org.Key.Empty() {
		return nil, org.ErrNoOrgs
	}
	if cfg.Prices == nil {
		return nil, errors.New("ab: LegacyConfig needs Prices")
	}
	base, err := apihttp.ResolveBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = LegacyConcurrency
	}
	if cfg.Retry.MaxRetries == 0 && cfg.Retry.Initial == 0 {
		cfg.Retry = LegacyRetry(cfg.Speed)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Duration(float64(600*time.Second) / cfg.Speed)
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = time.Second
	}
	if cfg.Jitter == nil {
		cfg.Jitter = rand.Float64
	}
	l := &Legacy{cfg: cfg, base: base, client: apihttp.Guard(cfg.Client)}
	if l.client == nil {
		l.owned = apihttp.NewTransport(100)
		l.client = apihttp.NewClient(l.owned, 0, 0)
	}
	return l, nil
}

// legacyOutcome is one item's final result, handed to the writer.
type legacyOutcome struct {
	it        store.Item
	succeeded bool
	errType   string
	line      []byte
	latencyMs int64
	costN     cost.Nanos
	usage     anthropic.Usage
}

// Run sends every item of the request file at inputPath (n items, as
// validated) and writes results to resultsPath, replacing what it held.
// Cancelling ctx abandons the requests in flight: their items are
// unfinished and Run returns dispatch.ErrIncomplete (wrapped) with the
// summary of what was written.
func (l *Legacy) Run(ctx context.Context, inputPath, resultsPath string, n int64) (*rundir.Summary, error) {
	l.mu.Lock()
	l.start, l.n = time.Now(), n
	l.mu.Unlock()
	if l.owned != nil {
		defer l.owned.CloseIdleConnections()
	}
	in, err := os.Open(inputPath)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	rf, err := os.OpenFile(resultsPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, rundir.FilePerm)
	if err != nil {
		return nil, err
	}
	defer rf.Close()
	ev := l.cfg.Events
	ev.Emit(rundir.EventStarted, fmt.Sprintf("legacy arm: %d items, org %s alone at a fixed concurrency of %d, SDK retries (max %d)", n, l.cfg.Org.Name, l.cfg.Concurrency, l.cfg.Retry.MaxRetries),
		map[string]any{"n": n, "arm": ArmBaseline, "orgs": []map[string]string{{"org": l.cfg.Org.Name, "key": l.cfg.Org.Key.Fingerprint()}},
			"base_url": l.base.Redacted(), "speed": l.cfg.Speed, "concurrency": l.cfg.Concurrency, "max_retries": l.cfg.Retry.MaxRetries})

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan store.Item, l.cfg.Concurrency)
	outs := make(chan *legacyOutcome, l.cfg.Concurrency)
	var fatal error
	var fatalOnce sync.Once
	fail := func(err error) {
		fatalOnce.Do(func() { fatal = err; cancel() })
	}

	var wg sync.WaitGroup
	// The reader streams items in file order.
	wg.Go(func() {
		defer close(jobs)
		err := workload.Scan(inputPath, func(it store.Item) error {
			select {
			case jobs <- it:
				return nil
			case <-runCtx.Done():
				return runCtx.Err()
			}
		})
		if err != nil && runCtx.Err() == nil {
			fail(fmt.Errorf("reading %s: %w", inputPath, err))
		}
	})
	// A fixed pool of workers: one slot each, held through retries.
	var workers sync.WaitGroup
	for range l.cfg.Concurrency {
		workers.Go(func() {
			for it := range jobs {
				if runCtx.Err() != nil {
					continue
				}
				o, err := l.call(runCtx, in, it)
				if err != nil {
					fail(err)
					continue
				}
				if o != nil {
					outs <- o
				}
			}
		})
	}
	go func() { workers.Wait(); close(outs) }()

	// Samples and progress milestones for the report.
	sampleDone := make(chan struct{})
	if l.cfg.SampleEvery > 0 && ev != nil {
		wg.Go(func() { l.sampler(sampleDone) })
	}

	// The writer owns the results file and the per-item figures.
	w := bufio.NewWriterSize(rf, 256<<10)
	var (
		byType     = map[string]int64{}
		latencies  []int64
		tok        rundir.Tokens
		succ, errd int64
		costN      cost.Nanos
		werr       error
	)
	for o := range outs {
		if werr != nil {
			continue
		}
		if _, err := w.Write(o.line); err != nil {
			werr = err
			fail(fmt.Errorf("writing %s: %w", resultsPath, err))
			continue
		}
		w.WriteByte('\n')
		if o.succeeded {
			succ++
			latencies = append(latencies, o.latencyMs)
			costN += o.costN
			tok.Input += o.usage.InputTokens
			tok.Output += o.usage.OutputTokens
			tok.CacheRead += o.usage.CacheReadInputTokens
			tok.CacheWrite += o.usage.CacheCreationInputTokens
			l.c.costN.Add(int64(o.costN))
			l.c.succeeded.Add(1)
		} else {
			errd++
			byType[o.errType]++
			l.c.errored.Add(1)
		}
	}
	close(sampleDone)
	wg.Wait()
	if err := w.Flush(); err != nil && werr == nil {
		werr = err
	}
	if err := rf.Sync(); err != nil && werr == nil {
		werr = err
	}
	if fatal == nil && werr != nil {
		fatal = werr
	}

	wall := time.Since(l.start)
	agg := store.Aggregate{N: n, Pending: max(0, n-succ-errd), Succeeded: succ, Errored: errd, ErroredByType: byType}
	dl, err := rundir.CheckResults(resultsPath, agg)
	if err != nil && fatal == nil {
		fatal = err
	}
	wall = time.Since(l.start)
	s := l.summary(agg, dl, costN, tok, latencies, wall)
	switch {
	case fatal != nil:
		ev.Emit(rundir.EventFailure, fatal.Error(), s)
		return s, fatal
	case ctx.Err() != nil || s.Unfinished > 0:
		s.StopReason = "stopped by signal"
		ev.Emit(rundir.EventIncomplete, s.StopReason, s)
		return s, fmt.Errorf("%w: legacy arm %s (it is run again from the start)", dispatch.ErrIncomplete, s.StopReason)
	}
	ev.Emit(rundir.EventCompleted, fmt.Sprintf("%d succeeded, %d errored", s.Succeeded, s.Errored), s)
	return s, nil
}

// call sends one item with the SDK's retries. It returns nil, nil when
// ctx ended first (the item stays unfinished), and an error only when the
// input cannot be read.
func (l *Legacy) call(ctx context.Context, in io.ReaderAt, it store.Item) (*legacyOutcome, error) {
	body, err := workload.ReadAt(in, it)
	if err != nil {
		return nil, fmt.Errorf("reading item %s: %w", it.CustomID, err)
	}
	if l.pool.Load() == nil {
		l.pool.CompareAndSwap(nil, anthropic.PoolOf(it.Model))
	}
	l.inFlight.Add(1)
	for {
		cur := l.inFlight.Load()
		m := l.maxIn.Load()
		if cur <= m || l.maxIn.CompareAndSwap(m, cur) {
			break
		}
	}
	defer l.inFlight.Add(-1)
	p := l.cfg.Retry
	for retries := 0; ; retries++ {
		l.c.attempts.Add(1)
		a := l.attempt(ctx, body, retries)
		if ctx.Err() != nil {
			return nil, nil
		}
		o := a.outcome
		if o.Kind == anthropic.Success {
			c, _ := l.cfg.Prices.Cost(it.Model, o.Message.Usage, false)
			return &legacyOutcome{it: it, succeeded: true, latencyMs: a.latency.Milliseconds(), costN: c, usage: o.Message.Usage,
				line: resultLine(it.CustomID, succeededResult(a.body), l.cfg.Org.Name, int64(retries+1), a.latency.Milliseconds(), c, a.reqID)}, nil
		}
		retry := a.status < 200 || a.status >= 300 // a 2xx that is not a message: the SDK fails to parse it, no retry
		retry = retry && p.ShouldRetry(a.status, a.header, a.transportErr)
		switch {
		case a.status == http.StatusTooManyRequests:
			l.c.rateLimited.Add(1)
		case a.status == 529:
			l.c.overloaded.Add(1)
		case retry:
			l.c.otherRetries.Add(1)
		}
		if !retry || retries >= p.MaxRetries {
			return &legacyOutcome{it: it, errType: o.ErrorType,
				line: resultLine(it.CustomID, rundir.ErroredResult(o), l.cfg.Org.Name, int64(retries+1), a.latency.Milliseconds(), 0, a.reqID)}, nil
		}
		// The slot stays held while the SDK sleeps.
		if !sleepCtx(ctx, p.Delay(a.header, retries, l.cfg.Jitter(), time.Now())) {
			return nil, nil
		}
	}
}

// legacyAttempt is one HTTP attempt.
type legacyAttempt struct {
	status       int
	header       http.Header
	body         []byte
	transportErr error
	latency      time.Duration
	reqID        string
	outcome      anthropic.Outcome
}

func (l *Legacy) attempt(ctx context.Context, body []byte, retries int) legacyAttempt {
	var a legacyAttempt
	actx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, l.base.JoinPath("v1", "messages").String(), bytes.NewReader(body))
	if err != nil {
		a.transportErr = err
		a.outcome = anthropic.Classify(0, nil, nil, err, time.Now())
		return a
	}
	anthropic.SetHeaders(req.Header, l.cfg.Org.Key, true)
	req.Header.Set("x-stainless-retry-count", strconv.Itoa(retries))
	t0 := time.Now()
	resp, err := l.client.Do(req)
	if err == nil {
		a.status, a.header = resp.StatusCode, resp.Header
		a.reqID = resp.Header.Get(anthropic.HeaderRequestID)
		// A body that breaks off (a reset, a short read) is a connection
		// error to the SDK, and retried.
		a.body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
	}
	now := time.Now()
	a.latency = now.Sub(t0)
	a.transportErr = err
	if err != nil {
		a.outcome = anthropic.Classify(0, nil, nil, err, now)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			a.outcome.ErrorType = anthropic.ErrTimeout
			a.outcome.Reason = fmt.Sprintf("request timed out after %s", l.cfg.Timeout)
		}
		return a
	}
	a.outcome = anthropic.Classify(a.status, a.header, a.body, nil, now)
	return a
}

// sampler emits a sample event every SampleEvery and a progress event at
// each 10% until done is closed.
func (l *Legacy) sampler(done <-chan struct{}) {
	t := time.NewTicker(l.cfg.SampleEvery)
	defer t.Stop()
	last := l.start
	var lastDone int64
	milestone := int64(0)
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			d := l.c.succeeded.Load() + l.c.errored.Load()
			l.cfg.Events.Emit(rundir.EventSample, "", map[string]any{
				"t_s": now.Sub(l.start).Seconds(), "dt_s": now.Sub(last).Seconds(),
				"completed_by_org": map[string]int64{l.cfg.Org.Name: d - lastDone},
				"lanes":            []gate.LaneSnapshot{l.lane()},
				"rate_limited_429": l.c.rateLimited.Load(), "retries": l.c.overloaded.Load() + l.c.otherRetries.Load(),
				"cost_usd": cost.Nanos(l.c.costN.Load()).USD(), "in_flight": l.inFlight.Load(),
			})
			last, lastDone = now, d
			if l.n > 0 {
				if m := d * 10 / l.n; m > milestone {
					milestone = m
					l.cfg.Events.Emit(rundir.EventProgress, fmt.Sprintf("%d%% done", m*10), l.Progress())
				}
			}
		}
	}
}

// lane is the legacy arm's one fixed lane, in the dispatcher's shape.
func (l *Legacy) lane() gate.LaneSnapshot {
	pool, _ := l.pool.Load().(anthropic.Pool)
	return gate.LaneSnapshot{Org: l.cfg.Org.Name, Pool: string(pool), Cap: l.cfg.Concurrency,
		Limit: float64(l.cfg.Concurrency), InFlight: int(l.inFlight.Load()), MaxInFlight: int(l.maxIn.Load())}
}

// Progress returns a snapshot of the run. It is safe to call from any goroutine.
func (l *Legacy) Progress() dispatch.Progress {
	l.mu.Lock()
	start, total := l.start, l.n
	l.mu.Unlock()
	var el float64
	if !start.IsZero() {
		el = time.Since(start).Seconds()
	}
	succ, errd := l.c.succeeded.Load(), l.c.errored.Load()
	p := dispatch.Progress{
		Done: succ + errd, Total: total, Succeeded: succ, Errored: errd, InFlight: int(l.inFlight.Load()),
		CostUSD: cost.Nanos(l.c.costN.Load()).USD(), RateLimited: l.c.rateLimited.Load(),
		Retries:  l.c.rateLimited.Load() + l.c.overloaded.Load() + l.c.otherRetries.Load(),
		ElapsedS: el, Lanes: []gate.LaneSnapshot{l.lane()},
	}
	if el > 0 {
		p.RequestsPerMin = float64(p.Done) / el * 60
	}
	if p.RequestsPerMin > 0 {
		p.ETA = float64(p.Total-p.Done) / p.RequestsPerMin * 60
	}
	return p
}

// summary fills the dispatcher's summary shape for the legacy arm.
func (l *Legacy) summary(agg store.Aggregate, dl rundir.DataLoss, costN cost.Nanos, tok rundir.Tokens, lat []int64, wall time.Duration) *rundir.Summary {
	slices.Sort(lat)
	fp := l.cfg.Org.Key.Fingerprint()
	s := &rundir.Summary{
		N: agg.N, Succeeded: agg.Succeeded, Errored: agg.Errored, ErroredByType: agg.ErroredByType,
		Unfinished: agg.Pending, DataLoss: dl,
		Cost:   rundir.CostUSD{Total: costN.USD(), TotalNanos: int64(costN), ByOrg: map[string]float64{l.cfg.Org.Name: costN.USD()}},
		Tokens: tok, Attempts: l.c.attempts.Load(), RateLimited429: l.c.rateLimited.Load(),
		Overloaded529: l.c.overloaded.Load(), OtherRetries: l.c.otherRetries.Load(),
		LatencyMs:        rundir.Latency{P50: nearestRank(lat, 0.50), P95: nearestRank(lat, 0.95), P99: nearestRank(lat, 0.99)},
		CompletedThisRun: agg.Succeeded + agg.Errored,
		WallS:            wall.Seconds(), Speed: l.cfg.Speed, APIEquivalentWallS: wall.Seconds() * l.cfg.Speed,
		ByOrg: map[string]rundir.OrgSplit{l.cfg.Org.Name: {Succeeded: agg.Succeeded, Errored: agg.Errored, CostUSD: costN.USD(), Key: fp}},
		Lanes: []gate.LaneSnapshot{l.lane()},
		Orgs:  []map[string]string{{"org": l.cfg.Org.Name, "key_fingerprint": fp}},
		Extra: map[string]any{"arm": ArmBaseline, "concurrency": l.cfg.Concurrency, "max_retries": l.cfg.Retry.MaxRetries,
			"latency_note": "latency of each item's last attempt, succeeded items only (as the dispatcher reports it)"},
	}
	if s.ErroredByType == nil {
		s.ErroredByType = map[string]int64{}
	}
	if wall > 0 {
		s.RequestsPerMin = float64(s.CompletedThisRun) / wall.Seconds() * 60
	}
	return s
}

// nearestRank is the k-th smallest of sorted with k = ceil(q·n), at least
// 1 (the store's definition); 0 for no values.
func nearestRank(sorted []int64, q float64) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	k := int(q*float64(n) + 1 - 1e-9)
	k = min(max(k, 1), n)
	return sorted[k-1]
}

// succeededResult is the "succeeded" result object of body. The legacy
// arm has always compacted every body (the engine only one with line
// breaks), and its lines stay as they were.
func succeededResult(body []byte) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, body) != nil {
		return rundir.SucceededResult(body)
	}
	return rundir.SucceededResult(buf.Bytes())
}

// resultLine is one results.jsonl line, in the dispatcher's format.
func resultLine(customID string, result []byte, orgName string, attempts, latencyMs int64, c cost.Nanos, reqID string) []byte {
	return rundir.ResultLine(customID, result, rundir.Dispatch{Org: orgName, Route: store.RouteSync,
		Attempts: attempts, LatencyMs: latencyMs, Cost: c, RequestID: reqID})
}

// sleepCtx waits d or until ctx ends, reporting whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
