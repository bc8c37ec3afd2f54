// Package gatetest is the conformance suite every gate.Gate passes: the
// in-process Lane and the Redis-shared gate alike. An implementation's test
// calls Run with a constructor.
package gatetest

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
)

// New makes a fresh gate for one test (each call a lane no other test
// shares) and returns it with settle, which brings the gate up to date
// with any state it keeps elsewhere (a no-op for an in-process gate; one
// lease renewal for a shared one).
type New func(t *testing.T, lc gate.LaneConfig) (g gate.Gate, settle func())

var one = gate.Demand{EstInput: 100, MaxTokens: 50}

// fill admits at now until the gate refuses.
func fill(g gate.Gate, now time.Time) []gate.Permit {
	var ps []gate.Permit
	for range 10000 {
		p, _, ok := g.TryAdmit(now, one)
		if !ok {
			break
		}
		ps = append(ps, p)
	}
	return ps
}

func ok200() gate.Feedback {
	return gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}}
}

func rl429(ra time.Duration) gate.Feedback {
	return gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable, Status: 429, RateLimited: true, RetryAfter: ra, HasRetryAfter: ra > 0}}
}

func overloaded529() gate.Feedback {
	return gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable, Status: 529, Overloaded: true}}
}

// limits are rate-limit headers whose request bucket holds requestsLeft
// of 1,000 and whose token buckets are full.
func limits(requestsLeft int64) anthropic.RateLimits {
	return anthropic.RateLimits{
		Requests: anthropic.Limit{Present: true, Limit: 1000, Remaining: requestsLeft},
		Input:    anthropic.Limit{Present: true, Limit: 1_000_000, Remaining: 1_000_000},
		Output:   anthropic.Limit{Present: true, Limit: 100_000, Remaining: 100_000},
	}
}

// Option changes how Run runs the suite.
type Option func(*suite)

type suite struct{ wallClock bool }

// WallClock runs the suite on the wall clock instead of a synctest bubble's
// fake one. A gate whose state lives on a server with its own clock (the
// Redis-shared gate: its scripts read Redis's TIME) needs it, since the
// bubble's fake time does not reach the server; the lanes run at speed 100
// there, so the back-off holds it waits out are short. On the wall clock the
// suite checks timings within a margin; in the bubble it checks them exactly.
func WallClock() Option { return func(s *suite) { s.wallClock = true } }

