package shared

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/rundir"
)

// Gate is one (key, model pool) lane whose budget is shared through Redis
// with every other process on the same key. It implements gate.Gate and
// gate.Waker. It is safe for concurrent use.
//
// Admission is local and costs no round trip: the process holds a lease of
// several slots (its grant) and admits while its requests in flight are
// fewer and the lease is current. The Budget's loop renews the lease a few
// times a second, and at once when the process has used its grant; a 429
// or 529 costs one round trip (the cut and the hold are decided in Redis,
// once per epoch for all).
//
// The lease is fenced: it runs from the moment the renewal that granted it
// was sent, for the TTL less a margin, on this process's monotonic clock
// (and, against a suspended machine whose monotonic clock stood still, on
// its wall clock too). Past it the gate admits nothing until a renewal
// answers, whatever its grant says: a process paused past its lease, or
// cut off from Redis, does not admit on a grant Redis may have given away.
type Gate struct {
	b   *Budget
	cfg gate.LaneConfig
	fp  string
	// keys are the lane's keys in Redis: the organisation's once the key's
	// is known (org), the key's own until then; proc is the name it
	// renews under (the process's, or, when another gate of the process
	// renews on the same keys, its own). Both change only in renew, with
	// renewMu and mu held; read them with mu or renewMu.
	keys []string
	proc string
	org  string
	// pendingOrg is the organisation an answer showed (or the key's
	// budget, moved there by another process), until renew moves the
	// lane to its budget; the gate admits nothing meanwhile (it has had
	// one request out, its probe: see LaneConfig.ProbeFirst).
	pendingOrg string
	// left is what the key's own budget still held for other processes
	// when this one moved from it, to record on the organisation's budget
	// at the next renewal (see moveScript); leftName is "" when there is
	// nothing to record. Under renewMu.
	leftName  string
	leftN     int64
	leftUntil time.Time
	leftSeq   int64

	renewMu sync.Mutex // one renewal at a time

	mu          sync.Mutex
	grant       int     // slots this process may fill
	fair        int     // its fair share of the shared limit
	laneCap     int     // the lane's cap: the smallest any live process asked for
	limit       float64 // the shared AIMD limit
	epoch       uint64  // the shared congestion epoch
	cuts        int     // cuts of the shared limit, by every process
	myCuts      int     // cuts this process made
	holdUntil   time.Time
	heldTotal   time.Duration
	holdFrom    time.Time
	inFlight    int
	maxInFlight int
	starved     bool // refused for want of a slot since the last renewal
	starvedAt   time.Time
	success     bool // a success since the last renewal
	answered    bool // an answer has come back
	// syncedAt: when the first headers synced the mirrors; renewedAt: when
	// the last renewal that answered was sent (see LaneConfig.ProbeFirst
	// and TryAdmit).
	syncedAt  time.Time
	renewedAt time.Time
	// probing: a 429 or 529 without retry-after came back since the last
	// success; past the hold the gate sends one request (the probe,
	// probeOut while it is out) until a success (see gate.Lane).
	probing  bool
	probeOut bool
	// joined: a renewal has answered; joinUntil: this process joined
	// others drawing on the key, and sends no more than its probe until
	// then (see renew).
	joined     bool
	joinUntil  time.Time
	buckets    *gate.Buckets
	share      float64 // of the org's buckets this process stands for (1/active)
	procs      int
	active     int
	n429recent int
	hdr        anthropic.RateLimits
	hdrAt      time.Time
	hdrNew     bool
	disabled   string
	wake       func()

	// The lease: the gate admits on its grant only before both (the first
	// with its monotonic reading, the second wall time only).
	leaseMono time.Time
	leaseWall time.Time
	fenced    bool // refused since the lease ended
	// kept is the earliest Redis may give this process's slots away:
	// the last renewal that answered, sent at kept less its TTL and
	// grace, asked Redis to keep them that long. The gate admits only a
	// request that ends before it if it lasts what the grace assumes
	// (see TryAdmit).
	kept time.Time

	// The longest requests lately (admission to answer), in two rotating
	// windows: the grace Redis keeps this process's slots for after its
	// lease covers them (see graceFor).
	tailCur, tailPrev time.Duration
	tailSince         time.Time
	// admitted counts the requests in flight by their admission time, so
	// that a renewal's grace also covers the oldest one still running.
	admitted map[time.Time]int
	// ends counts the requests in flight by the latest they may end
	// (admission plus requestBound), and boundCur, boundPrev are the
	// longest requestBound of the requests admitted or asked for in the
	// two windows of the tail: the grace covers both (see graceFor).
	ends                map[time.Time]int
	boundCur, boundPrev time.Duration

	// Local fallback, while Redis has not answered since the start.
	local      bool
	localLimit float64
	// dark: Redis stopped answering mid-run (the gate admits nothing
	// until a renewal answers); localMaxInF is the most in flight since.
	dark        bool
	localMaxInF int
}

