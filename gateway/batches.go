package gateway

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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// Files of a gateway batch's directory (StateDir/batches/<id>/).
const (
	batchMeta     = "batch.json"
	batchRequests = "requests.jsonl"
	batchRun      = "run"           // the run directory runner executes
	batchResults  = "results.jsonl" // the API's results format, written at the end
	batchTime     = "2006-01-02T15:04:05.000000Z07:00"
)

// Batch processing statuses (the API's).
const (
	statusInProgress = "in_progress"
	statusCanceling  = "canceling"
	statusEnded      = "ended"
)

// counts are a batch's request_counts.
type counts struct {
	Processing int64 `json:"processing"`
	Succeeded  int64 `json:"succeeded"`
	Errored    int64 `json:"errored"`
	Canceled   int64 `json:"canceled"`
	Expired    int64 `json:"expired"`
}

// batchMetaDoc is a gateway batch's durable record.
type batchMetaDoc struct {
	ID              string     `json:"id"`
	Seq             int64      `json:"seq"`
	Client          string     `json:"client"`
	N               int64      `json:"n"`
	Route           string     `json:"route"`
	DeadlineS       float64    `json:"deadline_s,omitempty"`
	WorstNanos      cost.Nanos `json:"worst_nanos"`
	Status          string     `json:"status"`
	CreatedAt       time.Time  `json:"created_at"`
	ExpiresAt       time.Time  `json:"expires_at"`
	CancelInitiated *time.Time `json:"cancel_initiated_at"`
	EndedAt         *time.Time `json:"ended_at"`
	Counts          counts     `json:"counts"`
	CostNanos       cost.Nanos `json:"cost_nanos"`
	// Stopped says why the batch ended before its run ended every
	// request, when neither a cancel nor its expiry ended it: the run
	// stopped for good (nil: it did not).
	Stopped *batchStop `json:"stopped,omitempty"`
	// OpenAI is set on a batch of the OpenAI Batches API (oabatches.go);
	// nil on a Message Batch.
	OpenAI *oaBatchDoc `json:"openai,omitempty"`
}

// Why a gateway batch's run stopped for good (batchStop.Cause).
const (
	// stopSpendCap: a spend cap (its client's max_cost, or the gateway's
	// --max-cost) refused the next request with nothing held that could
	// free room.
	stopSpendCap = "spend_cap"
	// stopCannotRun: runner refused the run (a usage error: no org serves
	// its requests, a run directory it cannot open) or its data-loss
	// check failed; running again would not change that.
	stopCannotRun = "cannot_run"
)

// batchStop is why a gateway batch's run stopped for good: its cause and
// a message for the batch's client, a phrase of which the batch is the
// subject (no paths of the gateway, no keys).
type batchStop struct {
	Cause   string `json:"cause"`
	Message string `json:"message"`
}

// batchEnd is how a gateway batch's run ended, for its results: the
// requests it did not end were canceled (a cancel), expired (its expiry)
// or not run because it stopped for good (stop); none of these, it
// completed.
type batchEnd struct {
	canceled, expired bool
	stop              *batchStop
}

// completed says the run ended every request (nothing canceled, expired
// or stopped).
func (e batchEnd) completed() bool { return !e.canceled && !e.expired && e.stop == nil }

// gwBatch is one gateway batch in memory.
type gwBatch struct {
	dir string

	mu        sync.Mutex
	meta      batchMetaDoc
	st        store.Store // the running job's store, for live counts (nil otherwise)
	cancel    context.CancelFunc
	cancelReq chan struct{} // closed by a cancel request
	// hold is the batch's worst case in its client's gate from its create
	// (or the gateway's start) until runner's batch route has loaded the
	// run's open upstream batches, each then held in gate (the sync route,
	// which has none, frees it once the run directory is open); gate is
	// the child of the client's gate, capped at the worst case, that
	// runner reserves every request and upstream batch in.
	hold *hold
	gate *spend.Gate
	// finalizing: the executor is writing the results of a run that ended
	// every request; a cancel is refused from then on.
	finalizing bool
}

// batchStore is the gateway's batches: one directory each, executed by
// runner, resumed at start.
type batchStore struct {
	g   *Gateway
	dir string

	mu   sync.Mutex
	byID map[string]*gwBatch
	seq  int64
}

