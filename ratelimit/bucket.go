// Package ratelimit mirrors, on the client, the token buckets an API server
// keeps for an organisation: requests, input tokens and output tokens per
// minute, continuously refilled at limit/60 per second. A mirror is refreshed
// from every response's anthropic-ratelimit-* headers and, in between,
// refilled and charged locally, so a client can tell before sending whether a
// request would fit.
//
// Time is always an argument: nothing here reads the clock, sleeps or starts
// a goroutine, so the maths is tested without waiting. Types are not safe for
// concurrent use; their owner serialises access.
package ratelimit

import (
	"math"
	"time"
)

// Bucket mirrors one server-side bucket. The zero value is an unknown bucket:
// it has no limit yet and admits everything until the first Sync.
type Bucket struct {
	limit float64 // per minute; 0 = unknown
	// scale is the bucket's size as a fraction of the per-minute limit
	// (0 means 1: the bucket holds one minute). A server whose clock runs K
	// times faster reports K times the limit but still holds one minute of
	// its own time: scale 1/K.
	scale float64
	level float64 // available at time at; may go negative (over-committed)
	// alone is what the server's bucket would hold had nobody else drawn
	// on it since the last Sync: level refilled at the whole limit. The
	// next Sync's unexplained consumption is measured against it.
	alone float64
	at    time.Time // when level was last computed
	// others is the estimated draw of everyone else, per second: the
	// mirror refills at the limit's rate less it (see SetOthers).
	others float64
	// sizeLow and sizeHigh bound the bucket's size as the headers have
	// shown it (0: not yet; a minute of the limit is assumed): see
	// learnSize.
	sizeLow, sizeHigh float64
	// read is when the headers of the newest answer read were written
	// (see Read).
	read time.Time
	// spilt: alone reached the smallest size the bucket may have since
	// the last Read, so the server's may have spilt refill (see Read).
	spilt bool
}

// Known reports whether the bucket has seen a limit.
func (b *Bucket) Known() bool { return b.limit > 0 }

// Limit returns the per-minute limit (0 when unknown).
func (b *Bucket) Limit() float64 { return b.limit }

// SetScale sets the bucket's size as a fraction of its limit (see scale).
func (b *Bucket) SetScale(f float64) { b.scale = f }

// Capacity returns the bucket's size: a minute of the limit (times its
// scale), or less when the headers have shown it smaller (see learnSize):
// the largest size they showed it surely holds, or while they have shown
// none, the smallest it may hold.
func (b *Bucket) Capacity() float64 {
	c := b.limit
	if b.scale > 0 {
		c = b.limit * b.scale
	}
	switch {
	case b.sizeLow > 0:
		c = math.Min(c, b.sizeLow)
	case b.sizeHigh > 0:
		c = math.Min(c, b.sizeHigh)
	}
	return c
}

// smallest is the smallest size the bucket may have: its capacity while
// the headers have shown nothing of it (a minute of the limit is taken as
// known), else the largest size they showed it surely holds.
func (b *Bucket) smallest() float64 {
	if b.sizeHigh == 0 {
		return b.Capacity()
	}
	return math.Min(b.Capacity(), b.sizeLow)
}

// learnSize learns the bucket's size from one answer's headers. The
// server refills a bucket continuously at limit/60 a second up to its
// size, and reset is when it will be full: a bucket with remaining left at
// now holds remaining + limit/60 × (reset − now). A burst smaller than a
// minute of the limit is allowed and the API does not publish it; a
// mirror that took the bucket for a minute of the limit refilled past the
// server's, and read the refill the server spilt as someone else drawing
// on the org.
//
// One answer bounds the size both ways, as far as remaining (see Reading)
// and reset are exact; a reset in whole seconds (the API's) is rounded
// up. A level below zero shows as 0, which bounds the size from above
// only. The bucket is taken to hold the largest lower bound seen or, with
// none yet, the smallest upper bound; a minute of the limit at most.
// Without a reset (absent) nothing is learnt. A new limit scales what was
// learnt (a burst is a share of its limit).
func (b *Bucket) learnSize(now time.Time, r Reading) {
	if r.Reset.IsZero() {
		return
	}
	if b.limit > 0 && float64(r.Limit) != b.limit {
		f := float64(r.Limit) / b.limit
		b.sizeLow *= f
		b.sizeHigh *= f
	}
	rate := float64(r.Limit) / 60
	ahead := math.Max(0, r.Reset.Sub(now).Seconds())
	lo, hi := r.interval()
	if high := hi + rate*ahead; b.sizeHigh == 0 || high < b.sizeHigh {
		b.sizeHigh = high
	}
	if !math.IsInf(lo, -1) {
		if r.Reset.Nanosecond() == 0 {
			ahead = math.Max(0, ahead-1)
		}
		b.sizeLow = math.Max(b.sizeLow, lo+rate*ahead)
	}
}