var (
	_ gate.Gate  = (*Gate)(nil)
	_ gate.Waker = (*Gate)(nil)
)

// laneKeys are the Redis keys of the lane of owner (a key's fingerprint,
// or "org." and an organisation id) and pool.
func laneKeys(owner string, pool string) []string {
	base := keyPrefix + "{" + owner + ":" + pool + "}"
	return []string{base + ":state", base + ":held", base + ":want", base + ":infl", base + ":exp", base + ":r429", base + ":caps"}
}

// newGate makes the gate of lane lc for the key fp, on the budget of the
// organisation org when it is known ("": the key's own until an answer
// shows it).
func newGate(b *Budget, lc gate.LaneConfig, fp, org string) *Gate {
	lc = lc.WithDefaults()
	owner := fp
	if org != "" {
		owner = "org." + org
	}
	g := &Gate{
		b: b, cfg: lc, fp: fp, org: org, proc: b.proc,
		keys:    laneKeys(owner, string(lc.Pool)),
		buckets: gate.NewBuckets(lc),
		share:   1,
		procs:   1,
		limit:   math.Min(float64(lc.Cap), math.Max(lc.MinLimit, math.Floor(float64(lc.Cap)*lc.StartFraction))),
	}
	// Until the first renewal answers, the process has nothing of the shared
	// budget: it starts on the local share (the whole start limit when it
	// has seen no other process).
	g.local = true
	g.localLimit = g.limit
	g.starved = true // a new lane has work: ask for slots at once
	return g
}

// SetWake implements gate.Waker.
func (g *Gate) SetWake(wake func()) {
	g.mu.Lock()
	g.wake = wake
	g.mu.Unlock()
}

func (g *Gate) available() int {
	if g.local {
		return int(g.localLimit)
	}
	return g.grant
}

// leaseCurrent reports whether the lease is current at now; g.mu is held.
func (g *Gate) leaseCurrent(now time.Time) bool {
	return now.Before(g.leaseMono) && now.Round(0).Before(g.leaseWall)
}