func openBatchStore(g *Gateway) (*batchStore, error) {
	s := &batchStore{g: g, dir: filepath.Join(g.cfg.StateDir, batchesDir), byID: map[string]*gwBatch{}}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("gateway: batches: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, batchMeta))
		if errors.Is(err, os.ErrNotExist) {
			// A create cut off before it was acknowledged: nothing was sent.
			os.RemoveAll(dir)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("gateway: batch %s: %w", e.Name(), err)
		}
		var m batchMetaDoc
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("gateway: batch %s: %s is damaged: %w", e.Name(), batchMeta, err)
		}
		gb := &gwBatch{dir: dir, meta: m, cancelReq: make(chan struct{})}
		if m.Status == statusCanceling {
			close(gb.cancelReq)
		}
		s.byID[m.ID] = gb
		s.seq = max(s.seq, m.Seq)
	}
	for _, gb := range s.byID {
		if gb.meta.Status != statusEnded {
			// Hold its worst case whatever the cap says (it was accepted,
			// and may have spent already) until runner says what it spent.
			gb.hold = &hold{g: g, client: gb.meta.Client, res: g.clientGate(gb.meta.Client).HoldTagged(gb.meta.WorstNanos, batchHoldTag)}
			s.start(gb)
		}
	}
	return s, nil
}

// counts returns how many batches of client ("" for every client) are in
// each status.
func (s *batchStore) counts(client string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, b := range s.byID {
		b.mu.Lock()
		if client == "" || b.meta.Client == client {
			out[b.meta.Status]++
		}
		b.mu.Unlock()
	}
	return out
}

// writeMeta writes b's record atomically. b.mu is held.
func (b *gwBatch) writeMetaLocked() error {
	data, _ := json.MarshalIndent(b.meta, "", " ")
	return rundir.WriteFileAtomic(filepath.Join(b.dir, batchMeta), data, 0o600)
}

// createReq is the body of POST /v1/messages/batches.
type createReq struct {
	Requests *[]struct {
		CustomID *string         `json:"custom_id"`
		Params   json.RawMessage `json:"params"`
	} `json:"requests"`
}

func validCustomID(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// createBatch serves POST /v1/messages/batches: the API's validation, then
// a durable gateway batch executed by runner. The route is the gateway's
// extension: header x-apidispatch-route (batch, the default; auto, with
// x-apidispatch-deadline; sync).
func (g *Gateway) createBatch(w http.ResponseWriter, r *http.Request, client string) {
	route, deadline, bad := batchRoute(r)
	if bad != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, bad)
		return
	}
	body, ok := readBody(w, r, MaxBatchBytes)
	if !ok {
		return
	}
	var req createReq
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, te.Field+": Input should be a valid "+te.Value)
			return
		}
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, invalidJSON)
			return
		}
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, strings.TrimPrefix(err.Error(), "json: unknown field ")+": Extra inputs are not permitted")
		return
	}
	if req.Requests == nil {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "requests: Field required")
		return
	}
	reqs := *req.Requests
	if len(reqs) == 0 {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "requests: List should have at least 1 item after validation, not 0")
		return
	}
	if len(reqs) > MaxBatchRequests {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests: List should have at most %d items after validation, not %d", MaxBatchRequests, len(reqs)))
		return
	}
	seen := make(map[string]int, len(reqs))
	var buf bytes.Buffer
	var worst cost.Nanos
	for i, it := range reqs {
		if it.CustomID == nil {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.custom_id: Field required", i))
			return
		}
		id := *it.CustomID
		if !validCustomID(id) {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.custom_id: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'", i))
			return
		}
		if j, dup := seen[id]; dup {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.custom_id: custom_id %q is used by requests.%d too; custom_id values must be unique within a batch", i, id, j))
			return
		}
		seen[id] = i
		p := bytes.TrimSpace(it.Params)
		if len(p) == 0 || string(p) == "null" {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.params: Field required", i))
			return
		}
		if p[0] != '{' {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.params: Input should be a valid dictionary", i))
			return
		}
		mp, bad := g.parseParams(p, true)
		if bad == "" {
			bad = g.strictPrice(mp.Model)
		}
		if bad != "" {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("requests.%d.params.%s", i, bad))
			return
		}
		// A batch on the batch route is billed at the batch rates; auto and
		// sync may send any request at the full price.
		worst += g.worstCase(mp.Model, p, *mp.MaxTokens, route == runner.RouteBatch)
		line, _ := json.Marshal(anthropic.BatchRequest{CustomID: id, Params: json.RawMessage(compact(p))})
		buf.Write(line)
		buf.WriteByte('\n')
	}
	hold, err := g.reserveTagged(client, worst, batchHoldTag)
	if err != nil {
		g.stats.refusedCap.Add(1)
		writeCapError(w, err)
		return
	}
	s := g.batches
	seq := s.nextSeq()
	id := "msgbatch_" + randomHex(12)
	dir := filepath.Join(s.dir, id)
	now := time.Now().UTC()
	gb := &gwBatch{dir: dir, hold: hold, cancelReq: make(chan struct{}), meta: batchMetaDoc{
		ID: id, Seq: seq, Client: client, N: int64(len(reqs)), Route: route, DeadlineS: deadline.Seconds(), WorstNanos: worst,
		Status: statusInProgress, CreatedAt: now, ExpiresAt: now.Add(time.Duration(float64(24*time.Hour) / g.cfg.Speed)),
		Counts: counts{Processing: int64(len(reqs))},
	}}
	fail := func(err error) {
		hold.Settle(Entry{})
		os.RemoveAll(dir)
		writeError(w, http.StatusInternalServerError, anthropic.ErrAPI, "apidispatch gateway: storing the batch: "+err.Error())
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fail(err)
		return
	}
	if err := writeFileSync(filepath.Join(dir, batchRequests), buf.Bytes()); err != nil {
		fail(err)
		return
	}
	if _, err := rundir.Validate(filepath.Join(dir, batchRequests), g.cfg.Prices); err != nil {
		hold.Settle(Entry{})
		os.RemoveAll(dir)
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "requests: "+err.Error())
		return
	}
	if err := s.launch(gb); err != nil {
		fail(err)
		return
	}
	g.writeBatch(w, r, gb)
}