// Rate is the refill left to us, per second: limit/60 less what others
// are estimated to draw (never below zero).
func (b *Bucket) Rate() float64 { return math.Max(0, b.limit/60-b.others) }

// SetOthers sets the estimated draw of everyone else, per second, from
// now on: the bucket refills at Rate.
func (b *Bucket) SetOthers(now time.Time, perSecond float64) {
	b.refill(now)
	b.others = math.Max(0, perSecond)
}

// Others is the estimated draw of everyone else, per second.
func (b *Bucket) Others() float64 { return b.others }

func (b *Bucket) refill(now time.Time) {
	if b.limit <= 0 {
		b.at = now
		return
	}
	if dt := now.Sub(b.at); dt > 0 {
		c := b.Capacity()
		b.level = math.Min(c, b.level+b.Rate()*dt.Seconds())
		b.alone = math.Min(c, b.alone+b.limit/60*dt.Seconds())
		if b.alone >= b.smallest() {
			b.spilt = true
		}
		b.at = now
	}
}

// Level returns what is available at now.
func (b *Bucket) Level(now time.Time) float64 {
	b.refill(now)
	return b.level
}

// Take charges n at now (n may be negative to give back).
func (b *Bucket) Take(now time.Time, n float64) {
	b.refill(now)
	b.level = math.Min(b.Capacity(), b.level-n)
	b.alone = math.Min(b.Capacity(), b.alone-n)
	if b.limit <= 0 {
		b.level, b.alone = 0, 0
	}
}

// Sync is Read of an exact remaining and no reset: the server's view,
// remaining as of now, of which up to outstanding (what this client has
// drawn that the server may not have charged yet) may still be to come.
// It returns the unexplained consumption: how much less the server has
// left than the mirror predicted (positive when someone else is drawing on
// the bucket). For an unknown bucket it returns 0.
func (b *Bucket) Sync(now time.Time, limit, remaining int64, outstanding float64) (unexplained float64) {
	return b.Read(now, Reading{Limit: limit, Remaining: remaining, Exact: true}, outstanding)
}

// Reading is what one answer's headers show of a bucket.
type Reading struct {
	Limit, Remaining int64
	// Reset is when the bucket will be full again (zero: not shown).
	Reset time.Time
	// Exact: Remaining is the level; otherwise it is the level rounded
	// down to a whole unit (a count), or with Rounded to the nearest
	// thousand (token counts on the API).
	Exact, Rounded bool
	// MayBeNegative: the level may be below zero, shown as 0 (output
	// tokens, charged after the fact).
	MayBeNegative bool
	// Sent is when the request these headers answer was sent (zero:
	// unknown); see Bucket.written.
	Sent time.Time
}

// interval is the range the level is in, given what r shows.
func (r Reading) interval() (lo, hi float64) {
	rem := float64(r.Remaining)
	switch {
	case r.Exact:
		lo, hi = rem, rem
	case r.Rounded:
		lo, hi = math.Max(0, rem-500), rem+500
	default:
		lo, hi = rem, rem+1
	}
	if r.Remaining <= 0 && r.MayBeNegative {
		lo = math.Inf(-1)
	}
	return lo, hi
}

// written is when the headers of r, read at now, were written, at the
// latest. A reset to the millisecond (the simulator's when sped up) and
// the size learnt tell: the level shown refills to the size at reset.
// The headers are no older than the request they answer (Sent), so a
// server's clock behind ours costs at most the request's latency. A
// reset in whole seconds (the API's) is not precise enough to tell; the
// headers are then taken as written now.
func (b *Bucket) written(now time.Time, r Reading) time.Time {
	if r.Reset.IsZero() || r.Reset.Nanosecond() == 0 || r.Sent.IsZero() || b.sizeLow <= 0 {
		return now
	}
	_, hi := r.interval()
	t := r.Reset.Add(-time.Duration(math.Max(0, b.sizeLow-hi) / (float64(r.Limit) / 60) * float64(time.Second)))
	switch {
	case t.After(now):
		return now
	case t.Before(r.Sent):
		return r.Sent
	}
	return t
}

