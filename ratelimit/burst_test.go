package ratelimit

import (
	"math"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// server is a server's request bucket as the API and the simulator keep
// one: a limit per minute refilled continuously up to a size, remaining
// shown rounded down, and reset the moment it will be full (to the
// millisecond, as the simulator shows it when sped up).
type server struct {
	limit, size, level float64
	at                 time.Time
}

func (s *server) advance(now time.Time) {
	s.level = math.Min(s.size, s.level+s.limit/60*now.Sub(s.at).Seconds())
	s.at = now
}

func (s *server) headers(now time.Time) anthropic.RateLimits {
	s.advance(now)
	until := time.Duration((s.size - s.level) / (s.limit / 60) * float64(time.Second))
	reset := now.Add(until).Round(time.Millisecond)
	if reset.Nanosecond() == 0 {
		reset = reset.Add(time.Millisecond) // not whole seconds
	}
	return anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: int64(s.limit),
		Remaining: int64(math.Floor(math.Max(0, s.level))), Reset: reset}}
}

// TestMirrorLearnsASmallBurst is issue 29's first finding at the mirror:
// a key of 30 RPM whose bucket holds 3. A mirror that took the bucket for
// a minute of the limit refilled past the server's during a pause, read
// the refill the server spilt as someone else drawing on the org, and
// kept a colleague's reserve and a fifth of the pace. It now learns the
// size from the reset header, sees nobody, and sends what the key allows
// without a 429.
func TestMirrorLearnsASmallBurst(t *testing.T) {
	t.Parallel()
	m := NewMirror(MirrorConfig{})
	s := &server{limit: 30, size: 3, level: 3, at: t0}
	one := Need{Requests: 1}
	now := t0
	// ideal is the same key drained by a sender that sees its level: what
	// the key allows.
	ideal := &server{limit: 30, size: 3, level: 3, at: t0}
	sent, late, allowed := 0, 0, 0
	for step := range 240_000 { // 4 minutes at 1 ms
		now = now.Add(time.Millisecond)
		sec := step / 1000
		if sec%60 >= 40 && sec < 180 {
			continue // a 20 s pause each minute: the bucket fills and spills
		}
		if ideal.advance(now); ideal.level >= 1 {
			ideal.level--
			allowed++
		}
		if m.Wait(now, one) > 0 {
			continue
		}
		s.advance(now)
		if s.level < 1 {
			t.Fatalf("at %.3f s: sent with %.2f left (a 429)", now.Sub(t0).Seconds(), s.level)
		}
		m.Take(now, one)
		s.level--
		sent++
		if sec >= 180 {
			late++
		}
		// Answered at once.
		m.Landed(one)
		m.SyncSince(now, now, s.headers(now), 0)
		if m.Others(now) {
			t.Fatalf("at %.3f s: others seen on a key alone (capacity %.2f)", now.Sub(t0).Seconds(), m.Requests.Capacity())
		}
	}
	if c := m.Requests.Capacity(); c < 2.9 || c > 3 {
		t.Errorf("capacity %.2f, want the bucket's 3", c)
	}
	// The last minute, past the prior of others: the refill less the 3 %
	// margin, give or take a request.
	if late < 27 {
		t.Errorf("%d sent in the last minute, want ≥ 27 of the 30 the key allows", late)
	}
	// The whole run: the bursts after each pause too, not only the pace.
	if float64(sent) < 0.9*float64(allowed) {
		t.Errorf("%d sent in 4 minutes, want ≥ 0.9 of the %d the key allows", sent, allowed)
	}
}

// TestBucketKeepsItsLevelInsideARoundedReading: a token count rounded to
// the thousand says only that the level is within 500 of it; the mirror
// keeps its own level where it is inside that range, and is moved to the
// range's end otherwise, the difference then unexplained.
func TestBucketKeepsItsLevelInsideARoundedReading(t *testing.T) {
	t.Parallel()
	var b Bucket
	b.Read(t0, Reading{Limit: 60_000, Remaining: 10_000, Exact: true}, 0)
	b.Take(t0, 9_300) // 700 left
	if u := b.Read(t0, Reading{Limit: 60_000, Remaining: 1_000, Rounded: true}, 0); u != 0 || b.Level(t0) != 700 {
		t.Fatalf("inside the range: unexplained %v level %v, want 0 and 700", u, b.Level(t0))
	}
	if u := b.Read(t0, Reading{Limit: 60_000, Remaining: 0, Rounded: true}, 0); u != 200 || b.Level(t0) != 500 {
		t.Fatalf("above the range: unexplained %v level %v, want 200 and 500", u, b.Level(t0))
	}
	// Our own draws in flight widen the range downwards: the server may
	// not have charged them yet.
	b.Take(t0, 300) // 200 left, 300 of it in flight
	if u := b.Read(t0, Reading{Limit: 60_000, Remaining: 500, Exact: true}, 300); u != 0 || b.Level(t0) != 200 {
		t.Fatalf("in flight: unexplained %v level %v, want 0 and 200", u, b.Level(t0))
	}
}

// TestMirrorStalledOutputIsNotOutstanding: requests hung in a storm of
// timeouts reserved their output until the timeout, and the mirror took
// the output bucket for empty long after the storm. Output of requests in
// flight for longer than any answer lately took is no longer reserved.
func TestMirrorStalledOutputIsNotOutstanding(t *testing.T) {
	t.Parallel()
	m := NewMirror(MirrorConfig{})
	out := func(rem int64) anthropic.RateLimits {
		return anthropic.RateLimits{Output: anthropic.Limit{Present: true, Limit: 6_000, Remaining: rem}}
	}
	m.Sync(t0, out(6_000), 0)
	hung := Need{Requests: 1, Output: 100}
	for range 10 {
		m.Take(t0, hung) // never answered: the storm
	}
	now := t0.Add(5 * time.Second)
	m.Take(now, hung)
	done := now.Add(100 * time.Millisecond)
	m.LandedAt(now, hung)
	m.Correct(done, hung, hung)
	// The server charged the answered request's 100; the hung ones'
	// output, not at all. Ten of them are still reserved (outstanding).
	m.SyncSince(done, now, out(5_900), 10*hung.Output)
	if got := m.Output.Level(done); got < 5_800 {
		t.Fatalf("output level %.0f after the storm, want the server's 5,900 (the hung requests' output not held back)", got)
	}
}