// batchRoute is the route a batch create asks for (header
// x-apidispatch-route, batch by default) and its deadline (auto's), or
// the problem with them.
func batchRoute(r *http.Request) (string, time.Duration, string) {
	route := strings.ToLower(strings.TrimSpace(r.Header.Get(headerRoute)))
	switch route {
	case "":
		return runner.RouteBatch, 0, ""
	case runner.RouteBatch, runner.RouteSync:
		return route, 0, ""
	case runner.RouteAuto:
		d, err := time.ParseDuration(r.Header.Get(headerDeadline))
		if err != nil || d <= 0 {
			return "", 0, headerDeadline + ": route auto needs a positive duration (e.g. 2h)"
		}
		return route, d, ""
	}
	return "", 0, headerRoute + ": want batch, auto or sync"
}

// nextSeq is the sequence number of a new batch (its place in lists).
func (s *batchStore) nextSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// launch writes gb's record, then registers and starts it.
func (s *batchStore) launch(gb *gwBatch) error {
	gb.mu.Lock()
	err := gb.writeMetaLocked()
	gb.mu.Unlock()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.byID[gb.meta.ID] = gb
	s.mu.Unlock()
	if gb.meta.Status != statusEnded {
		s.start(gb)
	}
	return nil
}

func compact(p []byte) []byte {
	if bytes.IndexByte(p, '\n') < 0 && bytes.IndexByte(p, '\r') < 0 {
		return p
	}
	var b bytes.Buffer
	if json.Compact(&b, p) != nil {
		return p
	}
	return b.Bytes()
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// start runs gb's executor on a goroutine the gateway owns.
func (s *batchStore) start(gb *gwBatch) {
	s.g.wg.Go(func() { s.execute(gb) })
}

// execute runs gb's run directory by its route until it ends: every item
// done, the batch canceled, or expired. Stopped by Close, it resumes at the
// next start on the same state directory (runner re-attaches its open
// upstream batches, so nothing is sent or paid twice).
func (s *batchStore) execute(gb *gwBatch) {
	g := s.g
	gb.mu.Lock()
	m := gb.meta
	gb.mu.Unlock()
	expiry := time.NewTimer(time.Until(m.ExpiresAt))
	defer expiry.Stop()
	// expired is set by the expiry's watcher below while the run goes on
	// (and read by the run's loop before the watcher has ended), so it is
	// atomic. A batch resumed past its expiry starts with its cancel run.
	var expired atomic.Bool
	expired.Store(!time.Now().Before(m.ExpiresAt))
	for attempt := 0; ; attempt++ {
		canceling := false
		select {
		case <-gb.cancelReq:
			canceling = true
		default:
		}
		ctx, cancel := context.WithCancel(g.life.batchCtx)
		stopWatch := make(chan struct{})
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			select {
			case <-stopWatch:
			case <-gb.cancelReq:
				if !canceling {
					cancel()
				}
			case <-expiry.C:
				expired.Store(true)
				cancel()
			}
		}()
		g.discover()
		cancelOpen := canceling || expired.Load()
		out := s.runOnce(ctx, gb, cancelOpen)
		close(stopWatch)
		<-watchDone
		cancel()
		if g.life.batchCtx.Err() != nil {
			return // the gateway is stopping: resume next time
		}
		if expired.Load() && !cancelOpen && out.Stop.Kind != runner.Complete {
			// Expired during the run, which was cut: the upstream batches
			// it left open would run on and bill what they process, which
			// no one would read. Run once more to cancel them (as a
			// cancel does), then end it.
			continue
		}
		if out.Stop.Kind == runner.Complete || canceling || expired.Load() {
			s.finalize(gb, batchEnd{canceled: canceling, expired: expired.Load()})
			return
		}
		select {
		case <-gb.cancelReq:
			continue
		default:
		}
		if k := out.Stop.Kind; k == runner.Usage || k == runner.DataLoss {
			// Will not get better by running again: end it, stopped for
			// good; what was not done is not run (finalize).
			g.log.Error("gateway batch cannot run", "batch", m.ID, "error", out.Err)
			s.finalize(gb, batchEnd{stop: &batchStop{Cause: stopCannotRun, Message: "the gateway cannot run it: " + clientText(gb.dir, out.Err)}})
			return
		}
		if ce := (*spend.CapError)(nil); errors.As(out.Err, &ce) {
			// A spend cap refused the next request with nothing held
			// anywhere that could free room: the client's max_cost (or the
			// gateway's --max-cost) is spent, and spend never goes down,
			// so running again would wait for ever. End it, stopped for
			// good; what was not done is not run (finalize).
			g.log.Warn("gateway batch ended at a spend cap", "batch", m.ID, "error", ce)
			s.finalize(gb, batchEnd{stop: &batchStop{Cause: stopSpendCap, Message: "a spend cap of the gateway leaves no room for it: " + clientText(gb.dir, ce)}})
			return
		}
		// Incomplete (no usable lane now, an upstream failure): try again,
		// after the one back-off of every route.
		g.log.Warn("gateway batch stopped before its end; trying again", "batch", m.ID, "stop", out.Stop.Kind.String(), "reason", out.Stop.Reason, "error", out.Err)
		wait := gate.Backoff(attempt+1, g.cfg.Speed, rand.Float64()) + 10*time.Millisecond
		t := time.NewTimer(wait)
		select {
		case <-g.life.batchCtx.Done():
			t.Stop()
			return
		case <-gb.cancelReq:
			t.Stop()
		case <-expiry.C:
			expired.Store(true)
		case <-t.C:
		}
	}
}

