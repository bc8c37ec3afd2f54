package sim

import (
	"math"
	"sync"
	"time"
)

// bucket is a token bucket continuously refilled at limit/60 tokens per
// (real) second up to capacity, the model of one rate limit
// (docs/design.md §14). At speed K its limit is already K times the API's.
// Its time is the real time elapsed since the server started, passed in, so
// the maths is tested without sleeping. Its level may go negative (output
// tokens charged after the fact); it then refuses until refilled.
//
// Colleague load (a fraction f of the org's refill used by someone else) is
// an honest client of its own: it draws requests of 1% of the capacity each
// (at least one unit), f·rate on average, either evenly spaced or in random
// bursts of the same mean (load.bursts), and its draws come first. A draw
// that finds the bucket without room (because we drained it) is refused and
// counted (colleagueRefused), and the colleague retries it: its backlog is
// served from the refill before any request of ours, so in the long run it
// takes its share whatever we do, and what a greedy client gains is only
// 429s, its own and the colleague's. It is invisible except through the
// bucket: the level, hence remaining and reset, include its draws.
//
// The zero bucket is disabled (limit 0): it always has room. Not safe for
// concurrent use; poolLimiter guards it.
type bucket struct {
	limit    float64       // the limit per (real) minute: API limit × K
	capacity float64       // burst capacity in tokens
	rate     float64       // refill, tokens per real second
	speed    float64       // K: API seconds per real second
	level    float64       // tokens available now (may be negative)
	last     time.Duration // time of the last refill
	minLevel float64       // lowest level seen after a charge

	// The colleague (see above).
	cOn      bool          // it is drawing (a load is active)
	cNext    time.Duration // time of its next draw
	cBurst   bool          // bursty: in a burst now
	cSwitch  time.Duration // bursty: when the current phase ends
	cPending float64       // refused draws not yet served
	cRng     rng

	colleagueWanted  float64 // what its draws asked for
	colleagueUsed    float64
	colleagueRefused float64 // what its draws asked for and were refused
}

// load is the colleague load on one bucket: the fraction of its refill the
// colleague draws on average, and whether it draws in bursts.
type load struct {
	frac   float64
	bursts bool
}

// Bursty colleagues draw at burstFactor times their mean rate while in a
// burst; bursts and pauses last an exponentially distributed time whose
// means (in API time) keep the mean rate: on 1/burstFactor of the time.
const (
	burstFactor = 4.0
	burstMeanS  = 2.0 // API seconds
	pauseMeanS  = burstMeanS * (burstFactor - 1)
)

// newBucket is a full bucket for an API limit per minute at speed K. The
// limit (as the headers report it) and the refill are K times the API's, so
// a client that reads the limit header and refills at limit/60 per second
// mirrors it exactly; the capacity is the API's own (burst × the API limit),
// so the bucket holds the same minute of server time at every K and a
// sped-up run meets the limits as early, in server time, as a real one.
func newBucket(apiLimit int64, burst, speed float64) bucket {
	if apiLimit <= 0 {
		return bucket{}
	}
	limit := math.Round(float64(apiLimit) * speed)
	c := math.Max(1, math.Round(float64(apiLimit)*burst))
	return bucket{
		limit:    limit,
		capacity: c,
		rate:     limit / 60,
		speed:    speed,
		level:    c,
		minLevel: c,
		cRng:     rng{s: uint64(apiLimit)*0x9e3779b97f4a7c15 + uint64(c)},
	}
}

func (b *bucket) enabled() bool { return b.limit > 0 }

// quantum is the size of one colleague draw.
func (b *bucket) quantum() float64 { return math.Max(1, b.capacity/100) }

// advance refills the bucket to now at its full rate, no colleague.
func (b *bucket) advance(now time.Duration) {
	if dt := (now - b.last).Seconds(); dt > 0 {
		b.level = math.Min(b.capacity, b.level+b.rate*dt)
		b.last = now
	}
}

// exp is an exponentially distributed real duration of mean API seconds.
func (b *bucket) exp(meanS float64) time.Duration {
	return time.Duration(-math.Log(b.cRng.float()) * meanS / b.speed * float64(time.Second))
}

// serveBacklog gives the colleague's refused draws the refill as it comes,
// before anyone else: its retry is admitted as soon as the bucket has room,
// ahead of ours.
func (b *bucket) serveBacklog() {
	if b.cPending > 0 && b.level > 0 {
		take := math.Min(b.cPending, b.level)
		b.level -= take
		b.cPending -= take
		b.colleagueUsed += take
	}
}

// refill brings the bucket to time now, playing the colleague's draws (of
// load c) at their own times first.
func (b *bucket) refill(now time.Duration, c load) {
	if !b.enabled() {
		return
	}
	if c.frac <= 0 {
		b.cOn = false
		b.advance(now)
		return
	}
	q := b.quantum()
	interval := func() time.Duration {
		r := c.frac * b.rate
		if c.bursts {
			r *= burstFactor
		}
		return time.Duration(q / r * float64(time.Second))
	}
	if !b.cOn {
		b.cOn = true
		b.advance(now)
		b.cNext = now + interval()
		b.cBurst = false
		b.cSwitch = now + b.exp(pauseMeanS)
	}
	for b.cNext <= now {
		t := b.cNext
		if c.bursts && !b.cBurst {
			// A pause: the next draw is at the start of the next burst.
			if b.cSwitch > t {
				b.cNext = b.cSwitch
				continue
			}
			b.cBurst = true
			b.cSwitch = t + b.exp(burstMeanS)
		}
		b.advance(t)
		b.serveBacklog()
		b.colleagueWanted += q
		if b.level >= q {
			b.level -= q
			b.colleagueUsed += q
		} else {
			b.colleagueRefused += q
			b.cPending += q
		}
		b.cNext = t + interval()
		if c.bursts && b.cSwitch <= b.cNext {
			b.cBurst = false
			b.cSwitch = b.cSwitch + b.exp(pauseMeanS)
		}
	}
	b.advance(now)
	b.serveBacklog()
}

