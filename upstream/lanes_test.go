package upstream

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

// wakingGate is an in-process lane that records the wake function it is
// given, so a test can fire it as a refill or a shared renewal would.
type wakingGate struct {
	*gate.Lane
	wake func()
	cfg  gate.LaneConfig
}

func (g *wakingGate) SetWake(f func()) { g.wake = f }

func testLanes(t *testing.T) (*Lanes, map[string]*wakingGate) {
	t.Helper()
	made := map[string]*wakingGate{}
	s := NewLanes(LanesConfig{
		Orgs:  []org.Org{{Name: "a", Key: org.NewKey("sk-ant-test-key-a-0001")}, {Name: "b", Key: org.NewKey("sk-ant-test-key-b-0002")}},
		Lane:  gate.LaneConfig{StartFraction: 1},
		Speed: 1,
		NewGate: func(lc gate.LaneConfig) gate.Gate {
			g := &wakingGate{Lane: gate.NewLane(lc), cfg: lc}
			made[lc.Org+"/"+string(lc.Pool)] = g
			return g
		},
	})
	return s, made
}

func TestLanesPoolIsOneLanePerOrgUnderTheRule(t *testing.T) {
	s, made := testLanes(t)
	ls := s.Pool(anthropic.PoolSonnet4, 7)
	if len(ls) != 2 || ls[0].Org != "a" || ls[1].Org != "b" || ls[0].Cap != 7 {
		t.Fatalf("lanes %+v, want a then b, cap 7", ls)
	}
	if again := s.Pool(anthropic.PoolSonnet4, 99); again[0] != ls[0] || again[1] != ls[1] || len(made) != 2 {
		t.Errorf("a second Pool made new lanes (%d gates made)", len(made))
	}
	for _, l := range ls {
		if g, ok := l.Gate.(*Gate); !ok || g.SameOrg() != s.SameOrg() {
			t.Errorf("lane %s is not under the set's same-organisation rule: %T", l.Org, l.Gate)
		}
		if c := made[l.Org+"/"+string(anthropic.PoolSonnet4)].cfg; !c.ProbeFirst || c.Cap != 7 || c.Pool != anthropic.PoolSonnet4 {
			t.Errorf("lane %s made with %+v, want ProbeFirst, cap 7, its pool", l.Org, c)
		}
	}
	if n := len(s.All()); n != 2 {
		t.Errorf("All has %d lanes, want 2", n)
	}
}

// Every subscriber hears every release on any lane of the set and every
// gate's own wake-up, however many there are (the gateway's bridge kept
// only the latest 64 engines' wake functions), until it unsubscribes.
func TestLanesWakeEverySubscriber(t *testing.T) {
	s, made := testLanes(t)
	ls := s.Pool(anthropic.PoolSonnet4, 10)
	const n = 100
	var woken [n]atomic.Int32
	unsub := make([]func(), n)
	for i := range n {
		unsub[i] = s.Subscribe(func() { woken[i].Add(1) })
	}
	now := time.Now()
	p, _, ok := ls[1].TryAdmit(now, gate.Demand{})
	if !ok {
		t.Fatal("lane b admitted nothing")
	}
	ls[1].Done(now, p, gate.Feedback{Outcome: anthropic.Outcome{Status: 200}})
	for i := range n {
		if w := woken[i].Load(); w != 1 {
			t.Fatalf("subscriber %d woken %d times by one release, want 1", i, w)
		}
	}
	made["a/"+string(anthropic.PoolSonnet4)].wake() // a refill, a shared renewal
	if w := woken[0].Load(); w != 2 {
		t.Errorf("a gate's own wake-up reached subscriber 0 %d times in all, want 2", w)
	}
	for i := range n - 1 {
		unsub[i]()
	}
	s.wake()
	if w0, wl := woken[0].Load(), woken[n-1].Load(); w0 != 2 || wl != 3 {
		t.Errorf("after unsubscribing: first woken %d (want 2, no more), last %d (want 3)", w0, wl)
	}
}

func TestLanesShutRefusesEveryAdmission(t *testing.T) {
	s, _ := testLanes(t)
	ls := s.Pool(anthropic.PoolSonnet4, 10)
	s.Shut()
	if !s.IsShut() {
		t.Error("IsShut false after Shut")
	}
	if _, wait, ok := ls[0].TryAdmit(time.Now(), gate.Demand{}); ok || wait != time.Duration(math.MaxInt64) {
		t.Errorf("a shut set's lane admitted (%v) or asked to retry in %v", ok, wait)
	}
}

// Once the set is aborted, an attempt cut (retryable, unbilled) that ends
// through Done keeps its slot, since it may still run upstream; Release
// frees it whatever the state.
func TestLanesAbortedKeepsTheSlotOfACutAttempt(t *testing.T) {
	s, _ := testLanes(t)
	l := s.Pool(anthropic.PoolSonnet4, 10)[0]
	now := time.Now()
	first, _, _ := l.TryAdmit(now, gate.Demand{})
	l.Done(now, first, gate.Feedback{Outcome: anthropic.Outcome{Status: 200}}) // the probe's answer
	p, _, ok := l.TryAdmit(now, gate.Demand{})
	if !ok {
		t.Fatal("no admission")
	}
	s.Abort()
	cut := gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable}}
	l.Done(now, p, cut)
	if in := l.Snapshot(now).InFlight; in != 1 {
		t.Errorf("a cut attempt's slot: %d in flight after Done, want 1 (kept)", in)
	}
	l.Release(now, p, cut)
	if in := l.Snapshot(now).InFlight; in != 0 {
		t.Errorf("%d in flight after Release, want 0", in)
	}
}

func TestLanesDisableOrgReachesLaterPools(t *testing.T) {
	s, _ := testLanes(t)
	before := s.Pool(anthropic.PoolSonnet4, 10)
	woken := 0
	s.Subscribe(func() { woken++ })
	s.DisableOrg("b", "revoked")
	after := s.Pool(anthropic.PoolHaiku45, 10)
	if before[1].Disabled() != "revoked" || after[1].Disabled() != "revoked" {
		t.Errorf("org b's lanes: %q before, %q made after; want both out", before[1].Disabled(), after[1].Disabled())
	}
	if before[0].Disabled() != "" || after[0].Disabled() != "" {
		t.Error("org a's lanes went out too")
	}
	if woken != 1 {
		t.Errorf("DisableOrg woke the subscribers %d times, want 1", woken)
	}
}
