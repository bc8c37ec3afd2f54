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
	level float64   // available at time at; may go negative (over-committed)
	at    time.Time // when level was last computed
	// others is the estimated draw of everyone else, per second: the
	// mirror refills at the limit's rate less it (see SetOthers).
	others float64
	synced time.Time // time of the last Sync
}

// Known reports whether the bucket has seen a limit.
func (b *Bucket) Known() bool { return b.limit > 0 }

// Limit returns the per-minute limit (0 when unknown).
func (b *Bucket) Limit() float64 { return b.limit }

// SetScale sets the bucket's size as a fraction of its limit (see scale).
func (b *Bucket) SetScale(f float64) { b.scale = f }

// Capacity returns the bucket's size: the limit times its scale.
func (b *Bucket) Capacity() float64 {
	if b.scale > 0 {
		return b.limit * b.scale
	}
	return b.limit
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
		b.level = math.Min(b.Capacity(), b.level+b.Rate()*dt.Seconds())
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
	if b.limit <= 0 {
		b.level = 0
	}
}

// Sync replaces the mirror with the server's view: remaining as of now, less
// outstanding (what this client has reserved that the server has not charged
// yet). It returns the unexplained consumption: how much less the server has
// left than the mirror predicted (positive when someone else is drawing on
// the bucket; rounding makes it noisy around zero). For an unknown bucket it
// returns 0.
func (b *Bucket) Sync(now time.Time, limit, remaining int64, outstanding float64) (unexplained float64) {
	if limit <= 0 {
		return 0
	}
	known := b.limit > 0
	b.refill(now)
	predicted := b.level + outstanding
	// The mirror refilled at Rate, less than the limit by what others
	// were assumed to draw: count that back, so what is returned is what
	// others drew against the full refill.
	assumed := 0.0
	if !b.synced.IsZero() {
		assumed = b.others * now.Sub(b.synced).Seconds()
	}
	b.synced = now
	b.limit = float64(limit)
	b.level = math.Min(b.Capacity(), float64(remaining)-outstanding)
	b.at = now
	if !known {
		return 0
	}
	return predicted - float64(remaining) + assumed
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
	b.level = math.Min(b.Capacity(), (b.level+own)*f-own)
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
