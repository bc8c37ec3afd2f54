package gate

import (
	"math"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/ratelimit"
)

// Gate is the part of a lane that decides admission: the concurrency slots
// and the bucket mirrors. The engine consumes only this interface, so that a
// shared implementation (for example one backed by Redis) can make several
// processes on several machines keep one polite budget per key.
//
// Lane is the in-process implementation; Config.NewGate substitutes another.
type Gate interface {
	// TryAdmit admits one request with demand d at now, or reports how long
	// to wait before asking again (0 with ok false: wait for a release).
	TryAdmit(now time.Time, d Demand) (p Permit, wait time.Duration, ok bool)
	// Done returns the permit with what the attempt observed.
	Done(now time.Time, p Permit, fb Feedback)
	// Disable stops the gate for good (the key cannot succeed); Disabled
	// returns the reason, or "".
	Disable(reason string)
	Disabled() string
	// Snapshot describes the gate for progress, events and the summary.
	Snapshot(now time.Time) LaneSnapshot
}

var _ Gate = (*Lane)(nil)

// Waker is implemented by a gate whose admissions can open up without a
// Done (a shared gate granted more slots by another process's release): the
// engine gives it a function to call then, which never blocks.
type Waker interface {
	SetWake(wake func())
}

// Demand describes one request to a gate before it is sent.
type Demand struct {
	EstInput  int64 // local estimate of input tokens
	MaxTokens int64
	// Generates is the most output tokens the request may generate when
	// MaxTokens does not say it (an OpenAI request's max_completion_tokens
	// × n, charged to its one tokens bucket as input): what bounds how long
	// it may run (AttemptBound). 0: MaxTokens.
	Generates int64
}

// Output is the most output tokens d's request may generate: Generates,
// or MaxTokens.
func (d Demand) Output() int64 {
	if d.Generates > 0 {
		return d.Generates
	}
	return d.MaxTokens
}

// Permit is one admitted request. It carries what was reserved so the
// reservation can be corrected by actual usage.
type Permit struct {
	Need   ratelimit.Need // what was reserved
	Demand Demand         // what it was reserved for
	// Epoch is the congestion epoch at admission: a 429 for a request
	// admitted before the latest cut does not cut again.
	Epoch uint64
	// At is when it was admitted (zero: unknown). The headers of its
	// answer may not count our admissions after it yet.
	At time.Time
	// Until, when set, is the end of the lease the gate admitted on (a
	// shared gate's), or, when earlier, the last moment a request sent
	// would still end before its slot may be given away: the engine does
	// not send the request at or after it, so a process paused between
	// admission and sending does not send on a lease whose slots may have
	// been given to another process.
	Until time.Time
	// Probe marks the one request a lane sends after a back-off hold to
	// learn whether a storm is over (see Lane).
	Probe bool
}

// Lapsed reports whether the lease p was admitted on has ended at now: a
// request not yet sent must not go out then (see Until).
func (p Permit) Lapsed(now time.Time) bool {
	return !p.Until.IsZero() && !now.Before(p.Until)
}

// Feedback is what one attempt taught the lane.
type Feedback struct {
	Outcome anthropic.Outcome
	Limits  anthropic.RateLimits
	// Actual is what the request really drew (zero unless the server
	// processed it: a 200 with usage).
	Actual ratelimit.Need
	// Billed reports that Actual is known.
	Billed bool
	// Cost is what the attempt cost (zero unless Billed).
	Cost cost.Nanos
}