// Read brings the mirror to what an answer's headers show of the bucket:
// its size (see learnSize), and its level as of now. What the bucket will
// hold once the server has charged what this client has reserved is a
// range: the shown level's (rounding), less up to outstanding (what this
// client has drawn that the server may not have charged yet: requests on
// their way, output still being written). The mirror keeps its own
// prediction where that is inside the range, and is moved to its nearest
// end otherwise, so that neither rounding nor our own draws in flight read
// as anyone's draw or lose the mirror what it knew. It returns the
// unexplained consumption: how far the server's bucket is below the
// mirror's prediction (positive when someone else is drawing on it). For
// an unknown bucket it returns 0 and takes the bottom of the range.
func (b *Bucket) Read(now time.Time, r Reading, outstanding float64) (unexplained float64) {
	if r.Limit <= 0 {
		return 0
	}
	b.learnSize(now, r)
	known := b.limit > 0
	lo, hi := r.interval()
	lo -= outstanding
	if known {
		// The level shown is of the moment the headers were written,
		// which may be well before now (an answer is timed when it
		// arrives, and may wait for a busy process to read it), and
		// answers are heard of in any order. The mirror's time never
		// goes back (a clock moved back to an older answer's time
		// refilled the interval again at the next step, and the mirror
		// believed the bucket held more than it did: 429s on a key
		// nobody else used); since the headers, the server's bucket has
		// refilled for as long at most. An answer older than one already
		// read bounds the level from above only: our draws after its
		// headers that the newer answers stood for are no longer
		// outstanding.
		at := b.written(now, r)
		end := now
		if b.at.After(end) {
			end = b.at
		}
		hi += float64(r.Limit) / 60 * end.Sub(at).Seconds()
		if at.Before(b.read) {
			lo = math.Inf(-1)
		} else {
			b.read = at
		}
		now = end
	}
	b.refill(now)
	// Against what the bucket would hold had nobody else drawn (the
	// mirror's own level refilled at Rate, less than the limit by what
	// others were assumed to draw), so what is returned is what others
	// drew against the full refill; both stop at the bucket's size, as
	// the server's does, so a full bucket's spilt refill is nobody's.
	//
	// The server's bucket is no larger than the mirror's, but may be
	// smaller (its size is known within bounds): a bucket that may have
	// filled up meanwhile may have spilt refill the mirror's did not.
	// What it shows below the prediction is then taken as spilt, not
	// someone's draw, as far as the size is unsure. Others drawing on a
	// full bucket keep nobody waiting.
	predicted := b.alone
	unsure := b.Capacity() - b.smallest()
	spilt := b.spilt
	b.limit = float64(r.Limit)
	c := b.Capacity()
	b.at = now
	b.spilt = false
	if !known {
		b.level = math.Min(c, float64(r.Remaining)-outstanding)
		b.alone = b.level
		return 0
	}
	b.level = math.Min(c, math.Min(math.Max(b.level, lo), hi))
	b.alone = math.Min(c, math.Min(math.Max(b.alone, lo), hi))
	var u float64
	switch {
	case predicted > hi:
		u = predicted - hi
	case predicted < lo:
		u = predicted - lo
	}
	if spilt && u > 0 {
		u -= math.Min(u, unsure)
	}
	return u
}

// Rescale changes the share of the server's bucket this mirror stands for
// by the factor f (a mirror of one of n processes sharing a key stands for
// 1/n of it, and n changed): the limit, the estimate of others and what is
// left are multiplied by f, all but own, this client's draws not yet
// answered, which are its own whatever the share.
func (b *Bucket) Rescale(now time.Time, f, own float64) {
	if b.limit <= 0 || f <= 0 || f == 1 {
		return
	}
	b.refill(now)
	b.limit *= f
	b.others *= f
	b.sizeLow *= f
	b.sizeHigh *= f
	b.level = math.Min(b.Capacity(), (b.level+own)*f-own)
	b.alone = math.Min(b.Capacity(), (b.alone+own)*f-own)
}

// Wait returns how long until the bucket has need available with floor left
// over, refilling at Rate: 0 when it fits now, and
// math.MaxInt64 when it never can (need+floor above the limit and the bucket
// is known). An unknown bucket always fits.
func (b *Bucket) Wait(now time.Time, need, floor float64) time.Duration {
	if b.limit <= 0 {
		return 0
	}
	b.refill(now)
	short := need + floor - b.level
	if short <= 0 {
		return 0
	}
	if c := b.Capacity(); need+floor > c {
		// It can never fit with the floor kept; admit once the bucket is
		// full, so a single huge request is not starved forever.
		short = c - b.level
		if short <= 0 {
			return 0
		}
	}
	// When others seem to take it all, wait as for a twentieth of the
	// limit: the estimate moves, and a sync will tell.
	r := math.Max(b.Rate(), b.limit/60/20)
	return time.Duration(math.Ceil(short / r * float64(time.Second)))
}