// runOnce runs gb's directory once with runner.Run.
func (s *batchStore) runOnce(ctx context.Context, gb *gwBatch, cancelOpen bool) runner.Outcome {
	g := s.g
	gb.mu.Lock()
	m := gb.meta
	gb.mu.Unlock()
	route := m.Route
	if cancelOpen && route == runner.RouteSync {
		return runner.Outcome{Stop: runner.Stop{Kind: runner.Incomplete}}
	}
	sync := dispatch.Config{
		Orgs: g.cfg.Orgs, BaseURL: g.cfg.BaseURL, Caps: g.cfg.Caps, Speed: g.cfg.Speed, Prices: g.cfg.Prices,
		Client: g.client, Log: g.log, Lane: g.cfg.Lane, Timeout: g.cfg.Timeout,
		// The gateway's own lanes: its single requests and its batches'
		// items hold one cap per key, and a release by either wakes the
		// other.
		Lanes:        g.lanes.up,
		PromptCaches: g.lanes.places, // the same orgs' prompt caches as the sync requests
		WorstEvery:   true,           // the batch's bill counts what resets may have billed
	}
	abort, forget := g.life.aborter()
	defer forget()
	cfg := runner.Config{
		Abort: abort,
		Input: filepath.Join(gb.dir, batchRequests), RunDir: filepath.Join(gb.dir, batchRun), Prices: g.cfg.Prices,
		Sync: sync, Confirm: true, Route: route, Cancel: cancelOpen, Limits: g.cfg.Limits,
		Deadline: time.Duration(m.DeadlineS * float64(time.Second)),
		OnAttach: gb.attached,
		OnJob: func(job *rundir.Job, sc *dispatch.Config) (func(), error) {
			bg, err := s.batchGate(ctx, gb, job)
			if err != nil {
				return nil, err
			}
			sc.Spend = bg
			gb.mu.Lock()
			gb.st = job.Store
			gb.mu.Unlock()
			return func() {
				gb.mu.Lock()
				gb.st = nil
				gb.mu.Unlock()
			}, nil
		},
	}
	return runner.Run(ctx, cfg)
}