// Run runs the suite. By default each test runs in a testing/synctest
// bubble, where time.Now and time.Sleep use a fake clock that moves only
// when every goroutine in the bubble is blocked: waits are exact and take
// no wall time. The gate must then be one that keeps its time in process
// (New is called inside the bubble); pass WallClock otherwise.
func Run(t *testing.T, newGate New, opts ...Option) {
	var st suite
	for _, o := range opts {
		o(&st)
	}
	// exact says the clock is the bubble's: nothing moves between two
	// time.Now calls unless the test sleeps.
	exact := !st.wallClock
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if st.wallClock {
				f(t)
				return
			}
			synctest.Test(t, f)
		})
	}
	cfg := func(capacity int, start float64) gate.LaneConfig {
		return gate.LaneConfig{Org: "conf", Pool: anthropic.PoolSonnet4, Cap: capacity, StartFraction: start, Speed: 100}
	}

	run("StartsAtQuarterCap", func(t *testing.T) {
		// At speed 1 the ramp (cap/8 = 12.5 a server second) adds a slot
		// only after 80 ms of a full gate. On the wall clock the fill takes
		// real time (a Redis round trip per admission), so the check allows
		// what the ramp can have added in the time the fill measurably
		// took; in the bubble that is nothing and the count is exact.
		c := cfg(100, 0)
		c.Speed = 1
		g, settle := newGate(t, c)
		settle()
		start := time.Now()
		n := len(fill(g, time.Now()))
		ramp := int(math.Floor(12.5 * time.Since(start).Seconds()))
		if n < 25 || n > 25+ramp {
			t.Fatalf("admitted %d at start, want 25 (a quarter of the cap) plus at most %d the ramp added while filling", n, ramp)
		}
	})

	run("NeverAboveCap", func(t *testing.T) {
		g, settle := newGate(t, cfg(40, 1))
		settle()
		ps := fill(g, time.Now())
		settle()
		ps = append(ps, fill(g, time.Now())...)
		if len(ps) != 40 {
			t.Fatalf("admitted %d with a cap of 40", len(ps))
		}
		s := g.Snapshot(time.Now())
		if s.InFlight != 40 || s.MaxInFlight != 40 || s.Limit > 40 || s.Cap != 40 {
			t.Fatalf("snapshot %+v", s)
		}
	})

	run("DoneFreesASlot", func(t *testing.T) {
		g, settle := newGate(t, cfg(10, 1))
		settle()
		ps := fill(g, time.Now())
		if len(ps) != 10 {
			t.Fatalf("admitted %d, want 10", len(ps))
		}
		g.Done(time.Now(), ps[0], ok200())
		settle()
		if _, _, ok := g.TryAdmit(time.Now(), one); !ok {
			t.Fatal("no slot after a request finished")
		}
		if s := g.Snapshot(time.Now()); s.InFlight != 10 {
			t.Fatalf("in flight %d, want 10", s.InFlight)
		}
	})

	run("OneCutPerEpoch", func(t *testing.T) {
		c := cfg(100, 1)
		c.Speed = 1 // the increase after a cut stays small
		g, settle := newGate(t, c)
		settle()
		ps := fill(g, time.Now())
		if len(ps) != 100 {
			t.Fatalf("admitted %d, want 100", len(ps))
		}
		// Twenty 429s of requests admitted in one epoch: one cut.
		for _, p := range ps[:20] {
			g.Done(time.Now(), p, rl429(0))
		}
		settle()
		// (On the wall clock the limit may have grown a little since the
		// cut: the increase goes on in wall time.)
		s := g.Snapshot(time.Now())
		if s.Cuts != 1 || s.Limit < 50 || s.Limit >= 51 || exact && s.Limit != 50 {
			t.Fatalf("cuts %d limit %v, want 1 cut to 50", s.Cuts, s.Limit)
		}
		// A 429 for a request admitted after the cut is a new epoch.
		for _, p := range ps[20:] {
			g.Done(time.Now(), p, ok200())
		}
		var p gate.Permit
		start := time.Now()
		deadline := start.Add(5 * time.Second)
		for {
			settle()
			var ok bool
			var wait time.Duration
			if p, wait, ok = g.TryAdmit(time.Now(), one); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("nothing admitted after the back-off")
			}
			time.Sleep(min(max(wait, time.Millisecond), 10*time.Millisecond))
		}
		// The first back-off without a retry-after is 0.5 s of server
		// time (this lane runs at speed 1).
		if held := time.Since(start); exact && held != 500*time.Millisecond {
			t.Fatalf("admitted after %v, want the 0.5 s back-off", held)
		}
		g.Done(time.Now(), p, rl429(0))
		settle()
		if s := g.Snapshot(time.Now()); s.Cuts != 2 || s.Limit < 25 || s.Limit >= 27 || exact && s.Limit != 25 {
			t.Fatalf("after a new epoch: cuts %d limit %v, want 2 and 25", s.Cuts, s.Limit)
		}
	})

	run("RetryAfterHolds", func(t *testing.T) {
		g, settle := newGate(t, cfg(10, 1))
		settle()
		ps := fill(g, time.Now())
		g.Done(time.Now(), ps[0], rl429(3*time.Second))
		settle()
		_, wait, ok := g.TryAdmit(time.Now(), one)
		if ok || wait < 2*time.Second || wait > 3*time.Second {
			t.Fatalf("after a 3 s retry-after: ok %v wait %v", ok, wait)
		}
		if s := g.Snapshot(time.Now()); !s.Held {
			t.Fatalf("snapshot not held: %+v", s)
		}
		if !exact {
			return
		}
		// On the fake clock the hold is the retry-after to the nanosecond.
		if wait != 3*time.Second {
			t.Fatalf("wait %v, want 3s", wait)
		}
		time.Sleep(wait - time.Nanosecond)
		if _, _, ok := g.TryAdmit(time.Now(), one); ok {
			t.Fatal("admitted a nanosecond before the retry-after ended")
		}
		time.Sleep(time.Nanosecond)
		if _, _, ok := g.TryAdmit(time.Now(), one); !ok {
			t.Fatal("still held when the retry-after ended")
		}
	})

	// Issue 29: after a storm of 529s (or 429s) without retry-after the
	// lane held up to 8 s of server time past its end, request after
	// request; a lane now backs off at most ProbeBackoffMax (1 s), sends
	// one probe at a time meanwhile, and reopens at the first success.
	run("StormWithoutRetryAfterEndsWithinTheLongestBackoff", func(t *testing.T) {
		// At speed 5 the 20 s storm lasts 4 s of this machine's time.
		c := cfg(10, 1)
		c.Speed = 5
		g, settle := newGate(t, c)
		settle()
		speed := c.Speed
		end := time.Now().Add(time.Duration(20 * float64(time.Second) / speed))
		deadline := time.Now().Add(10 * time.Second)
		probes, checked := 0, false
		var first time.Time
		for first.IsZero() {
			if time.Now().After(deadline) {
				t.Fatalf("nothing admitted after the storm: %+v", g.Snapshot(time.Now()))
			}
			settle()
			p, wait, ok := g.TryAdmit(time.Now(), one)
			if !ok {
				time.Sleep(min(max(wait, time.Millisecond), 10*time.Millisecond))
				continue
			}
			now := time.Now()
			if now.Before(end) {
				probes++
				if probes == 2 && !checked {
					// Past the first hold: one probe at a time.
					checked = true
					if q, _, ok := g.TryAdmit(now, one); ok {
						g.Done(now, q, ok200())
						t.Fatal("a second request admitted while the probe was out")
					}
				}
				g.Done(now, p, overloaded529())
				continue
			}
			first = now
			g.Done(now, p, ok200())
		}
		late := first.Sub(end).Seconds() * speed
		t.Logf("%d probes in the storm; reopened %.2f s of server time after it", probes, late)
		// The storm ends half a second after a probe's 529 (holds of 0.5,
		// then 1 s): a lane whose hold reached 2 s reopened 1.5 s after it.
		// The first answer after a storm must come within 3 s of its end,
		// and the request itself takes a second or two.
		allowed := 1.25
		if !exact {
			// On the wall clock, what waits on a server adds its real
			// time: a renewal a loaded machine's Redis answered late
			// (a shared lane admits nothing until one answers) reopened
			// a CI run 225 ms late. 300 ms of it are allowed; the defect
			// this checks held 8 s of server time.
			allowed += 0.3 * speed
		}
		if late > allowed {
			t.Fatalf("reopened %.2f s of server time after the storm, want within %.2f s", late, allowed)
		}
		if probes > 25 {
			t.Fatalf("%d requests sent into a 20 s storm, want one per back-off (about 20)", probes)
		}
		// Reopened: the whole limit at once.
		if n := len(fill(g, time.Now())); n != 10 {
			t.Fatalf("admitted %d after the success, want the limit, 10", n)
		}
	})

	// A 429 whose headers show room in every bucket is no bucket's doing
	// (a storm): the lane holds for its retry-after but does not cut, or
	// it would stay slow long after the storm. One that finds a bucket
	// empty cuts.
	run("A429WithRoomHoldsButDoesNotCut", func(t *testing.T) {
		c := cfg(100, 1)
		c.Speed = 1 // the increase after a cut stays small
		g, settle := newGate(t, c)
		settle()
		ps := fill(g, time.Now())
		fb := rl429(time.Second)
		fb.Limits = limits(900)
		g.Done(time.Now(), ps[0], fb)
		settle()
		if s := g.Snapshot(time.Now()); s.Cuts != 0 || s.Limit < 100 || !s.Held {
			t.Fatalf("after a 429 with room: %+v, want held, no cut, limit 100", s)
		}
		fb.Limits = limits(0)
		g.Done(time.Now(), ps[1], fb)
		settle()
		if s := g.Snapshot(time.Now()); s.Cuts != 1 || s.Limit >= 51 {
			t.Fatalf("after a 429 with the request bucket empty: %+v, want one cut to 50", s)
		}
	})

	run("Disable", func(t *testing.T) {
		g, settle := newGate(t, cfg(10, 1))
		settle()
		g.Disable("key revoked")
		g.Disable("second reason")
		_, wait, ok := g.TryAdmit(time.Now(), one)
		if ok || wait != time.Duration(math.MaxInt64) {
			t.Fatalf("disabled gate: ok %v wait %v", ok, wait)
		}
		if g.Disabled() != "key revoked" || g.Snapshot(time.Now()).Disabled != "key revoked" {
			t.Fatalf("reason %q", g.Disabled())
		}
	})

	run("RampsWhenUsed", func(t *testing.T) {
		g, settle := newGate(t, cfg(100, 0))
		settle()
		fill(g, time.Now())
		// At speed 100 the ramp (cap/8 per server second) reaches the cap
		// in 60 ms of wall time while the gate stays full.
		start := time.Now()
		deadline := start.Add(5 * time.Second)
		for step := 1; ; step++ {
			time.Sleep(20 * time.Millisecond)
			settle()
			fill(g, time.Now())
			s := g.Snapshot(time.Now())
			if want := min(100, 25+25*float64(step)); exact && s.Limit != want {
				t.Fatalf("limit %v after %d ms, want %v", s.Limit, 20*step, want)
			}
			if s.InFlight == 100 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("never ramped to the cap: %+v", g.Snapshot(time.Now()))
			}
		}
		if took := time.Since(start); exact && took != 60*time.Millisecond {
			t.Fatalf("ramped to the cap in %v, want 60ms (25 to 100 at 1,250 a second)", took)
		}
	})
}