// LaneSnapshot is a lane's state at one moment.
type LaneSnapshot struct {
	Org         string  `json:"org"`
	Pool        string  `json:"pool"`
	Cap         int     `json:"cap"`
	Limit       float64 `json:"limit"`
	InFlight    int     `json:"in_flight"`
	MaxInFlight int     `json:"max_in_flight"`
	Cuts        int     `json:"cuts"`
	HeldS       float64 `json:"held_s"`
	Held        bool    `json:"held"`
	Others      bool    `json:"others_seen_now"`
	OthersSeen  int     `json:"others_seen"`
	Disabled    string  `json:"disabled,omitempty"`
	// Pace is the refill the mirrors leave us, per API minute, for
	// requests, input and output tokens (0: not known); Limit429 is the
	// BucketLim is the limit per API minute each mirrors, for comparison.
	Pace      [3]float64 `json:"pace_per_min"`
	BucketLim [3]float64 `json:"limit_per_min"`
	// Attempts and RateLimited429 count this invocation's attempts through
	// the lane and the 429s among them; Rate429 is their ratio. The
	// engine fills them in (a gate leaves them zero).
	Attempts       int64   `json:"attempts"`
	RateLimited429 int64   `json:"rate_limited_429"`
	Rate429        float64 `json:"rate_429"`
}

// LaneConfig tunes a lane controller. Zero fields take the defaults noted.
type LaneConfig struct {
	Org  string
	Pool anthropic.Pool
	// Cap is the polite per-key concurrency cap; the limit never exceeds it.
	Cap int
	// StartFraction of Cap the limit starts at (default 0.25, at least MinLimit).
	StartFraction float64
	// MinLimit is the floor of a multiplicative cut (default 1).
	MinLimit float64
	// RampPerSecond: growth of the limit per second of server time while the
	// lane uses its limit, before the first cut (default Cap/8 per second,
	// so a quarter of the cap reaches the cap in six seconds).
	RampPerSecond float64
	// IncreasePerSecond: additive growth after a cut (default max(1, Cap/50)).
	IncreasePerSecond float64
	// Decrease is the multiplicative cut factor on congestion (default 0.5).
	Decrease float64
	// Speed is how much faster than the wall clock the server's time runs
	// (the simulator's K; 1 for the real API). Every time constant of the
	// controller is divided by it.
	Speed float64
	// Mirror tunes the bucket mirrors (reserve, detection of others).
	Mirror ratelimit.MirrorConfig
	// DefaultOutput is the output-token estimate before any usage is seen.
	DefaultOutput float64
	// ProbeFirst admits one request at a time until the first answer:
	// the mirrors know no bucket before its headers, and a start-up burst
	// sent blind drains a bucket a colleague draws on (a run's 429s came
	// in its first API seconds). The engine's lanes set it; the cost is
	// one latency at the start. A first request still out after
	// FirstAnswerWait lets the lane send one more per such bound.
	ProbeFirst bool

	// scaled: defaults has divided the time constants by Speed already
	// (NewLane and the shared gate take defaults, then NewBuckets does).
	scaled bool
}

// WithDefaults returns c with its zero fields set to the defaults and its
// time constants divided by Speed, as a lane uses it.
func (c LaneConfig) WithDefaults() LaneConfig {
	c.defaults()
	return c
}

func (c *LaneConfig) defaults() {
	if c.Cap <= 0 {
		c.Cap = 40
	}
	if c.StartFraction == 0 {
		c.StartFraction = 0.25
	}
	if c.MinLimit == 0 {
		c.MinLimit = 1
	}
	if c.RampPerSecond == 0 {
		c.RampPerSecond = float64(c.Cap) / 8
	}
	if c.IncreasePerSecond == 0 {
		c.IncreasePerSecond = math.Max(1, float64(c.Cap)/50)
	}
	if c.Decrease == 0 {
		c.Decrease = 0.5
	}
	if c.Speed <= 0 {
		c.Speed = 1
	}
	if c.Mirror.Window == 0 {
		c.Mirror.Window = 10 * time.Second
	}
	if !c.scaled {
		// Once only: taking the defaults twice would shrink the window
		// to 1/K² and the pace's estimate of others to a few API seconds,
		// shorter than a colleague's burst and pause.
		c.Mirror.Window = time.Duration(float64(c.Mirror.Window) / c.Speed)
		c.scaled = true
	}
	c.Mirror.Speed = c.Speed
	if c.DefaultOutput == 0 {
		c.DefaultOutput = 128
	}
}