// batchGate returns gb's spend gate for runner: a child of its client's
// gate capped at the batch's worst case. Made the first time in this
// process, it is seeded with what the run directory spent already (a
// resumed batch), which is added to the client's gate as spent (in this
// process only: a shared budget counted it when it was charged). From
// then on runner reserves each request and upstream batch in the client's
// gate, beside the client's sync requests; the batch's hold of its worst
// case is freed once runner's batch route holds the upstream batches an
// earlier process left open (attached): freed before, the client's sync
// requests took the room those batches, billed in full, still needed.
func (s *batchStore) batchGate(ctx context.Context, gb *gwBatch, job *rundir.Job) (*spend.Gate, error) {
	gb.mu.Lock()
	defer gb.mu.Unlock()
	if gb.gate != nil {
		return gb.gate, nil
	}
	// A process that died on this directory (a kill -9 mid-batch) left a
	// journal of what it may have had billed: counted now, so spent holds
	// it before the gate is made (the engine then finds nothing to replay).
	if err := job.ReplayJournals(ctx); err != nil {
		return nil, fmt.Errorf("reading the gateway batch's attempt journals: %w", err)
	}
	agg, err := job.Store.Aggregate(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading what the gateway batch spent: %w", err)
	}
	spent := rundir.SpentBefore(agg)
	cg := s.g.clientGate(gb.meta.Client)
	// Counted here only: a shared budget in Redis counted it already, as
	// its earlier process charged it (or kept it at its worst when that
	// process died).
	cg.CountLocal(spent)
	// The batch's own cap is its worst case when every item is billed
	// once, as the Batches API bills them. Sent one by one (the sync route,
	// and auto's sync share), an attempt cut after it was sent (a reset, a
	// timeout, a process killed with it in flight) may be billed and is sent
	// again, so no worst case fixed at create bounds it: there the client's
	// gate alone, which counts every such attempt, bounds the batch.
	var capN cost.Nanos
	if gb.meta.Route == runner.RouteBatch {
		capN = gb.meta.WorstNanos
	}
	gb.gate = cg.Child("gateway batch "+gb.meta.ID+"'s worst case", capN, spent)
	if gb.meta.Route == runner.RouteSync {
		// No batch route, so no upstream batch to re-attach (runner
		// refuses a sync run while the directory has one open).
		gb.hold.release()
		gb.hold = nil
	}
	return gb.gate, nil
}

// attached frees gb's hold of its worst case once runner's batch route
// has loaded the run's open upstream batches into gb's gate, each at its
// worst case: from then on they count there.
func (gb *gwBatch) attached() {
	gb.mu.Lock()
	var h *hold
	if gb.gate != nil { // always made first (runner's OnJob)
		h, gb.hold = gb.hold, nil
	}
	gb.mu.Unlock()
	h.release()
}

// clientText is err's text for a batch's client: the paths under the
// batch's directory dir relative to it, anything like a key scrubbed.
func clientText(dir string, err error) string {
	return org.Scrub(strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""))
}

// finalize writes gb's results in the API's format (pending items as
// canceled, expired, or not run because the run stopped for good), bills
// its cost to the client's ledger once, and marks it ended.
func (s *batchStore) finalize(gb *gwBatch, end batchEnd) {
	g := s.g
	gb.mu.Lock()
	m := gb.meta
	gb.mu.Unlock()
	if end.completed() {
		// Writing the results takes a while for a big batch: an OpenAI
		// batch is finalizing meanwhile, as the API's is while it writes
		// its output file.
		now := time.Now().UTC()
		gb.mu.Lock()
		gb.finalizing = true
		if oa := gb.meta.OpenAI; oa != nil && oa.FinalizingAt == nil {
			oa.FinalizingAt = &now
		}
		gb.mu.Unlock()
	}
	write := writeAPIResults
	if m.OpenAI != nil {
		write = g.writeOAResults(gb)
	}
	c, err := write(gb.dir, end)
	if err != nil {
		g.log.Error("gateway batch: writing results", "batch", m.ID, "error", err)
		return // stays open; the next start finishes it
	}
	costN, unread, err := runSpent(filepath.Join(gb.dir, batchRun))
	if err != nil {
		g.log.Error("gateway batch: reading what it spent", "batch", m.ID, "error", err)
		return // stays open; the next start finishes it
	}
	gb.mu.Lock()
	h, ran := gb.hold, gb.gate != nil
	gb.hold = nil
	gb.mu.Unlock()
	// Once runner has its gate, what the run spent is in the client's
	// gate already (seeded, or charged by runner's reservations): a hold
	// left (a run that ended before its batch route loaded) is freed and
	// the ledger only records.
	if !g.ledger.billed(m.ID) {
		e := Entry{Cost: costN, Unread: unread, Route: "batch", BatchID: m.ID}
		if h != nil && !ran {
			h.Settle(e)
		} else {
			h.release()
			g.ledger.record(m.Client, e)
		}
	} else {
		h.release()
	}
	if err := g.ledger.Flush(); err != nil {
		g.log.Error("gateway batch: writing the ledger", "batch", m.ID, "error", err)
		return
	}
	now := time.Now().UTC()
	gb.mu.Lock()
	gb.meta.Status, gb.meta.EndedAt, gb.meta.Counts, gb.meta.CostNanos, gb.meta.Stopped = statusEnded, &now, c, costN, end.stop
	if oa := gb.meta.OpenAI; oa != nil {
		oa.Expired = end.expired && !end.canceled
	}
	if err := gb.writeMetaLocked(); err != nil {
		g.log.Error("gateway batch: writing its record", "batch", m.ID, "error", err)
	}
	gb.mu.Unlock()
}