// need is what a charge of n requires to be admitted: n itself, or a full
// bucket when n is larger than the bucket can ever hold.
func (b *bucket) need(n float64) float64 {
	return math.Min(n, b.capacity)
}

// room reports whether a charge of n may be admitted now.
func (b *bucket) room(n float64) bool {
	return !b.enabled() || n <= 0 || b.level >= b.need(n)
}

// wait is how long until a charge of n would be admitted, with no other use.
func (b *bucket) wait(n float64) time.Duration {
	if b.room(n) {
		return 0
	}
	return time.Duration((b.need(n) - b.level) / b.rate * float64(time.Second))
}

// charge takes n (which may be negative: a refund, capped at capacity).
func (b *bucket) charge(n float64) {
	if !b.enabled() {
		return
	}
	b.level -= n
	if b.level > b.capacity {
		b.level = b.capacity
	}
	if b.level < b.minLevel {
		b.minLevel = b.level
	}
}

// untilFull is the time until the bucket is full again at its true refill
// rate (the reset header).
func (b *bucket) untilFull() time.Duration {
	if b.level >= b.capacity {
		return 0
	}
	return time.Duration((b.capacity - b.level) / b.rate * float64(time.Second))
}

// dim names a rate-limit dimension.
type dim int

const (
	dimNone dim = iota
	dimRequests
	dimInput
	dimOutput
)

// limitView is a consistent reading of one pool's buckets, for headers.
type limitView struct {
	on        bool // the pool is rate limited at all
	level     [3]float64
	limit     [3]float64
	untilFull [3]time.Duration
}

// poolLimiter holds one org's three buckets for one model pool. Safe for
// concurrent use.
type poolLimiter struct {
	mu sync.Mutex
	b  [3]bucket // requests, input tokens, output tokens
}

func newPoolLimiter(l Limits, burst, speed float64) *poolLimiter {
	return &poolLimiter{b: [3]bucket{
		newBucket(l.RPM, burst, speed),
		newBucket(l.ITPM, burst, speed),
		newBucket(l.OTPM, burst, speed),
	}}
}

// admit refills to now and, if all three buckets have room for one request
// of in input tokens and out output tokens (out is max_tokens when reserving,
// 1 when charging actual output later), charges them and returns dimNone.
// Otherwise it charges nothing and returns the first limit that refused and
// the wait until every refusing bucket has room. The view is taken after.
func (p *poolLimiter) admit(now time.Duration, f load, in, out int64) (refused dim, wait time.Duration, v limitView) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cost := [3]float64{1, float64(in), float64(out)}
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	for i := range p.b {
		if w := p.b[i].wait(cost[i]); w > 0 {
			if refused == dimNone {
				refused = dim(i + 1)
			}
			wait = max(wait, w)
		}
	}
	if refused == dimNone {
		for i := range p.b {
			p.b[i].charge(cost[i])
		}
	}
	return refused, wait, p.viewLocked(f)
}

// settle charges the output actually produced less what was reserved at
// admission (a refund when negative) and returns the view after.
func (p *poolLimiter) settle(now time.Duration, f load, outActual, outReserved int64) limitView {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	p.b[2].charge(float64(outActual - outReserved))
	return p.viewLocked(f)
}

// view refills to now and reads the buckets without charging.
func (p *poolLimiter) view(now time.Duration, f load) limitView {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	return p.viewLocked(f)
}

func (p *poolLimiter) viewLocked(f load) limitView {
	var v limitView
	for i := range p.b {
		b := &p.b[i]
		if !b.enabled() {
			continue
		}
		v.on = true
		v.level[i] = b.level
		v.limit[i] = b.limit
		v.untilFull[i] = b.untilFull()
	}
	return v
}

// PoolStats is the state of one org's buckets for one model pool.
type PoolStats struct {
	Pool string `json:"pool"`
	// Limit, Remaining and MinRemaining are indexed requests, input tokens,
	// output tokens. Limit is per real minute (the API limit × K).
	// Remaining is the bucket level now; MinRemaining the
	// lowest level after any charge since the start (it may be negative for
	// output tokens charged after the fact). A colleague reserve was left
	// free when MinRemaining stayed above it.
	Limit        [3]int64 `json:"limit"`
	Remaining    [3]int64 `json:"remaining"`
	MinRemaining [3]int64 `json:"min_remaining"`
	// ColleagueWanted is what the colleague's draws asked for,
	// ColleagueUsed what it got, and ColleagueRefused what its draws asked
	// for and were refused because the bucket had no room (it retried
	// them); ColleagueRefused ÷ ColleagueWanted is the share of its draws
	// we made it wait for.
	ColleagueWanted  [3]int64 `json:"colleague_wanted"`
	ColleagueUsed    [3]int64 `json:"colleague_used"`
	ColleagueRefused [3]int64 `json:"colleague_refused"`
}

func (p *poolLimiter) stats(now time.Duration, f load, pool string) PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PoolStats{Pool: pool}
	for i := range p.b {
		b := &p.b[i]
		b.refill(now, f)
		s.Limit[i] = int64(b.limit)
		s.Remaining[i] = int64(math.Floor(b.level))
		s.MinRemaining[i] = int64(math.Floor(b.minLevel))
		s.ColleagueWanted[i] = int64(b.colleagueWanted)
		s.ColleagueUsed[i] = int64(b.colleagueUsed)
		s.ColleagueRefused[i] = int64(math.Ceil(b.colleagueRefused))
	}
	return s
}