// Lane is the controller of one (org, model pool): AIMD concurrency limit
// with a time-based warm-up, bucket mirrors with a colleague reserve, and a
// per-lane hold for retry-after. It implements Gate. It is safe for
// concurrent use.
type Lane struct {
	cfg LaneConfig

	mu          sync.Mutex
	limit       float64
	inFlight    int
	maxInFlight int
	slowStart   bool
	lastGrow    time.Time
	boundAt     time.Time // last time a request found every slot taken
	gen         uint64
	cuts        int
	holdUntil   time.Time
	heldTotal   time.Duration
	holdFrom    time.Time
	noRAStreak  int // consecutive congestion epochs of 429s without retry-after
	buckets     *Buckets
	disabled    string
	answered    bool      // an answer has come back (see TryAdmit)
	firstOut    time.Time // before the first answer: when the first request went out
	// probing: a back-off hold (a 429 or 529 without retry-after) has
	// been set since the last success; past the hold the lane sends one
	// request (the probe, probeOut while it is out) until a success.
	probing  bool
	probeOut bool
}

// NewLane returns a lane controller.
func NewLane(cfg LaneConfig) *Lane {
	cfg.defaults()
	start := math.Max(cfg.MinLimit, math.Floor(float64(cfg.Cap)*cfg.StartFraction))
	return &Lane{
		cfg:       cfg,
		limit:     math.Min(start, float64(cfg.Cap)),
		slowStart: true,
		buckets:   NewBuckets(cfg),
	}
}

// Buckets is a lane's view of its org's three buckets: the mirrors, the
// reservations of the requests in flight, and how far estimates have been
// off. Lane and the shared gate both keep one. It is not safe for
// concurrent use: its owner's lock guards it.
type Buckets struct {
	mirror      *ratelimit.Mirror
	outEst      float64 // EWMA of output tokens per request
	outSeen     bool
	inRatio     float64 // EWMA of actual ÷ estimated input tokens
	outstanding float64 // expected output of requests in flight
	speed       float64 // the server's K
}

// NewBuckets returns empty mirrors for a lane configured by cfg (taken
// with its defaults).
func NewBuckets(cfg LaneConfig) *Buckets {
	cfg.defaults()
	return &Buckets{mirror: ratelimit.NewMirror(cfg.Mirror), outEst: cfg.DefaultOutput, inRatio: 1, speed: cfg.Speed}
}

// Mirror returns the bucket mirrors.
func (b *Buckets) Mirror() *ratelimit.Mirror { return b.mirror }

// Need is what a request of demand d is expected to draw: the input
// estimate corrected by how far such estimates have been off on this lane
// (a systematic error would otherwise look like someone else drawing on
// the bucket), and the output seen so far.
func (b *Buckets) Need(d Demand) ratelimit.Need {
	return ratelimit.Need{Requests: 1, Input: float64(d.EstInput) * b.inRatio, Output: math.Min(float64(d.MaxTokens), b.outEst)}
}

// Wait is how long until n fits the mirrors (0: now).
func (b *Buckets) Wait(now time.Time, n ratelimit.Need) time.Duration { return b.mirror.Wait(now, n) }

// Take reserves n for an admitted request.
func (b *Buckets) Take(now time.Time, n ratelimit.Need) {
	b.mirror.Take(now, n)
	b.outstanding += n.Output
}