// TryAdmit implements gate.Gate. The fence is checked on the gate's
// own clock as well as at now, since now may have been read before the
// process was paused. Once a renewal (or a report of congestion) has found
// Redis out of reach, nothing is admitted until a renewal answers, even
// within the lease: Redis never hears of a request admitted then, and the
// grace it keeps the slots for was sized before it (the API's latency
// varies by more than the quarter the grace adds to the longest request).
//
// Within the lease, a request is admitted only if, lasting what the grace
// this process would ask Redis for now assumes a request lasts, it ends
// before Redis may give the process's slots away (kept, from the grace
// the last renewal sent). While renewals answer, the grace sent a moment
// ago is about the grace now and the TTL Redis adds to it covers the time
// since. A process cut off from Redis cannot send a longer grace: when
// its requests turn out to last longer than the one it sent (an answer,
// or a request still running, older than that grace assumed), it admits
// nothing more until a renewal has sent the longer one.
func (g *Gate) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.disabled != "" {
		return gate.Permit{}, time.Duration(math.MaxInt64), false
	}
	if !g.local {
		if clock := time.Now(); g.dark || !g.leaseCurrent(now) || !g.leaseCurrent(clock) {
			return g.fenceLocked()
		}
	}
	if g.pendingOrg != "" && !g.local {
		// Its organisation is known: nothing more on the key's own
		// budget; the renewal that moves the lane wakes the caller.
		g.starved = true
		return gate.Permit{}, g.b.every, false
	}
	if now.Before(g.holdUntil) {
		return gate.Permit{}, g.holdUntil.Sub(now), false
	}
	if !g.holdFrom.IsZero() {
		g.heldTotal += g.holdUntil.Sub(g.holdFrom)
		g.holdFrom = time.Time{}
	}
	if g.probing && g.probeOut {
		// One probe at a time through a storm: its answer (a release)
		// tells whether the storm is over.
		return gate.Permit{}, 0, false
	}
	if g.inFlight >= g.available() {
		if !g.starved {
			g.starved = true
			if !g.local && (g.grant < g.fair || g.grant == 0) {
				// Short of a fair share: ask now rather than at the next tick.
				g.b.kick()
			}
		}
		if g.inFlight == 0 {
			// No release will wake the engine: the next renewal will
			// (through the Waker), at the latest after this.
			return gate.Permit{}, g.b.every, false
		}
		return gate.Permit{}, 0, false
	}
	bound := g.requestBound(d.Output())
	var grace time.Duration // what the grace would be now (not local)
	if !g.local {
		at := later(now, time.Now())
		// The next renewal asks for a grace this request's bound fits in,
		// if the last one did not.
		g.noteBound(at, bound)
		if grace = g.graceFor(at); at.Add(grace).After(g.kept) {
			return g.fenceLocked()
		}
	}
	if now.Before(g.joinUntil) && (g.inFlight > 0 || g.answered) {
		// Joined others on the key: one probe until they know of it.
		return gate.Permit{}, g.joinUntil.Sub(now), false
	}
	if g.cfg.ProbeFirst && g.inFlight > 0 && (!g.buckets.Mirror().Synced() || (!g.local && !g.dark && g.renewedAt.Before(g.syncedAt))) {
		// One request at a time until the buckets are known from this
		// process's own answer, and until a renewal sent after it has
		// told the process its share of them: each process's first
		// grant would otherwise be sent blind, or on the share it had
		// before others joined (three processes started together drained
		// the buckets at the start of a run). Unlike the in-process lane,
		// a first request that hangs holds the gate for its whole
		// latency (see gate.FirstAnswerWait): Redis gives a silent
		// process's slots away after a grace no longer than its requests
		// seen, so each request out before any answer is one the grace
		// may not cover.
		return gate.Permit{}, 0, false
	}
	n := g.buckets.Need(d)
	if w := g.buckets.Wait(now, n); w > 0 {
		return gate.Permit{}, w, false
	}
	g.buckets.Take(now, n)
	g.inFlight++
	g.maxInFlight = max(g.maxInFlight, g.inFlight)
	if g.local || g.dark {
		g.localMaxInF = max(g.localMaxInF, g.inFlight)
	}
	if g.inFlight >= g.available() {
		g.starved = true
	}
	g.probeOut = g.probing
	p := gate.Permit{Need: n, Demand: d, Epoch: g.epoch, At: now, Probe: g.probing}
	if g.admitted == nil {
		g.admitted = map[time.Time]int{}
	}
	g.admitted[now.Round(0)]++
	if g.ends == nil {
		g.ends = map[time.Time]int{}
	}
	g.ends[now.Round(0).Add(bound)]++
	if !g.local {
		// Not sent past the lease (Permit.Until): the earlier of its two
		// ends, on this process's monotonic clock.
		p.Until = g.leaseMono
		if w := g.leaseWall.Sub(now.Round(0)); w < g.leaseMono.Sub(now) {
			p.Until = now.Add(w)
		}
		// Nor once a request sent then, lasting what the grace assumes,
		// would outlast what Redis keeps the slots for.
		if c := g.kept.Add(-grace); c.Before(p.Until) {
			p.Until = c
		}
	}
	return p, 0, true
}