// runSpent is what the run directory dir spent, from its store: its
// answers' usage and the worst case of every attempt the API may have
// billed without an answer (re-sends after a reset, attempts in flight
// when a process died, its journals replayed here if no run did,
// upstream batches still open), unread being the latter. An upstream batch still open when the gateway batch ends (it
// expired, or its run stopped for good) runs on and bills what it
// processes, which no one will read: its worst case is counted, or the
// ledger, which seeds the client's gate at the next start, would count
// it as nothing. A run directory never opened spent nothing.
func runSpent(dir string) (spent, unread cost.Nanos, err error) {
	st, err := rundir.OpenStore(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	ctx := context.Background()
	agg, err := st.Aggregate(ctx)
	if errors.Is(err, store.ErrNotInitialized) {
		// A run stopped between creating the store and initialising it
		// (its context ended first: a cancel, the expiry, a stop) sent
		// nothing: nothing is sent before the store holds the items.
		// Refused, the batch could never end.
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	// A batch ended without a run in this process (canceled or stopped
	// before its run opened the directory) has not replayed the journals
	// a process that died on it left: what they hold open may have been
	// billed.
	if _, err := rundir.Replay(ctx, dir, st, agg.Counters, nil, nil); err != nil {
		return 0, 0, fmt.Errorf("reading the attempt journals: %w", err)
	}
	if agg, err = st.Aggregate(ctx); err != nil {
		return 0, 0, err
	}
	recs, err := st.Batches(ctx)
	if err != nil {
		return 0, 0, err
	}
	var open cost.Nanos
	for _, b := range recs {
		if b.Status.Open() {
			open += cost.Nanos(b.WorstNanos)
		}
	}
	return rundir.SpentBefore(agg) + open, cost.Nanos(agg.Counters[rundir.CounterMaybeBilledNanos]) + open, nil
}

// resultLine is what writeAPIResults reads of a results.jsonl line of a run.
type resultLine struct {
	CustomID string          `json:"custom_id"`
	Result   json.RawMessage `json:"result"`
}

// writeAPIResults turns the run's results into the API's results file:
// {"custom_id","result"} a line, with every request the run did not end
// as canceled (or expired). A run stopped for good leaves its requests
// canceled too: the Message Batches API has no result type for a request
// not sent for another reason, and canceled is the one that says it was
// not sent (nor billed). It returns the counts.
func writeAPIResults(dir string, end batchEnd) (counts, error) {
	var c counts
	var out bytes.Buffer
	done, err := eachRunResult(dir, func(customID string, raw []byte) {
		var l resultLine
		json.Unmarshal(raw, &l)
		var t struct {
			Type string `json:"type"`
		}
		json.Unmarshal(l.Result, &t)
		switch t.Type {
		case "succeeded":
			c.Succeeded++
		default:
			c.Errored++
		}
		id, _ := json.Marshal(customID)
		out.WriteString(`{"custom_id":`)
		out.Write(id)
		out.WriteString(`,"result":`)
		out.Write(l.Result)
		out.WriteString("}\n")
	})
	if err != nil {
		return c, err
	}
	kind := "canceled"
	if end.expired && !end.canceled {
		kind = "expired"
	}
	err = eachUnended(dir, done, func(customID string) {
		id, _ := json.Marshal(customID)
		out.WriteString(`{"custom_id":`)
		out.Write(id)
		out.WriteString(`,"result":{"type":"` + kind + `"}}` + "\n")
		if kind == "canceled" {
			c.Canceled++
		} else {
			c.Expired++
		}
	})
	if err != nil {
		return c, err
	}
	if err := rundir.WriteFileAtomic(filepath.Join(dir, batchResults), out.Bytes(), 0o600); err != nil {
		return c, err
	}
	return c, nil
}

// eachRunResult calls fn with each custom_id's first line of a batch run's
// results (its run directory's results.jsonl; none yet is no line), and
// returns the custom_ids it saw: the results files of both kinds of batch
// are made from it.
func eachRunResult(dir string, fn func(customID string, line []byte)) (map[string]bool, error) {
	done := map[string]bool{}
	f, err := os.Open(filepath.Join(dir, batchRun, "results.jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return done, nil
	}
	if err != nil {
		return done, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.CustomID == "" || done[l.CustomID] {
			continue
		}
		done[l.CustomID] = true
		fn(l.CustomID, sc.Bytes())
	}
	return done, sc.Err()
}

// eachUnended calls fn with each custom_id of the batch's requests that
// the run did not end (not in done).
func eachUnended(dir string, done map[string]bool, fn func(customID string)) error {
	return workload.Scan(filepath.Join(dir, batchRequests), func(it store.Item) error {
		if !done[it.CustomID] {
			fn(it.CustomID)
		}
		return nil
	})
}

// find returns the client's batch id, or answers 404 (another client's
// batch is not found either).
func (g *Gateway) findBatch(w http.ResponseWriter, client, id string) *gwBatch {
	s := g.batches
	s.mu.Lock()
	gb := s.byID[id]
	s.mu.Unlock()
	if gb != nil {
		gb.mu.Lock()
		own := gb.meta.Client == client && gb.meta.OpenAI == nil
		gb.mu.Unlock()
		if own {
			return gb
		}
	}
	writeError(w, http.StatusNotFound, anthropic.ErrNotFound, "message_batch "+strconv.Quote(id)+" not found")
	return nil
}

// appendObject appends gb's message_batch object.
func (g *Gateway) appendObject(buf []byte, r *http.Request, gb *gwBatch) []byte {
	gb.mu.Lock()
	m := gb.meta
	st := gb.st
	c := m.Counts
	if m.Status != statusEnded && st != nil {
		if agg, err := st.Aggregate(context.Background()); err == nil {
			c = counts{Processing: m.N - agg.Succeeded - agg.Errored, Succeeded: agg.Succeeded, Errored: agg.Errored}
		}
	}
	gb.mu.Unlock()
	ts := func(t *time.Time) any {
		if t == nil {
			return nil
		}
		return t.UTC().Format(batchTime)
	}
	var resultsURL any
	if m.Status == statusEnded {
		resultsURL = g.publicBase(r) + "/v1/messages/batches/" + m.ID + "/results"
	}
	obj := struct {
		ID                string `json:"id"`
		Type              string `json:"type"`
		ProcessingStatus  string `json:"processing_status"`
		RequestCounts     counts `json:"request_counts"`
		CreatedAt         string `json:"created_at"`
		ExpiresAt         string `json:"expires_at"`
		EndedAt           any    `json:"ended_at"`
		CancelInitiatedAt any    `json:"cancel_initiated_at"`
		ArchivedAt        any    `json:"archived_at"`
		ResultsURL        any    `json:"results_url"`
	}{m.ID, "message_batch", m.Status, c, m.CreatedAt.UTC().Format(batchTime), m.ExpiresAt.UTC().Format(batchTime),
		ts(m.EndedAt), ts(m.CancelInitiated), nil, resultsURL}
	b, _ := json.Marshal(obj)
	return append(buf, b...)
}

func (g *Gateway) writeBatch(w http.ResponseWriter, r *http.Request, gb *gwBatch) {
	b := g.appendObject(nil, r, gb)
	w.Header().Set("content-type", "application/json")
	w.Header().Set(anthropic.HeaderRequestID, newRequestID())
	w.Write(b)
}

func (g *Gateway) retrieveBatch(w http.ResponseWriter, r *http.Request, client string) {
	if gb := g.findBatch(w, client, r.PathValue("id")); gb != nil {
		g.writeBatch(w, r, gb)
	}
}

func (g *Gateway) cancelBatch(w http.ResponseWriter, r *http.Request, client string) {
	gb := g.findBatch(w, client, r.PathValue("id"))
	if gb == nil {
		return
	}
	ended, err := gb.requestCancel()
	switch {
	case ended:
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "message_batch "+gb.meta.ID+" has already ended and cannot be canceled")
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, anthropic.ErrAPI, "apidispatch gateway: storing the cancel: "+err.Error())
		return
	}
	g.writeBatch(w, r, gb)
}

// requestCancel asks gb's executor to cancel it (durably first): false
// and nil once asked (or asked before), true when gb has ended already,
// or (an OpenAI batch) is finalizing: every request has ended, and the
// API refuses to cancel a finalizing batch.
func (gb *gwBatch) requestCancel() (ended bool, err error) {
	gb.mu.Lock()
	defer gb.mu.Unlock()
	switch {
	case gb.meta.Status == statusEnded, gb.finalizing && gb.meta.OpenAI != nil:
		return true, nil
	}
	switch gb.meta.Status {
	case statusInProgress:
		now := time.Now().UTC()
		gb.meta.Status, gb.meta.CancelInitiated = statusCanceling, &now
		if err := gb.writeMetaLocked(); err != nil {
			gb.meta.Status, gb.meta.CancelInitiated = statusInProgress, nil
			return false, err
		}
		close(gb.cancelReq)
	}
	return false, nil
}

func (g *Gateway) deleteBatch(w http.ResponseWriter, r *http.Request, client string) {
	gb := g.findBatch(w, client, r.PathValue("id"))
	if gb == nil {
		return
	}
	gb.mu.Lock()
	id, ended := gb.meta.ID, gb.meta.Status == statusEnded
	gb.mu.Unlock()
	if !ended {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "message_batch "+id+" cannot be deleted while it is processing; cancel it first")
		return
	}
	s := g.batches
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
	if err := os.RemoveAll(gb.dir); err != nil {
		g.log.Error("deleting a gateway batch", "batch", id, "error", err)
	}
	w.Header().Set("content-type", "application/json")
	w.Header().Set(anthropic.HeaderRequestID, newRequestID())
	b, _ := json.Marshal(map[string]string{"id": id, "type": "message_batch_deleted"})
	w.Write(b)
}