// Done corrects p's reservation by what fb observed and refreshes the
// mirrors from fb's headers. scale (1 for a lane alone, 1/n for one of n
// processes sharing the key) is the share of the org's buckets this
// lane's mirrors stand for.
func (b *Buckets) Done(now time.Time, p Permit, fb Feedback, scale float64) {
	b.outstanding -= p.Need.Output
	if b.outstanding < 0 {
		b.outstanding = 0
	}
	b.mirror.LandedAt(p.At, p.Need)
	switch {
	case fb.Billed:
		b.mirror.Correct(now, p.Need, fb.Actual)
		const alpha = 0.05
		ratio := 1.0
		if p.Demand.EstInput > 0 {
			ratio = fb.Actual.Input / float64(p.Demand.EstInput)
		}
		if !b.outSeen {
			b.outEst, b.inRatio, b.outSeen = fb.Actual.Output, ratio, true
		} else {
			b.outEst = (1-alpha)*b.outEst + alpha*fb.Actual.Output
			b.inRatio = (1-alpha)*b.inRatio + alpha*ratio
		}
	case fb.Outcome.RateLimited:
		// Refused by a limit: nothing was charged.
		b.mirror.Correct(now, p.Need, ratelimit.Need{})
	default:
		// Not processed (or unknown): give the token reservation back; the
		// request itself may have counted, so keep that charge.
		b.mirror.Correct(now, p.Need, ratelimit.Need{Requests: p.Need.Requests})
	}
	if fb.Limits.Requests.Present || fb.Limits.Input.Present || fb.Limits.Output.Present {
		b.SyncSince(now, p.At, fb.Limits, scale)
	}
}

// Rescale tells the mirrors that the share of the org's buckets this lane
// stands for changed by the factor f (one of n processes sharing a key,
// and n changed).
func (b *Buckets) Rescale(now time.Time, f float64) { b.mirror.Rescale(now, f, b.outstanding) }

// Sync refreshes the mirrors from rate-limit headers, of which this lane
// stands for the share scale.
func (b *Buckets) Sync(now time.Time, rl anthropic.RateLimits, scale float64) {
	b.SyncSince(now, time.Time{}, rl, scale)
}

// SyncSince is Sync from the answer to a request admitted at sentAt (see
// ratelimit.Mirror.SyncSince).
func (b *Buckets) SyncSince(now, sentAt time.Time, rl anthropic.RateLimits, scale float64) {
	if scale > 0 && scale != 1 {
		for _, l := range []*anthropic.Limit{&rl.Requests, &rl.Input, &rl.Output} {
			l.Limit = int64(math.Round(float64(l.Limit) * scale))
			l.Remaining = int64(math.Round(float64(l.Remaining) * scale))
		}
	}
	b.mirror.SyncSince(now, sentAt, rl, b.outstanding)
}

// apiSeconds converts a wall-clock interval to seconds of server time.
func (l *Lane) apiSeconds(d time.Duration) float64 { return d.Seconds() * l.cfg.Speed }

// grow applies additive growth for the time since the last call, if the
// lane was limit-bound in that time.
func (l *Lane) grow(now time.Time) {
	if l.lastGrow.IsZero() {
		l.lastGrow = now
		return
	}
	dt := now.Sub(l.lastGrow)
	if dt <= 0 {
		return
	}
	if !l.boundAt.Before(l.lastGrow) && l.inFlight > 0 {
		rate := l.cfg.IncreasePerSecond
		if l.slowStart {
			rate = l.cfg.RampPerSecond
		}
		l.limit = math.Min(float64(l.cfg.Cap), l.limit+rate*l.apiSeconds(dt))
	}
	l.lastGrow = now
}