// fenceLocked refuses an admission past the lease, while Redis is out of
// reach, or past what the grace Redis keeps the slots for covers, and asks
// for a renewal at once;
// the renewal wakes the engine. g.mu is held.
func (g *Gate) fenceLocked() (gate.Permit, time.Duration, bool) {
	if !g.fenced {
		g.fenced = true
		g.starved = true
		g.b.kick()
	}
	return gate.Permit{}, g.b.every, false
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// LearnOrganisation records the organisation id the key reaches, learnt
// outside the lane (upstream.Orgs.Discover): as for an answer's, the
// lane's budget is the organisation's from the next renewal on, now.
func (g *Gate) LearnOrganisation(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if id != "" && g.org == "" && g.pendingOrg == "" {
		g.pendingOrg = id
		g.b.kick()
	}
}

// Done implements gate.Gate.
func (g *Gate) Done(now time.Time, p gate.Permit, fb gate.Feedback) {
	g.mu.Lock()
	g.inFlight--
	if !p.At.IsZero() {
		g.noteLatency(now, now.Sub(p.At))
		at := p.At.Round(0)
		if g.admitted[at] > 1 {
			g.admitted[at]--
		} else {
			delete(g.admitted, at)
		}
		end := at.Add(g.requestBound(p.Demand.Output()))
		if g.ends[end] > 1 {
			g.ends[end]--
		} else {
			delete(g.ends, end)
		}
	}
	g.answered = true
	if id := fb.Limits.OrganizationID; id != "" && g.org == "" && g.pendingOrg == "" {
		// The key's organisation: its budget is the organisation's from
		// the next renewal on, now.
		g.pendingOrg = id
		g.b.kick()
	}
	first := !g.buckets.Mirror().Synced()
	g.buckets.Done(now, p, fb, g.share)
	if fb.Limits.Requests.Present || fb.Limits.Input.Present || fb.Limits.Output.Present {
		g.hdr, g.hdrAt, g.hdrNew = fb.Limits, now, true
		if first {
			g.syncedAt = time.Now()
			// The first headers: renew now, so that the others on the
			// key start from them, and so that this process's share of
			// the buckets is the latest (see renew).
			g.b.kick()
		}
	}
	if p.Probe {
		g.probeOut = false
	}
	o := fb.Outcome
	if o.Kind == anthropic.Success {
		// A success after errors: whatever storm held the gate is over.
		g.success = true
		g.probing = false
	}
	congested := gate.Congested(o)
	if congested && o.HasRetryAfter {
		// Hold at once; Redis will make it everyone's.
		g.holdLocked(now, o.RetryAfter)
	}
	if congested && !o.HasRetryAfter {
		g.probing = true
	}
	cut := o.RateLimited && gate.BucketsRefused(p, fb)
	local := g.local
	if congested && local {
		g.localCongestion(now, p, o, cut)
	}
	wake := g.wake
	g.mu.Unlock()
	if congested && !local {
		g.congestion(now, p, o, cut)
	}
	if wake != nil {
		wake()
	}
}

// tailWindow is how long one window of the latency tail lasts.
const tailWindow = time.Minute

// maxGrace bounds the grace a process asks for, however long its requests.
const maxGrace = 10 * time.Minute

// noteLatency records one request's time from admission to answer; g.mu
// is held.
func (g *Gate) noteLatency(now time.Time, d time.Duration) {
	g.rotateTail(now)
	g.tailCur = max(g.tailCur, d)
}

// noteBound records the requestBound of a request asked for at now; g.mu
// is held.
func (g *Gate) noteBound(now time.Time, b time.Duration) {
	g.rotateTail(now)
	g.boundCur = max(g.boundCur, b)
}

// rotateTail starts a new window of the tail when the current one has
// lasted tailWindow; g.mu is held.
func (g *Gate) rotateTail(now time.Time) {
	if g.tailSince.IsZero() || now.Sub(g.tailSince) >= tailWindow {
		g.tailPrev, g.tailCur, g.tailSince = g.tailCur, 0, now
		g.boundPrev, g.boundCur = g.boundCur, 0
	}
}

// requestBound is how long after its admission a request of maxTokens may
// still be running on the API, in this process's time:
// gate.StillRunningBound scaled by speed, at least the configured grace.
func (g *Gate) requestBound(maxTokens int64) time.Duration {
	speed := g.cfg.Speed
	if speed <= 0 {
		speed = 1
	}
	return max(g.b.grace, time.Duration(float64(gate.StillRunningBound(maxTokens))/speed))
}

// graceFor is how long after this process's lease ends Redis keeps its
// slots, so that requests a paused, cut-off or killed process had in flight
// have ended on the server before another process takes their slots: the
// configured grace, or the bound of the shortest request; a quarter more than the longest request of the last
// minute or two, or than the age of its oldest request still running; the
// longest requestBound asked for in that time; and until the latest bound
// of a request still running (at most maxGrace); g.mu is held. A killed
// process's slots are lost to the others that long: about twice the API's
// time for its longest max_tokens (29 API s for a Sonnet judge's 512).
func (g *Gate) graceFor(now time.Time) time.Duration {
	tail := max(g.tailCur, g.tailPrev)
	// A request still running has lasted at least its age so far.
	for at := range g.admitted {
		tail = max(tail, now.Round(0).Sub(at))
	}
	// The bound of the shortest request at least, so that most requests
	// are admitted without waiting for a renewal to ask for theirs.
	grace := max(g.requestBound(0), tail+tail/4, g.boundCur, g.boundPrev)
	// And may run until its bound.
	for end := range g.ends {
		grace = max(grace, end.Sub(now.Round(0)))
	}
	return min(maxGrace, grace)
}

// holdLocked holds admission for d from now; g.mu is held.
func (g *Gate) holdLocked(now time.Time, d time.Duration) {
	until := now.Add(d)
	if !until.After(g.holdUntil) {
		return
	}
	if g.holdFrom.IsZero() || !now.Before(g.holdUntil) {
		if !g.holdFrom.IsZero() {
			g.heldTotal += g.holdUntil.Sub(g.holdFrom)
		}
		g.holdFrom = now
	}
	g.holdUntil = until
}

// localCongestion is the lane controller's own rule, on the local share,
// while Redis is out of reach (cut: a 429 the buckets explain, see
// gate.BucketsRefused); g.mu is held.
func (g *Gate) localCongestion(now time.Time, p gate.Permit, o anthropic.Outcome, cut bool) {
	if p.Epoch == g.epoch && cut {
		g.localLimit = math.Max(g.cfg.MinLimit, math.Floor(g.localLimit*g.cfg.Decrease))
		g.epoch++
		g.myCuts++
	}
	if !o.HasRetryAfter {
		// The first back-off, past which the gate probes (see Done).
		g.holdLocked(now, gate.ProbeBackoff(1, g.cfg.Speed))
	}
}

// congestion reports a 429 or 529 to Redis, which cuts the shared limit
// once per epoch for a 429 the buckets explain (mayCut) and holds every
// process for the retry-after, or without one for a back-off.
func (g *Gate) congestion(now time.Time, p gate.Permit, o anthropic.Outcome, mayCut bool) {
	ra := int64(-1)
	if o.HasRetryAfter {
		ra = o.RetryAfter.Milliseconds()
	}
	rl := "0"
	if o.RateLimited {
		rl = "1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.b.opTimeout)
	defer cancel()
	g.mu.Lock()
	keys, proc := g.keys, g.proc
	g.mu.Unlock()
	cutOK := "0"
	if mayCut {
		cutOK = "1"
	}
	args := []any{proc, g.cfg.Cap, g.cfg.StartFraction, g.cfg.MinLimit, p.Epoch, rl, ra, g.cfg.Decrease, g.cfg.Speed,
		cutOK, gate.ProbeBackoffMax}
	g.b.trips.Add(1)
	res, err := congestionScript.Run(ctx, g.b.rdb, keys, args...).Slice()
	if err != nil {
		g.b.lost(err)
		g.mu.Lock()
		g.localCongestion(now, p, o, mayCut)
		g.mu.Unlock()
		return
	}
	if len(res) < 5 {
		g.b.lost(fmt.Errorf("unexpected reply %v", res))
		return
	}
	cut := toInt(res[0]) == 1
	g.mu.Lock()
	g.limit = toFloat(res[1])
	g.epoch = uint64(toInt(res[2]))
	g.cuts = int(toInt(res[3]))
	if h := toInt(res[4]); h > 0 {
		g.holdLocked(time.Now(), time.Duration(h)*time.Millisecond)
	}
	if g.grant > int(g.limit) {
		g.grant = int(g.limit)
	}
	if cut {
		g.myCuts++
	}
	limit, epoch := g.limit, g.epoch
	g.mu.Unlock()
	if cut {
		g.b.cfg.Events.Emit(rundir.EventLane, fmt.Sprintf("%s/%s shared limit cut to %.0f (epoch %d)", g.cfg.Org, g.cfg.Pool, limit, epoch),
			map[string]any{"org": g.cfg.Org, "pool": string(g.cfg.Pool), "key": g.fp, "cut": true, "epoch": epoch, "limit": limit, "proc": proc})
	}
}

// renew renews the lease and takes the grant Redis computes.
func (g *Gate) renew(ctx context.Context) error {
	g.renewMu.Lock()
	defer g.renewMu.Unlock()
	if err := g.moveToOrg(ctx); err != nil {
		return err
	}
	now := time.Now()
	sent := now // the lease runs from here, before Redis' copy starts
	g.mu.Lock()
	// A process wants the whole cap while it has lately used all it was
	// granted; otherwise what it has in flight, handing the rest back.
	if g.starved {
		g.starvedAt = now
	}
	g.starved = false
	want := g.inFlight
	if now.Sub(g.starvedAt) < 4*g.b.every {
		want = g.cfg.Cap
		if g.laneCap > 0 {
			want = min(want, g.laneCap)
		}
	}
	succ := "0"
	if g.success {
		succ = "1"
	}
	g.success = false
	oth := int64(0)
	if u := g.buckets.Mirror().OthersUntil(); u.After(now) {
		oth = u.Sub(now).Milliseconds()
	}
	hdr, age := "", int64(0)
	if g.hdrNew {
		h := g.hdr
		hdr = fmt.Sprintf("%d,%d,%d,%d,%d,%d", h.Requests.Limit, h.Requests.Remaining, h.Input.Limit, h.Input.Remaining, h.Output.Limit, h.Output.Remaining)
		age = now.Sub(g.hdrAt).Milliseconds()
		g.hdrNew = false
	}
	inFlight := g.inFlight
	mayHave := max(g.inFlight, g.available())
	disabled := g.disabled != ""
	grace := g.graceFor(now)
	g.mu.Unlock()
	if disabled {
		want = 0
	}
	// Redis keeps this process's slots for the lease and the grace.
	ttl := (g.b.ttl + grace).Milliseconds()
	args := []any{g.proc, g.cfg.Cap, g.cfg.StartFraction, g.cfg.MinLimit, want, mayHave, ttl,
		g.cfg.RampPerSecond, g.cfg.IncreasePerSecond, g.cfg.Speed, succ, oth, hdr, age, inFlight,
		g.leftName, g.leftN, max(0, time.Until(g.leftUntil).Milliseconds()), g.leftSeq}
	g.b.trips.Add(1)
	res, err := acquireScript.Run(ctx, g.b.rdb, g.keys, args...).Slice()
	if err != nil {
		return err
	}
	if len(res) < 14 {
		return fmt.Errorf("unexpected reply %v", res)
	}
	g.leftName = ""
	now = time.Now()
	g.mu.Lock()
	before := g.available()
	wasFenced := g.fenced || g.local
	g.local, g.dark, g.fenced = false, false, false
	// The first renewal since the first answer lets the gate past its
	// probe (see TryAdmit): wake the engine for it.
	shareKnown := g.renewedAt.Before(g.syncedAt) && !sent.Before(g.syncedAt)
	g.renewedAt = sent
	g.leaseMono = sent.Add(g.b.ttl - g.b.margin)
	g.leaseWall = sent.Round(0).Add(g.b.ttl - g.b.margin)
	// Redis' copy runs from when the script ran, after sent: it keeps
	// the slots at least this long.
	g.kept = sent.Add(g.b.ttl + grace)
	g.grant = int(toInt(res[0]))
	g.laneCap = int(toInt(res[12]))
	g.limit = toFloat(res[1])
	g.epoch = uint64(toInt(res[2]))
	g.cuts = int(toInt(res[3]))
	if h := toInt(res[4]); h > 0 {
		g.holdLocked(now, time.Duration(h)*time.Millisecond)
	}
	g.active = int(toInt(res[5]))
	share := 1.0
	if g.active > 0 {
		share = 1 / float64(g.active)
	}
	if !g.joined {
		g.joined = true
		if g.active > 1 {
			// Others are drawing on the key, and mirror the whole of
			// the buckets between them until each renews and learns
			// that one more shares them: send no more than the probe
			// until they have (they renew every quarter of a second,
			// like this process), or together we would believe the
			// buckets hold more than they do.
			g.joinUntil = now.Add(g.b.every + g.b.every/4)
		}
	}
	if share != g.share {
		// The mirrors stand for this process's share of the org's
		// buckets: carry the estimate of others over to the new share,
		// or the next answer would read the difference as others
		// drawing (or giving back) that much at once.
		g.buckets.Rescale(now, share/g.share)
		g.share = share
	}
	L := int(g.limit)
	if g.active > 0 {
		g.fair = L / g.active
	} else {
		g.fair = L
	}
	if o := toInt(res[6]); o > 0 {
		g.buckets.Mirror().NoteOthers(now, now.Add(time.Duration(o)*time.Millisecond))
	}
	g.procs = max(1, int(toInt(res[7])))
	if id, _ := res[13].(string); id != "" && g.org == "" && g.pendingOrg == "" {
		// Another process has moved the key's budget to its
		// organisation's, where this one belongs too (it was granted
		// nothing here).
		g.pendingOrg = id
		g.b.kick()
	}
	if s, _ := res[9].(string); s != "" && !g.cfg.ProbeFirst && !g.buckets.Mirror().Synced() {
		// Limits another process learnt serve this one from its start,
		// when it does not probe first. A gate that probes (the engine's
		// and the gateway's) waits for its own answer instead: the level
		// those headers showed is stale by whatever the others have sent
		// since, as much as the whole bucket at a run's start.
		if a := toInt(res[10]); a >= 0 && time.Duration(a)*time.Millisecond < time.Duration(float64(2*time.Second)/g.cfg.Speed) {
			if rl, ok := parseHdr(s); ok {
				g.buckets.Sync(now, rl, g.share)
			}
		}
	}
	wake := g.wake
	grew := g.available() > before || (wasFenced && g.grant > 0) || shareKnown
	g.mu.Unlock()
	if r := toInt(res[8]); r > 0 {
		g.b.cfg.Events.Emit(rundir.EventLane, fmt.Sprintf("%s/%s: %d slots of a process whose lease expired are back", g.cfg.Org, g.cfg.Pool, r),
			map[string]any{"org": g.cfg.Org, "pool": string(g.cfg.Pool), "key": g.fp, "reclaimed": r})
	}
	if grew && wake != nil {
		wake()
	}
	return nil
}

// moveToOrg moves the lane to its organisation's budget once an answer
// has shown it (Done), or the key's budget has (renew): the key's own
// slots are handed back, the key's budget is marked as moved (a process
// still on it is granted nothing there from now on, and moves too), Redis
// learns the organisation of the key (so a process started later begins on
// the organisation's budget), and the gate starts on the organisation's
// lane as a process joining it, where what the others still hold on the
// key's budget counts until they hand it back or it could be reclaimed
// there: the two budgets never both grant the cap. g.renewMu is held.
func (g *Gate) moveToOrg(ctx context.Context) error {
	g.mu.Lock()
	id, old, proc := g.pendingOrg, g.keys, g.proc
	g.mu.Unlock()
	if id == "" {
		return nil
	}
	res, err := moveScript.Run(ctx, g.b.rdb, old, proc, id).Slice()
	if err != nil {
		return err
	}
	if len(res) < 3 {
		return fmt.Errorf("unexpected reply %v", res)
	}
	g.leftName, g.leftN, g.leftSeq = "~key:"+g.fp, toInt(res[0]), toInt(res[2])
	g.leftUntil = time.Now().Add(time.Duration(toInt(res[1])) * time.Millisecond)
	if err := g.b.rdb.Set(ctx, orgOfPrefix+g.fp, id, orgOfTTL).Err(); err != nil {
		return err
	}
	keys := laneKeys("org."+id, string(g.cfg.Pool))
	g.b.mu.Lock()
	taken := g.b.tagTakenLocked(g, keys[0])
	g.mu.Lock()
	g.keys, g.org, g.pendingOrg = keys, id, ""
	if taken {
		g.proc = g.b.proc + "|" + g.fp
	}
	// Nothing granted until the renewal that follows; what it asks for
	// is what the lane was refused meanwhile (starved), if anything: a
	// lane that stops (a later key of an organisation) asks for nothing.
	g.grant, g.joined = 0, false
	g.mu.Unlock()
	g.b.mu.Unlock()
	return nil
}

// keysNow is the lane's keys in Redis.
func (g *Gate) keysNow() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keys
}

// goDark notes that Redis stopped answering: the gate admits nothing
// until a renewal answers; its requests in flight go on.
func (g *Gate) goDark() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.local || g.dark {
		return
	}
	g.dark = true
	g.localMaxInF = g.inFlight
}

