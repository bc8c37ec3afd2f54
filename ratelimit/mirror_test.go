package ratelimit

import (
	"math"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func TestBucketRefillAndWait(t *testing.T) {
	t.Parallel()
	var b Bucket
	if w := b.Wait(t0, 1e9, 0); w != 0 {
		t.Fatalf("unknown bucket should admit, waited %v", w)
	}
	b.Sync(t0, 600, 0, 0) // 600/min = 10/s, empty
	if w := b.Wait(t0, 10, 0); w != time.Second {
		t.Fatalf("wait for 10 at 10/s = %v, want 1s", w)
	}
	if got := b.Level(t0.Add(30 * time.Second)); got != 300 {
		t.Fatalf("level after 30 s = %v", got)
	}
	if got := b.Level(t0.Add(10 * time.Minute)); got != 600 {
		t.Fatalf("level capped at limit: %v", got)
	}
	// A need above the limit with a floor still gets admitted once full.
	if w := b.Wait(t0.Add(10*time.Minute), 590, 60); w != 0 {
		t.Fatalf("full bucket should admit a request that only fits without the floor, waited %v", w)
	}
}

func TestBucketSyncUnexplained(t *testing.T) {
	t.Parallel()
	var b Bucket
	b.Sync(t0, 6000, 6000, 0)
	b.Take(t0, 100)
	// The server saw our 100 and someone else's 250.
	u := b.Sync(t0, 6000, 5650, 0)
	if math.Abs(u-250) > 1e-9 {
		t.Fatalf("unexplained = %v, want 250", u)
	}
	if b.Level(t0) != 5650 {
		t.Fatalf("level after sync %v", b.Level(t0))
	}
}

func headers(req, reqRem, in, inRem, out, outRem int64) anthropic.RateLimits {
	return anthropic.RateLimits{
		Requests: anthropic.Limit{Present: true, Limit: req, Remaining: reqRem},
		Input:    anthropic.Limit{Present: true, Limit: in, Remaining: inRem},
		Output:   anthropic.Limit{Present: true, Limit: out, Remaining: outRem},
	}
}

// TestMirrorAloneUsesFullLimit: with nobody else on the org the mirror
// admits down to zero remaining.
func TestMirrorAloneUsesFullLimit(t *testing.T) {
	t.Parallel()
	m := NewMirror(MirrorConfig{})
	m.Sync(t0, headers(600, 20, 1e6, 1e6, 1e5, 1e5), 0)
	if m.Others(t0) {
		t.Fatal("others seen on the first sync")
	}
	n := Need{Requests: 1, Input: 100, Output: 50}
	for i := 0; i < 20; i++ {
		if w := m.Wait(t0, n); w != 0 {
			t.Fatalf("request %d waited %v with room left", i, w)
		}
		m.Take(t0, n)
	}
	if w := m.Wait(t0, n); w <= 0 {
		t.Fatal("admitted past the limit")
	}
}

// TestMirrorColleagueReserve simulates a server bucket shared with a
// colleague who wants 40% of the requests limit. Both are refused when the
// bucket is empty. Once the mirror sees the colleague it must leave 15% of
// the limit free, so the colleague is never refused again.
func TestMirrorColleagueReserve(t *testing.T) {
	t.Parallel()
	const limit = 6000 // per minute = 100/s
	m := NewMirror(MirrorConfig{})
	server := float64(limit)
	now := t0
	m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: limit}}, 0)
	ours, oursLate, refusedUs, colleagueRefusedLate := 0, 0, 0, 0
	owed := 0.0
	for step := 0; step < 4500; step++ {
		dt := 10 * time.Millisecond
		now = now.Add(dt)
		server = math.Min(limit, server+limit/60*dt.Seconds())
		owed += 0.4 * limit / 60 * dt.Seconds()
		for owed >= 1 { // the colleague's requests
			owed--
			if server >= 1 {
				server--
			} else if step > 3000 {
				colleagueRefusedLate++
			}
		}
		for m.Wait(now, Need{Requests: 1}) == 0 {
			m.Take(now, Need{Requests: 1})
			if server >= 1 {
				server--
				ours++
				if step > 3000 {
					oursLate++
				}
			} else {
				refusedUs++
				m.Take(now, Need{Requests: -1}) // a refused request is not charged
				m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: int64(server)}}, 0)
				break
			}
		}
		m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: int64(server)}}, 0)
	}
	if !m.Others(now) {
		t.Fatal("colleague not detected")
	}
	if colleagueRefusedLate > 0 {
		t.Fatalf("after detection the colleague was refused %d times", colleagueRefusedLate)
	}
	// In steady state we still get the 60% of the refill the colleague leaves.
	if rate := float64(oursLate) / 15; rate < 55 {
		t.Fatalf("our steady rate %.1f/s is too low (want ~60/s)", rate)
	}
	t.Logf("ours %d (%.1f/s), refused us %d", ours, float64(ours)/30, refusedUs)
}

// TestMirrorLateResponseIsNotAColleague: a response whose headers were
// computed a while before we read it looks like someone else's draw; the next
// response cancels it, and no reserve is kept.
func TestMirrorLateResponseIsNotAColleague(t *testing.T) {
	t.Parallel()
	const limit = 600000 // 10,000/s
	m := NewMirror(MirrorConfig{})
	now := t0
	server := float64(limit)
	m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: limit}}, 0)
	for step := 0; step < 200; step++ {
		now = now.Add(time.Millisecond)
		server = math.Min(limit, server+limit/60*0.001)
		for range 5 {
			m.Take(now, Need{Requests: 1})
			server--
		}
		reported := server
		if step%20 == 10 {
			reported -= 5000 // headers half a second stale
		}
		m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: int64(reported)}}, 0)
		if m.Others(now) {
			t.Fatalf("step %d: a late response was taken for a colleague", step)
		}
	}
}

// TestBucketOfASpedUpServer: a server running K=10 times faster reports
// ten times the limit but its bucket holds one minute of its own time; with
// Speed set the mirror neither stalls nor sees others.
func TestBucketOfASpedUpServer(t *testing.T) {
	t.Parallel()
	const limit, size = 60000, 6000 // 1,000/s refill, 6,000 burst
	m := NewMirror(MirrorConfig{Speed: 10})
	server := float64(size)
	now := t0
	m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: size}}, 0)
	ours := 0
	for step := 0; step < 3000; step++ {
		now = now.Add(time.Millisecond)
		server = math.Min(size, server+limit/60*0.001)
		for m.Wait(now, Need{Requests: 1}) == 0 && server >= 1 {
			m.Take(now, Need{Requests: 1})
			server--
			ours++
		}
		m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: int64(server)}}, 0)
		if m.Others(now) {
			t.Fatalf("step %d: others seen with nobody else on the bucket", step)
		}
	}
	// 6,000 burst + 3 s × 1,000/s refill.
	if ours < 8900 {
		t.Fatalf("sent %d, want about 9,000", ours)
	}
}
