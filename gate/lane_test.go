package gate

import (
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/ratelimit"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

var one = Demand{EstInput: 100, MaxTokens: 50}

func fill(t *testing.T, l *Lane, now time.Time) []Permit {
	t.Helper()
	var ps []Permit
	for {
		p, _, ok := l.TryAdmit(now, one)
		if !ok {
			return ps
		}
		ps = append(ps, p)
	}
}

func TestLaneStartsAtQuarterCapAndRampsOnlyWhenUsed(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100})
	ps := fill(t, l, t0)
	if len(ps) != 25 {
		t.Fatalf("admitted %d at start, want 25 (a quarter of the cap)", len(ps))
	}
	// Idle lane (nothing wanted more): no growth.
	l2 := NewLane(LaneConfig{Cap: 100})
	l2.TryAdmit(t0, one)
	l2.TryAdmit(t0.Add(10*time.Second), one)
	if s := l2.Snapshot(t0.Add(10 * time.Second)); s.Limit != 25 {
		t.Fatalf("unused lane grew to %v", s.Limit)
	}
	// Saturated lane: ramps at cap/8 per second: 25 → 100 in 6 s, not at once.
	for i := 1; i <= 6; i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		fill(t, l, now)
		s := l.Snapshot(now)
		want := min(100, 25+12.5*float64(i))
		if s.Limit < want-0.01 || s.Limit > want+0.01 {
			t.Fatalf("after %d s limit %.2f, want %.2f", i, s.Limit, want)
		}
	}
	if s := l.Snapshot(t0.Add(time.Minute)); s.Limit > 100 {
		t.Fatalf("limit above cap: %v", s.Limit)
	}
}

func rl429(ra time.Duration) Feedback {
	return Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable, Status: 429, RateLimited: true, RetryAfter: ra, HasRetryAfter: ra > 0}}
}

func TestLaneOneCutPerEpoch(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 100, StartFraction: 1})
	ps := fill(t, l, t0)
	if len(ps) != 100 {
		t.Fatalf("admitted %d", len(ps))
	}
	// Twenty 429s from requests admitted in one epoch: one cut.
	for _, p := range ps[:20] {
		l.Done(t0, p, rl429(0))
	}
	s := l.Snapshot(t0)
	if s.Cuts != 1 || s.Limit != 50 {
		t.Fatalf("cuts %d limit %v, want 1 cut to 50", s.Cuts, s.Limit)
	}
	// A 429 for a request admitted after the cut starts a new epoch.
	for _, p := range ps[20:] {
		l.Done(t0, p, Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}})
	}
	now := t0.Add(20 * time.Second) // past any back-off hold
	p, _, ok := l.TryAdmit(now, one)
	if !ok {
		t.Fatal("not admitted after hold")
	}
	l.Done(now, p, rl429(0))
	if s := l.Snapshot(now); s.Cuts != 2 || s.Limit != 25 {
		t.Fatalf("second epoch: cuts %d limit %v", s.Cuts, s.Limit)
	}
}

func TestLaneHoldsForRetryAfterOfAnyLength(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 10})
	p, _, _ := l.TryAdmit(t0, one)
	l.Done(t0, p, rl429(2*time.Hour))
	if _, wait, ok := l.TryAdmit(t0.Add(time.Hour), one); ok || wait != time.Hour {
		t.Fatalf("admitted during a 2 h retry-after (wait %v)", wait)
	}
	if _, _, ok := l.TryAdmit(t0.Add(2*time.Hour), one); !ok {
		t.Fatal("still held after retry-after")
	}
	if s := l.Snapshot(t0.Add(2 * time.Hour)); s.HeldS < 7199 || s.HeldS > 7201 {
		t.Fatalf("held_s %v", s.HeldS)
	}
}

func TestLaneBackoffWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 10, Speed: 10})
	p, _, _ := l.TryAdmit(t0, one)
	l.Done(t0, p, rl429(0))
	// 0.5 s of server time at K=10 is 50 ms.
	if _, wait, ok := l.TryAdmit(t0, one); ok || wait != 50*time.Millisecond {
		t.Fatalf("wait %v ok %v, want a 50ms hold", wait, ok)
	}
}

func TestLaneDisabled(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 10})
	l.Disable("revoked")
	if _, _, ok := l.TryAdmit(t0, one); ok {
		t.Fatal("disabled lane admitted")
	}
	if l.Snapshot(t0).Disabled != "revoked" {
		t.Fatal("reason lost")
	}
}