// busy reports whether requests this gate admitted are not Done yet.
func (g *Gate) busy() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight > 0
}

// release hands the slots back (the run is over).
func (g *Gate) release(ctx context.Context) error {
	g.renewMu.Lock()
	defer g.renewMu.Unlock()
	return releaseScript.Run(ctx, g.b.rdb, g.keys, g.proc).Err()
}

// Disable implements gate.Gate.
func (g *Gate) Disable(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.disabled == "" {
		g.disabled = reason
	}
}

// Disabled implements gate.Gate.
func (g *Gate) Disabled() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.disabled
}

// Snapshot implements gate.Gate. Limit is the shared limit and Cuts the
// cuts this process made (the shared count is in Redis, for status).
func (g *Gate) Snapshot(now time.Time) gate.LaneSnapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	held := g.heldTotal
	if !g.holdFrom.IsZero() {
		end := g.holdUntil
		if now.Before(end) {
			end = now
		}
		held += end.Sub(g.holdFrom)
	}
	limit := g.limit
	if g.local {
		limit = g.localLimit
	}
	m := g.buckets.Mirror()
	return gate.LaneSnapshot{
		Org: g.cfg.Org, Pool: string(g.cfg.Pool), Cap: g.cfg.Cap,
		Limit: math.Round(limit*100) / 100, InFlight: g.inFlight, MaxInFlight: g.maxInFlight,
		Cuts: g.myCuts, HeldS: held.Seconds(), Held: now.Before(g.holdUntil),
		Others: m.Others(now), OthersSeen: m.OthersSeen(), Disabled: g.disabled,
	}
}

func parseHdr(s string) (anthropic.RateLimits, bool) {
	f := strings.Split(s, ",")
	if len(f) != 6 {
		return anthropic.RateLimits{}, false
	}
	var v [6]int64
	for i, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return anthropic.RateLimits{}, false
		}
		v[i] = n
	}
	lim := func(l, r int64) anthropic.Limit { return anthropic.Limit{Present: l > 0, Limit: l, Remaining: r} }
	return anthropic.RateLimits{Requests: lim(v[0], v[1]), Input: lim(v[2], v[3]), Output: lim(v[4], v[5])}, true
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseFloat(x, 64)
		return int64(n)
	}
	return 0
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

func (g *Gate) isLocal() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.local
}

func (g *Gate) isDark() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dark
}

func (g *Gate) procsSeen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.procs
}
