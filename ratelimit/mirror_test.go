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
// admits down to the small floor (5 % of the bucket) it always keeps free.
func TestMirrorAloneUsesFullLimit(t *testing.T) {
	t.Parallel()
	m := NewMirror(MirrorConfig{})
	m.Sync(t0, headers(600, 50, 1e6, 1e6, 1e5, 1e5), 0)
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
	// 6,000 burst less the 5 % floor + 3 s × 1,000/s refill.
	if ours < 8600 {
		t.Fatalf("sent %d, want about 8,700", ours)
	}
}

// TestPaceEstimatesRefillLeftToUs: a server bucket of 60 requests refilled
// at 20 a second (a 60-RPM org at K=20), a colleague drawing 40 % of the
// refill first, and a client whose answers come back 75 ms after it sends
// (their headers stamped on completion, so admissions made meanwhile are
// not in them). The mirror's pace settles at the 60 % left to us less the
// margin, the server's remaining never touches zero, and the client gets
// its share.
func TestPaceEstimatesRefillLeftToUs(t *testing.T) {
	t.Parallel()
	const k = 20.0
	const limit, size = 60 * k, 60.0
	rate := limit / 60
	for _, colleague := range []float64{0, 0.4} {
		m := NewMirror(MirrorConfig{Speed: k, Window: time.Duration(10 / k * float64(time.Second))})
		server := size
		type flight struct {
			sent, done time.Time
		}
		var inFlight []flight
		now := t0
		last := now
		cAcc := 0.0
		ours, refused, lowest := 0, 0, size
		m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: size}}, 0)
		var paceSum float64
		var paceN int
		for step := 0; step < 60000; step++ { // 60 s at 1 ms
			now = now.Add(time.Millisecond)
			dt := now.Sub(last).Seconds()
			last = now
			server = math.Min(size, server+rate*dt)
			// The colleague draws first, a request at a time.
			lowest = math.Min(lowest, server)
			cAcc += colleague * rate * dt
			for cAcc >= 1 {
				cAcc--
				if server >= 1 {
					server--
				} else {
					refused++
				}
			}
			// Answers whose time has come: headers stamped now.
			for len(inFlight) > 0 && !inFlight[0].done.After(now) {
				f := inFlight[0]
				inFlight = inFlight[1:]
				m.Landed(Need{Requests: 1})
				m.SyncSince(now, f.sent, anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: limit, Remaining: int64(server)}}, 0)
			}
			for m.Wait(now, Need{Requests: 1}) == 0 {
				m.Take(now, Need{Requests: 1})
				if server < 1 {
					t.Fatalf("colleague %v step %d: sent with remaining %.2f (a 429)", colleague, step, server)
				}
				server--
				ours++
				inFlight = append(inFlight, flight{now, now.Add(75 * time.Millisecond)})
			}
			if step >= 20000 {
				paceSum += m.Requests.Rate()
				paceN++
			}
		}
		want := (1 - colleague) * rate
		pace := paceSum / float64(paceN)
		if pace < 0.9*want || pace > 1.0*want {
			t.Errorf("colleague %v: pace %.2f/s, want about %.2f/s (the refill left to us less the margin)", colleague, pace, want)
		}
		if got := float64(ours-int(size)) / 60; got < 0.95*want || got > 1.02*want {
			t.Errorf("colleague %v: sent %.2f/s after the first bucket, want %.2f/s", colleague, got, want)
		}
		if refused > 0 || lowest < 1 {
			t.Errorf("colleague %v: its draws refused %d times, lowest remaining it met %.2f; want 0 and ≥ 1", colleague, refused, lowest)
		}
	}
}

// TestPaceCountsWhatWasInFlightAtTheFirstSync: the server had counted the
// requests in flight when the mirror first learnt the bucket, so each of
// their answers reads one unit less than predicted. Before the fix those
// units were never balanced and the estimate of a colleague drawing 40 %
// of the refill read zero for a minute after the start.
func TestPaceCountsWhatWasInFlightAtTheFirstSync(t *testing.T) {
	t.Parallel()
	m := NewMirror(MirrorConfig{})
	one := Need{Requests: 1}
	const inFlight = 50
	for range inFlight {
		m.Take(t0, one)
	}
	server := 60.0 - inFlight // the server counted them on arrival
	now := t0
	for i := range inFlight {
		m.Landed(one)
		m.SyncSince(now, t0, headers(60, int64(math.Floor(server)), 0, 0, 0, 0), 0)
		if i == inFlight-1 {
			break
		}
		dt := 200 * time.Millisecond
		now = now.Add(dt)
		server = math.Min(60, server+(1-0.4)*dt.Seconds()) // the colleague takes 0.4/s
	}
	if got := m.Requests.Others(); got < 0.3 {
		t.Fatalf("others estimated at %.3f/s after 10 s, want ≈ 0.4/s (≥ 0.3)", got)
	}
}

// A mirror standing for a share of the bucket (one of n processes on a
// key) is rescaled when n changes: the next sync at the new share then
// reads only what others really drew, not the change of share.
func TestBucketRescaleCarriesTheEstimateOver(t *testing.T) {
	var b Bucket
	b.Sync(t0, 60, 60, 0)
	b.SetOthers(t0, 0.2)
	b.Take(t0, 30)
	// A second process joins: this one now stands for half.
	b.Rescale(t0, 0.5, 0)
	if b.Limit() != 30 || math.Abs(b.Level(t0)-15) > 1e-9 || math.Abs(b.Others()-0.1) > 1e-9 {
		t.Fatalf("rescaled to half: limit %v level %v others %v, want 30, 15, 0.1", b.Limit(), b.Level(t0), b.Others())
	}
	// Five seconds on, the server refilled 5 and others drew 1 (0.2/s):
	// remaining 34 of 60, 17 of this half.
	u := b.Sync(t0.Add(5*time.Second), 30, 17, 0)
	if math.Abs(u-0.5) > 1e-9 {
		t.Fatalf("unexplained %v after the rescale, want 0.5 (others' 1, halved)", u)
	}
	// What this client has in flight is its own whatever the share.
	var c Bucket
	c.Sync(t0, 60, 60, 0)
	c.Take(t0, 10)
	c.Rescale(t0, 0.5, 10)
	if math.Abs(c.Level(t0)-20) > 1e-9 {
		t.Fatalf("level %v, want (50+10)/2-10 = 20", c.Level(t0))
	}
}