func TestLaneBucketsBind(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 100, StartFraction: 1})
	p, _, _ := l.TryAdmit(t0, one)
	// The server says: 5 requests left of 60 per minute.
	l.Done(t0, p, Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Billed: true, Actual: ratelimit.Need{Requests: 1, Input: 100, Output: 50},
		Limits: anthropic.RateLimits{Requests: anthropic.Limit{Present: true, Limit: 60, Remaining: 5}}})
	// 5 % of the bucket (3 of 60) is always left free.
	if got := len(fill(t, l, t0)); got != 2 {
		t.Fatalf("admitted %d, want the 5 the bucket has less the 3 left free", got)
	}
	// The pace starts from a prior of others drawing half the limit: one
	// request at 60/min less that (and the 3 % margin) is about 2 s.
	_, wait, _ := l.TryAdmit(t0, one)
	if wait < 1900*time.Millisecond || wait > 2200*time.Millisecond {
		t.Fatalf("wait %v, want about 2 s for one request at 60/min less the prior", wait)
	}
}

// TestLaneInputEstimateCorrection: when the API counts 10% more input
// tokens than the local estimate, the lane learns the ratio and reserves
// that, and the ratio stays put (a feedback on its own correction once made
// it run away, reserving a hundred times the real input).
func TestLaneInputEstimateCorrection(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Cap: 100, StartFraction: 1})
	now := t0
	for i := 0; i < 2000; i++ {
		p, _, ok := l.TryAdmit(now, Demand{EstInput: 1000, MaxTokens: 100})
		if !ok {
			t.Fatalf("not admitted at %d", i)
		}
		l.Done(now, p, Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Billed: true,
			Actual: ratelimit.Need{Requests: 1, Input: 1100, Output: 60}})
	}
	p, _, _ := l.TryAdmit(now, Demand{EstInput: 1000, MaxTokens: 100})
	if p.Need.Input < 1090 || p.Need.Input > 1110 || p.Need.Output < 59 || p.Need.Output > 61 {
		t.Fatalf("reserved %+v, want about 1,100 input and 60 output", p.Need)
	}
}

// TestLaneProbesOneRequestBeforeTheFirstAnswer: with ProbeFirst a lane
// sends one request until an answer comes back, then a quarter of the cap.
// Without it a run sent a quarter of the cap blind before any headers, and
// its 429s came in its first API seconds.
func TestLaneProbesOneRequestBeforeTheFirstAnswer(t *testing.T) {
	t.Parallel()
	l := NewLane(LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100, ProbeFirst: true})
	ps := fill(t, l, t0)
	if len(ps) != 1 {
		t.Fatalf("admitted %d before the first answer, want 1", len(ps))
	}
	l.Done(t0, ps[0], Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success}})
	if ps = fill(t, l, t0); len(ps) != 25 {
		t.Fatalf("admitted %d after the first answer, want 25 (a quarter of the cap)", len(ps))
	}
}

// TestLaneProbeThatHangsDoesNotHoldTheLane: with ProbeFirst, a first
// request still out after FirstAnswerWait (API time) lets the lane send
// one more, and one more per bound after that: a first request that hangs
// held a restarted gateway's lane to one request for minutes of API time.
func TestLaneProbeThatHangsDoesNotHoldTheLane(t *testing.T) {
	t.Parallel()
	const speed = 10
	l := NewLane(LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 100, StartFraction: 1, ProbeFirst: true, Speed: speed})
	wait := FirstAnswerWait / speed
	if ps := fill(t, l, t0); len(ps) != 1 {
		t.Fatalf("admitted %d before the first answer, want 1", len(ps))
	}
	if _, next, ok := l.TryAdmit(t0.Add(wait/2), Demand{}); ok || next != wait/2 {
		t.Fatalf("half the bound in: admitted %v, next %v; want a refusal for %v", ok, next, wait/2)
	}
	if ps := fill(t, l, t0.Add(wait)); len(ps) != 1 {
		t.Fatalf("admitted %d once the first was out FirstAnswerWait, want 1 more", len(ps))
	}
	if ps := fill(t, l, t0.Add(2*wait)); len(ps) != 1 {
		t.Fatalf("admitted %d at twice the bound, want 1 more", len(ps))
	}
}