// listBatches serves GET /v1/messages/batches: the client's batches,
// newest first, limit 1–1000 (default 20), after_id (older) or before_id
// (newer), as the API pages them.
func (g *Gateway) listBatches(w http.ResponseWriter, r *http.Request, client string) {
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "limit: Input should be an integer between 1 and 1000")
			return
		}
		limit = n
	}
	after, before := q.Get("after_id"), q.Get("before_id")
	if after != "" && before != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "after_id and before_id cannot both be given")
		return
	}
	s := g.batches
	s.mu.Lock()
	var mine []*gwBatch
	seqOf := map[string]int64{}
	for _, gb := range s.byID {
		gb.mu.Lock()
		if gb.meta.Client == client && gb.meta.OpenAI == nil {
			mine = append(mine, gb)
			seqOf[gb.meta.ID] = gb.meta.Seq
		}
		gb.mu.Unlock()
	}
	s.mu.Unlock()
	slices.SortFunc(mine, func(a, b *gwBatch) int { return int(seqOf[b.meta.ID] - seqOf[a.meta.ID]) }) // newest first
	var page []*gwBatch
	hasMore := false
	cursorOf := func(name, id string) (int64, bool) {
		c, ok := seqOf[id]
		if !ok {
			writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("%s: no message_batch %q", name, id))
		}
		return c, ok
	}
	switch {
	case after != "":
		cur, ok := cursorOf("after_id", after)
		if !ok {
			return
		}
		i := 0
		for i < len(mine) && seqOf[mine[i].meta.ID] >= cur {
			i++
		}
		rest := mine[i:]
		page, hasMore = rest[:min(limit, len(rest))], len(rest) > limit
	case before != "":
		cur, ok := cursorOf("before_id", before)
		if !ok {
			return
		}
		j := len(mine)
		for j > 0 && seqOf[mine[j-1].meta.ID] <= cur {
			j--
		}
		page, hasMore = mine[max(0, j-limit):j], j > limit
	default:
		page, hasMore = mine[:min(limit, len(mine))], len(mine) > limit
	}
	out := []byte(`{"data":[`)
	for i, gb := range page {
		if i > 0 {
			out = append(out, ',')
		}
		out = g.appendObject(out, r, gb)
	}
	out = append(out, `],"has_more":`...)
	out = strconv.AppendBool(out, hasMore)
	first, last := "null", "null"
	if len(page) > 0 {
		first, last = strconv.Quote(page[0].meta.ID), strconv.Quote(page[len(page)-1].meta.ID)
	}
	out = append(out, `,"first_id":`+first+`,"last_id":`+last+`}`...)
	w.Header().Set("content-type", "application/json")
	w.Header().Set(anthropic.HeaderRequestID, newRequestID())
	w.Write(out)
}

// batchResults serves the results_url: the API's JSONL, once ended.
func (g *Gateway) batchResults(w http.ResponseWriter, r *http.Request, client string) {
	gb := g.findBatch(w, client, r.PathValue("id"))
	if gb == nil {
		return
	}
	gb.mu.Lock()
	id, ended := gb.meta.ID, gb.meta.Status == statusEnded
	gb.mu.Unlock()
	if !ended {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "message_batch "+id+" is still processing; its results are available once processing_status is ended")
		return
	}
	f, err := os.Open(filepath.Join(gb.dir, batchResults))
	if err != nil {
		writeError(w, http.StatusInternalServerError, anthropic.ErrAPI, "apidispatch gateway: reading the results: "+err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("content-type", "application/x-jsonl")
	w.Header().Set(anthropic.HeaderRequestID, newRequestID())
	io.Copy(w, f)
}