// TryAdmit implements Gate.
func (l *Lane) TryAdmit(now time.Time, d Demand) (Permit, time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.buckets.Need(d)
	if l.disabled != "" {
		return Permit{}, time.Duration(math.MaxInt64), false
	}
	if now.Before(l.holdUntil) {
		return Permit{}, l.holdUntil.Sub(now), false
	}
	if !l.holdFrom.IsZero() {
		l.heldTotal += l.holdUntil.Sub(l.holdFrom)
		l.holdFrom = time.Time{}
	}
	l.grow(now)
	if l.probing && l.probeOut {
		// One probe at a time through a storm: its answer (a release)
		// tells whether the storm is over.
		return Permit{}, 0, false
	}
	if l.cfg.ProbeFirst && !l.answered && l.inFlight > 0 {
		// One request until the first answer, and one more for each
		// FirstAnswerWait the first has been out (a first request that
		// hangs does not hold the lane to one for its whole latency).
		if k, next := firstAnswerAllows(l.firstOut, now, firstAnswerWaitAt(l.cfg.Speed)); l.inFlight >= k {
			l.boundAt = now
			return Permit{}, next, false
		}
	}
	if l.inFlight >= int(l.limit) {
		l.boundAt = now
		return Permit{}, 0, false
	}

	if w := l.buckets.Wait(now, n); w > 0 {
		return Permit{}, w, false
	}
	l.buckets.Take(now, n)
	if !l.answered && l.inFlight == 0 {
		l.firstOut = now
	}
	l.inFlight++
	if l.inFlight >= int(l.limit) {
		l.boundAt = now
	}
	l.maxInFlight = max(l.maxInFlight, l.inFlight)
	l.probeOut = l.probing
	return Permit{Need: n, Demand: d, Epoch: l.gen, At: now, Probe: l.probing}, 0, true
}

// Done implements Gate.
func (l *Lane) Done(now time.Time, p Permit, fb Feedback) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grow(now)
	l.inFlight--
	l.answered = true
	l.buckets.Done(now, p, fb, 1)
	if p.Probe {
		l.probeOut = false
	}
	o := fb.Outcome
	if o.Kind == anthropic.Success {
		// A success after errors: whatever storm held the lane is over.
		l.noRAStreak = 0
		l.probing = false
	}
	if Congested(o) {
		l.congestion(now, p, fb)
	}
}

// Congested reports whether o is congestion a lane holds for (a 429 or a
// 529): the lane's hold and probe pace the retries, so an attempt that
// failed so needs no back-off of its own.
func Congested(o anthropic.Outcome) bool { return o.RateLimited || o.Overloaded }

// BucketsRefused reports whether a 429's rate-limit headers show a bucket
// without room for p (or show none): the lane's own draws, or a
// colleague's, emptied it, and the lane's concurrency is what to cut. A
// 429 whose headers show room in every bucket is no bucket's doing (a
// storm, or a limit the headers do not show): cutting the limit would
// leave the lane slow long after it ends, so the lane only holds.
// Remaining token counts are taken 500 low (the API rounds them to the
// thousand).
func BucketsRefused(p Permit, fb Feedback) bool {
	rl := fb.Limits
	if !rl.Requests.Present && !rl.Input.Present && !rl.Output.Present {
		return true
	}
	short := func(l anthropic.Limit, need float64, slack float64) bool {
		return l.Present && float64(l.Remaining)-slack < math.Max(1, need)
	}
	return short(rl.Requests, p.Need.Requests, 0) || short(rl.Input, p.Need.Input, 500) || short(rl.Output, p.Need.Output, 500)
}

// congestion handles a 429 (or 529): one multiplicative cut per congestion
// epoch for a 429 the buckets explain, and a hold for retry-after (or,
// without one, a growing back-off, past which the lane sends one probe at
// a time until a success).
func (l *Lane) congestion(now time.Time, p Permit, fb Feedback) {
	o := fb.Outcome
	newEpoch := p.Epoch == l.gen
	if newEpoch && o.RateLimited && BucketsRefused(p, fb) {
		l.limit = math.Max(l.cfg.MinLimit, math.Floor(l.limit*l.cfg.Decrease))
		l.gen++
		l.cuts++
		l.slowStart = false
	}
	var hold time.Duration
	switch {
	case o.HasRetryAfter:
		hold = o.RetryAfter // already in wall time: the server scales it
	case newEpoch:
		// No retry-after: back off per epoch, and probe, so a storm
		// without retry-after is not hammered.
		l.noRAStreak++
		hold = ProbeBackoff(l.noRAStreak, l.cfg.Speed)
		l.probing = true
	}
	if hold > 0 {
		until := now.Add(hold)
		if until.After(l.holdUntil) {
			if l.holdFrom.IsZero() || !now.Before(l.holdUntil) {
				if !l.holdFrom.IsZero() {
					l.heldTotal += l.holdUntil.Sub(l.holdFrom)
				}
				l.holdFrom = now
			}
			l.holdUntil = until
		}
	}
}

