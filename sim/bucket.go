package sim

import (
	"math"
	"sync"
	"time"
)

// bucket is a token bucket continuously refilled at limit/60 tokens per
// (real) second up to capacity, the model of one rate limit
// (anthropic-api.md §1). At speed K its limit is already K times the API's.
// Its time is the real time elapsed since the server started, passed in, so
// the maths is tested without sleeping. Its level may go negative (output
// tokens charged after the fact); it then refuses until refilled.
//
// Colleague load (a fraction f of the org's budget used by others) is modelled
// as colleagues that keep f·capacity busy, so the bucket refills only to
// (1−f)·capacity and they are visible in remaining, and that draw f·rate in
// requests of 1% of the capacity each. A colleague request is served only if
// the bucket holds its size at that moment; when our own use has drained the
// bucket it is refused, and colleagueRefused counts what was refused. A
// client that leaves a reserve free never starves them.
//
// The zero bucket is disabled (limit 0): it always has room. Not safe for
// concurrent use; poolLimiter guards it.
type bucket struct {
	limit    float64       // the limit per (real) minute: API limit × K
	capacity float64       // burst capacity in tokens
	rate     float64       // refill, tokens per real second
	level    float64       // tokens available now (may be negative)
	last     time.Duration // time of the last refill
	minLevel float64       // lowest level seen after a charge

	colleagueWant    float64 // colleague demand accrued, not yet drawn
	colleagueUsed    float64
	colleagueRefused float64
}

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
		level:    c,
		minLevel: c,
	}
}

func (b *bucket) enabled() bool { return b.limit > 0 }

// effective returns the capacity and refill rate left to us while colleagues
// use the fraction f.
func (b *bucket) effective(f float64) (capacity, rate float64) {
	return b.capacity * (1 - f), b.rate * (1 - f)
}

// refill brings the bucket to time now with colleague fraction f.
func (b *bucket) refill(now time.Duration, f float64) {
	if !b.enabled() {
		return
	}
	dt := (now - b.last).Seconds()
	if dt <= 0 {
		return
	}
	b.last = now
	avail := b.level + b.rate*dt
	if f > 0 {
		b.colleagueWant += f * b.rate * dt
		q := math.Max(1, b.capacity/100)
		if n := math.Floor(b.colleagueWant / q); n > 0 {
			b.colleagueWant -= n * q
			got := math.Min(n, math.Floor(math.Max(0, avail)/q))
			avail -= got * q
			b.colleagueUsed += got * q
			b.colleagueRefused += (n - got) * q
		}
	}
	if c, _ := b.effective(f); avail > c {
		avail = c
	}
	b.level = avail
}

// need is what a charge of n requires to be admitted: n itself, or a full
// bucket when n is larger than the bucket can ever hold.
func (b *bucket) need(n, f float64) float64 {
	c, _ := b.effective(f)
	return math.Min(n, c)
}

// room reports whether a charge of n may be admitted now.
func (b *bucket) room(n, f float64) bool {
	return !b.enabled() || n <= 0 || b.level >= b.need(n, f)
}

// wait is how long until a charge of n would be admitted, with no other use.
func (b *bucket) wait(n, f float64) time.Duration {
	if b.room(n, f) {
		return 0
	}
	_, r := b.effective(f)
	if r <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration((b.need(n, f) - b.level) / r * float64(time.Second))
}

// charge takes n (which may be negative: a refund, capped at capacity).
func (b *bucket) charge(n, f float64) {
	if !b.enabled() {
		return
	}
	b.level -= n
	if c, _ := b.effective(f); b.level > c {
		b.level = c
	}
	if b.level < b.minLevel {
		b.minLevel = b.level
	}
}

// untilFull is the time until the bucket is full again (the reset header).
func (b *bucket) untilFull(f float64) time.Duration {
	c, r := b.effective(f)
	if b.level >= c || r <= 0 {
		return 0
	}
	return time.Duration((c - b.level) / r * float64(time.Second))
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
func (p *poolLimiter) admit(now time.Duration, f float64, in, out int64) (refused dim, wait time.Duration, v limitView) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cost := [3]float64{1, float64(in), float64(out)}
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	for i := range p.b {
		if w := p.b[i].wait(cost[i], f); w > 0 {
			if refused == dimNone {
				refused = dim(i + 1)
			}
			wait = max(wait, w)
		}
	}
	if refused == dimNone {
		for i := range p.b {
			p.b[i].charge(cost[i], f)
		}
	}
	return refused, wait, p.viewLocked(f)
}

// settle charges the output actually produced less what was reserved at
// admission (a refund when negative) and returns the view after.
func (p *poolLimiter) settle(now time.Duration, f float64, outActual, outReserved int64) limitView {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	p.b[2].charge(float64(outActual-outReserved), f)
	return p.viewLocked(f)
}

// view refills to now and reads the buckets without charging.
func (p *poolLimiter) view(now time.Duration, f float64) limitView {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.b {
		p.b[i].refill(now, f)
	}
	return p.viewLocked(f)
}

func (p *poolLimiter) viewLocked(f float64) limitView {
	var v limitView
	for i := range p.b {
		b := &p.b[i]
		if !b.enabled() {
			continue
		}
		v.on = true
		v.level[i] = b.level
		v.limit[i] = b.limit
		v.untilFull[i] = b.untilFull(f)
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
	// ColleagueUsed and ColleagueRefused are what colleague load drew and
	// what it wanted but could not get because the bucket was empty.
	ColleagueUsed    [3]int64 `json:"colleague_used"`
	ColleagueRefused [3]int64 `json:"colleague_refused"`
}

func (p *poolLimiter) stats(now time.Duration, f float64, pool string) PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PoolStats{Pool: pool}
	for i := range p.b {
		b := &p.b[i]
		b.refill(now, f)
		s.Limit[i] = int64(b.limit)
		s.Remaining[i] = int64(math.Floor(b.level))
		s.MinRemaining[i] = int64(math.Floor(b.minLevel))
		s.ColleagueUsed[i] = int64(b.colleagueUsed)
		s.ColleagueRefused[i] = int64(math.Ceil(b.colleagueRefused))
	}
	return s
}
