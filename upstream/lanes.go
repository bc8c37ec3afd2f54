package upstream

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

// LanesConfig says how to make a Lanes.
type LanesConfig struct {
	// Orgs are the keys, in their configured order.
	Orgs []org.Org
	// Lane tunes every lane's controller (Org, Pool, Cap, Speed and
	// ProbeFirst are set per lane).
	Lane  gate.LaneConfig
	Speed float64
	// NewGate makes a lane's gate (nil: gate.NewLane, in-process).
	NewGate func(gate.LaneConfig) gate.Gate
	// SameOrg is the same-organisation rule every lane is under (nil: a
	// rule of the set's own, NewOrgs of Orgs).
	SameOrg *Orgs
}

// Lanes is the one set of lanes of a process's routes: per model pool,
// one lane per org, each under the same-organisation rule, so the
// gateway's single requests and the engines of its batches share one cap
// per key. A release on any lane, and a gate's own wake-up (a refill, a
// hold's end, a shared renewal), wakes every subscriber. It is safe for
// concurrent use.
type Lanes struct {
	cfg     LanesConfig
	sameOrg *Orgs

	mu       sync.Mutex
	pools    map[anthropic.Pool][]*Lane
	all      []*Lane
	disabled map[string]string // org name → why it is out

	subs   atomic.Pointer[[]sub]
	nextID uint64 // under mu

	// shut: every TryAdmit refuses from then on. aborted: the attempts in
	// flight were cut, and one cut now keeps its slot (Done).
	shut    atomic.Bool
	aborted atomic.Bool
}

type sub struct {
	id uint64
	f  func()
}

// NewLanes returns the set of cfg's orgs; lanes are made per pool on
// first use (Pool).
func NewLanes(cfg LanesConfig) *Lanes {
	if cfg.NewGate == nil {
		cfg.NewGate = func(c gate.LaneConfig) gate.Gate { return gate.NewLane(c) }
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	s := &Lanes{cfg: cfg, sameOrg: cfg.SameOrg, pools: map[anthropic.Pool][]*Lane{}, disabled: map[string]string{}}
	if s.sameOrg == nil {
		s.sameOrg = NewOrgs(cfg.Orgs, nil)
	}
	// A key's organisation learnt (or its first discovery request ended)
	// may leave room on any lane: the subscribers try again.
	s.sameOrg.OnLearn(s.wake)
	return s
}

// SameOrg is the same-organisation rule the lanes are under.
func (s *Lanes) SameOrg() *Orgs { return s.sameOrg }

// Orgs are the set's orgs, in their configured order.
func (s *Lanes) Orgs() []org.Org { return s.cfg.Orgs }

// Pool returns (making on first use, with the cap capN) the lanes of
// pool, one per org of the pool's provider (OfPool) in the configured
// order: an OpenAI model's lanes are the OpenAI orgs', a Claude model's
// the Anthropic orgs'.
func (s *Lanes) Pool(pool anthropic.Pool, capN int) []*Lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls, ok := s.pools[pool]; ok {
		return ls
	}
	ls := make([]*Lane, 0, len(s.cfg.Orgs))
	prov := OfPool(pool)
	for _, o := range s.cfg.Orgs {
		if For(o) != prov {
			continue
		}
		lc := s.cfg.Lane
		lc.Org, lc.Pool, lc.Cap, lc.Speed = o.Name, pool, capN, s.cfg.Speed
		// One request until the first answer: the buckets are unknown
		// before it, and a shared gate's grace (how long Redis keeps its
		// slots past its lease) follows the requests it has seen end.
		lc.ProbeFirst = true
		l := &Lane{Gate: s.sameOrg.Wrap(s.cfg.NewGate(lc), lc), Org: o.Name, Pool: pool, Cap: capN, set: s}
		if w, ok := l.Gate.(gate.Waker); ok {
			w.SetWake(s.wake)
		}
		if r := s.disabled[o.Name]; r != "" {
			l.Gate.Disable(r)
		}
		ls = append(ls, l)
	}
	s.pools[pool] = ls
	s.all = append(slices.Clone(s.all), ls...)
	return ls
}

// All is every lane made so far.
func (s *Lanes) All() []*Lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all
}

// Subscribe has f called on every release of any lane and every gate's
// own wake-up, until unsubscribe. f must be quick and must not block (a
// non-blocking send, a pump under a lock the lanes never take).
func (s *Lanes) Subscribe(f func()) (unsubscribe func()) {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	old := s.subsLocked()
	ns := append(slices.Clone(old), sub{id: id, f: f})
	s.subs.Store(&ns)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		ns := slices.DeleteFunc(slices.Clone(s.subsLocked()), func(x sub) bool { return x.id == id })
		s.subs.Store(&ns)
	}
}

func (s *Lanes) subsLocked() []sub {
	if p := s.subs.Load(); p != nil {
		return *p
	}
	return nil
}

// wake calls every subscriber.
func (s *Lanes) wake() {
	if p := s.subs.Load(); p != nil {
		for _, x := range *p {
			x.f()
		}
	}
}

// Shut makes every lane refuse every admission from now on.
func (s *Lanes) Shut() {
	s.shut.Store(true)
	s.wake()
}

// IsShut reports whether Shut was called.
func (s *Lanes) IsShut() bool { return s.shut.Load() }

// Abort marks the attempts in flight as cut: from now on an attempt that
// ends retryable and unbilled through Done keeps its slot, since it may
// still run upstream.
func (s *Lanes) Abort() { s.aborted.Store(true) }

// DisableOrg takes every lane of org name out of rotation, those made
// later too, and wakes the subscribers.
func (s *Lanes) DisableOrg(name, reason string) {
	s.mu.Lock()
	if _, ok := s.disabled[name]; !ok {
		s.disabled[name] = reason
	}
	for _, l := range s.all {
		if l.Org == name {
			l.Gate.Disable(reason)
		}
	}
	s.mu.Unlock()
	s.wake()
}

// Lane is one (org, pool) lane of a Lanes: its gate under the
// same-organisation rule. It implements gate.Gate.
type Lane struct {
	gate.Gate
	Org  string
	Pool anthropic.Pool
	Cap  int
	set  *Lanes
}

var _ gate.Gate = (*Lane)(nil)

// TryAdmit implements gate.Gate: nothing once the set is shut.
func (l *Lane) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	if l.set.shut.Load() {
		return gate.Permit{}, time.Duration(math.MaxInt64), false
	}
	return l.Gate.TryAdmit(now, d)
}

// Done implements gate.Gate: the slot is freed and every subscriber
// woken, except that once the set is aborted an attempt cut (retryable,
// not billed) keeps its slot: it may still run upstream.
func (l *Lane) Done(now time.Time, p gate.Permit, fb gate.Feedback) {
	if l.set.aborted.Load() && fb.Outcome.Kind == anthropic.Retryable && !fb.Billed {
		return
	}
	l.Release(now, p, fb)
}

// Release frees p's slot with what the attempt taught, whatever the set's
// state (its caller decided the slot is free), and wakes every
// subscriber.
func (l *Lane) Release(now time.Time, p gate.Permit, fb gate.Feedback) {
	l.Gate.Done(now, p, fb)
	l.set.wake()
}