// Disable stops the lane for good with a reason (lane-fatal outcome).
func (l *Lane) Disable(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.disabled == "" {
		l.disabled = reason
	}
}

// Disabled returns the reason the lane stopped, or "".
func (l *Lane) Disabled() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.disabled
}

// Snapshot implements Gate.
func (l *Lane) Snapshot(now time.Time) LaneSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.heldTotal
	if !l.holdFrom.IsZero() {
		end := l.holdUntil
		if now.Before(end) {
			end = now
		}
		held += end.Sub(l.holdFrom)
	}
	return LaneSnapshot{
		Org: l.cfg.Org, Pool: string(l.cfg.Pool), Cap: l.cfg.Cap,
		Limit: math.Round(l.limit*100) / 100, InFlight: l.inFlight, MaxInFlight: l.maxInFlight,
		Cuts: l.cuts, HeldS: held.Seconds(), Held: now.Before(l.holdUntil),
		Others: l.buckets.mirror.Others(now), OthersSeen: l.buckets.mirror.OthersSeen(), Disabled: l.disabled,
		Pace: l.buckets.Pace(), BucketLim: l.buckets.Limits(),
	}
}

// Pace is the refill the mirrors leave us per API minute: requests, input
// and output tokens.
func (b *Buckets) Pace() [3]float64 {
	m := b.mirror
	var p [3]float64
	for i, bk := range []*ratelimit.Bucket{&m.Requests, &m.Input, &m.Output} {
		p[i] = math.Round(bk.Rate() * 60 / b.speedOrOne())
	}
	return p
}

// Limits are the limits per API minute the mirrors know: requests, input
// and output tokens.
func (b *Buckets) Limits() [3]float64 {
	m := b.mirror
	var p [3]float64
	for i, bk := range []*ratelimit.Bucket{&m.Requests, &m.Input, &m.Output} {
		p[i] = math.Round(bk.Limit() / b.speedOrOne())
	}
	return p
}

// speedOrOne is the speed factor, 1 when unset (a zero would make every
// figure NaN, which JSON cannot hold: ab.json was once left unwritten so).
func (b *Buckets) speedOrOne() float64 {
	if b.speed > 0 {
		return b.speed
	}
	return 1
}

// AttemptBound is how long, in API time, the API may run an attempt of
// maxTokens: its own bound for a request it lets run unstreamed (an hour
// for 128,000 tokens, docs/design.md §17), at least AttemptBoundFloor.
// What is still running of a process that died or went silent is held for
// it: by a gateway restarted on its state directory, and by the shared
// budget (shared.Gate) for a process cut off from Redis.
func AttemptBound(maxTokens int64) time.Duration {
	return max(AttemptBoundFloor, time.Duration(float64(time.Hour)*float64(maxTokens)/128_000))
}

// AttemptBoundFloor is the least AttemptBound gives, in API time: a short
// request's latency.
const AttemptBoundFloor = 10 * time.Second

// AttemptTimeout is the longest an attempt runs, in API time: every client
// gives up on it then (and the API refuses an unstreamed request it expects
// to run longer).
const AttemptTimeout = 10 * time.Minute

// StillRunningBound is how long after it was sent an attempt of maxTokens
// may still be running on the API, in API time: twice AttemptBound (the
// simulator's latency, a lognormal about a third of AttemptBound, passes
// twice it for about one long answer in 700), at most AttemptTimeout. The
// slots of what a process left running when it died or went silent are
// held this long, by a gateway restarted on its state directory and by the
// shared budget for a process cut off from Redis: one bound, so the two
// holds agree.
func StillRunningBound(maxTokens int64) time.Duration {
	return min(AttemptTimeout, 2*AttemptBound(maxTokens))
}
