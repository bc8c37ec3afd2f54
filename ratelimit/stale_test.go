package ratelimit

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// TestMirrorAloneAnswersReadLate is a key alone at speed 10 (the polite
// tests' K under -race: 60 RPM shown as 600, a bucket of 60) whose answers
// take 2-3.5 s and reach the mirror late and out of order: the time each
// answer is read at is taken when it arrives, and half of them wait up
// to 2.5 s behind others (a busy process) before the mirror hears of them. A
// mirror that moved its clock back to an answer's time refilled the same
// interval again at the next one, believed the bucket held more than it
// did, kept that level inside the range the next headers allowed, and
// sent into an empty bucket (429s on an organisation nobody else used,
// and others "seen" there).
func TestMirrorAloneAnswersReadLate(t *testing.T) {
	t.Parallel()
	const k = 10
	m := NewMirror(MirrorConfig{Speed: k, Window: time.Second})
	s := &server{limit: 60 * k, size: 60, level: 60, at: t0}
	rng := rand.New(rand.NewPCG(29, 1))
	one := Need{Requests: 1}
	type answer struct {
		sent, done  time.Time // admitted; answered (headers written)
		read, heard time.Time // timed by the client; heard of by the mirror
		rl          anthropic.RateLimits
		refused     bool
	}
	var out, heard []answer // on their way; answered, not yet heard of
	refused, sent := 0, 0
	late := func(n int, most time.Duration) time.Duration {
		if rng.IntN(n) != 0 {
			return 0
		}
		return time.Duration(rng.Int64N(int64(most)))
	}
	now := t0
	for range 6_000 { // 30 s at 5 ms: 300 API-s
		now = now.Add(5 * time.Millisecond)
		// Answers come back in the server's order, some timed late...
		for len(out) > 0 && !out[0].done.After(now) {
			a := out[0]
			out = out[1:]
			a.rl = s.headers(a.done)
			a.read = a.done.Add(late(3, 1200*time.Millisecond))
			a.heard = a.read.Add(late(2, 2500*time.Millisecond))
			heard = append(heard, a)
		}
		// ...and reach the mirror in the order they are heard of, each
		// with the time it was read at.
		slices.SortStableFunc(heard, func(a, b answer) int { return a.heard.Compare(b.heard) })
		for len(heard) > 0 && !heard[0].heard.After(now) {
			a := heard[0]
			heard = heard[1:]
			m.LandedAt(a.sent, one)
			if a.refused {
				m.Correct(a.read, one, Need{})
			}
			m.SyncSince(a.read, a.sent, a.rl, 0)
		}
		// One request until the first answer (the lanes' probe), then
		// what the mirror admits, up to a lane's cap in flight.
		for (m.Synced() || len(out)+len(heard) == 0) && len(out)+len(heard) < 64 && m.Wait(now, one) == 0 {
			m.Take(now, one)
			sent++
			s.advance(now)
			a := answer{sent: now, done: now.Add(2*time.Second + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))}
			if s.level < 1 {
				refused++
				a.refused, a.done = true, now
			} else {
				s.level--
			}
			i, _ := slices.BinarySearchFunc(out, a, func(x, y answer) int { return x.done.Compare(y.done) })
			out = slices.Insert(out, i, a)
		}
	}
	if refused > 0 || m.OthersSeen() > 0 {
		t.Fatalf("a key alone: %d of %d sent were refused (429s), others seen %d times; want none", refused, sent, m.OthersSeen())
	}
	// What the key allows in 30 s: its bucket and 300 API-s of refill.
	// The mirror sends one request until the first answer (2-3.5 s, 20-35
	// API-s) and assumes others draw half the limit until it has watched
	// the bucket: 0.8 of it, and a margin.
	if allowed := 60 + 300; float64(sent) < 0.75*float64(allowed) {
		t.Errorf("%d sent, want ≥ 0.75 of the %d the key allows", sent, allowed)
	}
}
