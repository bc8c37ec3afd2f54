package gateway

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/promptcache"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// Errors of admission callers can branch on.
var (
	// ErrNoUsableOrg: every org's lane of the request's pool is disabled
	// (revoked keys, no permission, billing).
	ErrNoUsableOrg = errors.New("gateway: no usable org for this model")
	// ErrQueueTimeout: no lane admitted the request before its deadline.
	ErrQueueTimeout = errors.New("gateway: no lane admitted the request in time")
)

// upstream is one org the gateway sends to.
type upstream struct {
	org.Org
	disabled atomic.Pointer[string] // why it is out of rotation; nil: in
}

// Disabled is why u is out of rotation, or "". It takes no lock: every
// answer's rate-limit headers ask it.
func (u *upstream) Disabled() string {
	if r := u.disabled.Load(); r != nil {
		return *r
	}
	return ""
}

// lane is one (org, pool) lane of the set's upstream.Lanes (the engines
// of the gateway's batches send through the same ones) with the gateway's
// queue of its pool.
type lane struct {
	*upstreampkg.Lane
	up   *upstream
	pool anthropic.Pool
	q    *poolQueue // the queue of pool
}

// grant is an admitted request: the lane that admitted it and its permit.
type grant struct {
	lane   *lane
	permit gate.Permit
	err    error
	// pre is the request's cached prefix (nil: none), note what its
	// answer showed of it (affinity.go).
	pre  *promptcache.Prefix
	note *cacheNote
	// share and class are whose request it is (nil: an engine's).
	share *share
	class Class
}

// waiter is one request queued for admission.
type waiter struct {
	d   gate.Demand
	pre *promptcache.Prefix // its cached prefix, nil: none
	ch  chan grant          // capacity 1: pump never blocks
	// share and class place it in the fair queue; since is when it
	// queued, seq its place in arrival order.
	share *share
	class Class
	since time.Time
	seq   uint64
}

// poolQueue is the lanes of one pool, one per org, and the requests
// waiting for any of them, in fair-queue order (fairqueue.go).
type poolQueue struct {
	pool  anthropic.Pool
	lanes []*lane
	next  int // lane to try first (rotates, so orgs share the load)
	fq    fairQueue
	// nwait is fq.len(), set with laneSet.mu held, so that a release
	// finding no one waiting need not take the lock.
	nwait   atomic.Int32
	timer   *time.Timer
	timerAt time.Time
	// order, names and warmth are laneOrder's buffers.
	order  []int
	names  []string
	warmth []promptcache.Warmth
}

// laneSet admits single requests through the gateway's upstream.Lanes,
// the same lanes its batches' engines send through: one gate per (org,
// pool) made by Config.NewGate (gate.NewLane in-process, or the shared
// budget's gate with --shared) under the same-organisation rule, so caps,
// AIMD, the header mirrors and retry-after holds all apply, once per key
// for both. What is the gateway's own sits on top: requests wait in a
// fair queue per pool while every lane is full (interactive before bulk,
// clients by weight, fairqueue.go), and a release on any lane (the
// engines' too), a refill or a hold's end wakes them (no polling); the
// slots of a dead gateway's attempts are held (heldGate); prompt caches
// are placed (affinity.go). It is safe for concurrent use.
type laneSet struct {
	orgs   []*upstream
	up     *upstreampkg.Lanes
	capFor func(p *upstreampkg.Provider, model string) int
	speed  float64
	places *promptcache.Places // where cached prefixes are warm

	mu sync.Mutex
	// shares are the clients' (by name), made on first use for a client
	// the set was not given.
	shares map[string]*share
	pools  map[anthropic.Pool]*poolQueue
	// queues is every pool's queue, for wakes to read without the lock.
	queues atomic.Pointer[[]*poolQueue]
	// shutErr, once set (shut), is every admission's answer.
	shutErr error
	// dead are the slots held for a dead gateway's attempts (holdDead),
	// per (org, pool); set once, before the first lane is made (the
	// gateway's New, before anything runs), then read without the lock by
	// the lanes' NewGate, which runs under the upstream lanes' lock.
	dead map[deadKey]*deadHold
}

type deadKey struct {
	org  string
	pool anthropic.Pool
}

// deadHold is the slots of a lane held for the attempts a gateway killed
// on this state directory had in flight there, which may still run
// upstream (the API does not stop when its client dies): one per attempt,
// each until its own end (sorted).
type deadHold struct {
	until []time.Time
}

// held is how many slots are held at now, and when the next one ends.
func (h *deadHold) held(now time.Time) (int, time.Time) {
	i := sort.Search(len(h.until), func(i int) bool { return h.until[i].After(now) })
	if i == len(h.until) {
		return 0, time.Time{}
	}
	return len(h.until) - i, h.until[i]
}

// holdDead holds a slot of its (org, pool) lane for each attempt in tags,
// so the lanes count what a killed predecessor left running on the keys:
// from last (the latest any was sent) for as long as the API may still run
// it (gate.StillRunningBound of its max_tokens, scaled by speed: the bound
// the shared budget holds a silent process's slots for), never past the
// attempt timeout. Called once, before any lane is made.
func (s *laneSet) holdDead(tags []spendTag, last time.Time, timeout time.Duration) {
	if len(tags) == 0 {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	dead := map[deadKey]*deadHold{}
	for _, t := range tags {
		until := last.Add(min(timeout, time.Duration(float64(gate.StillRunningBound(t.MaxTokens))/s.speed)))
		if !until.After(now) {
			continue
		}
		k := deadKey{t.Org, s.providerOf(t.Org).PoolOf(t.Model)}
		if dead[k] == nil {
			dead[k] = &deadHold{}
		}
		dead[k].until = append(dead[k].until, until)
	}
	for _, h := range dead {
		slices.SortFunc(h.until, func(a, b time.Time) int { return a.Compare(b) })
	}
	s.dead = dead
}

// providerOf is the provider of the org named name (Anthropic when the
// set has no such org).
func (s *laneSet) providerOf(name string) *upstreampkg.Provider {
	for _, u := range s.orgs {
		if u.Name == name {
			return upstreampkg.For(u.Org)
		}
	}
	return upstreampkg.Anthropic
}

// heldGate is a lane's gate while slots are held for a dead gateway's
// attempts: it admits only while what is in flight plus what is held is
// below the lane's cap.
type heldGate struct {
	gate.Gate
	h *deadHold
}

// TryAdmit implements gate.Gate.
func (g *heldGate) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	if n, next := g.h.held(now); n > 0 {
		if sn := g.Gate.Snapshot(now); sn.InFlight+n >= sn.Cap {
			return gate.Permit{}, next.Sub(now), false
		}
	}
	return g.Gate.TryAdmit(now, d)
}

// SetWake implements gate.Waker when the held gate does.
func (g *heldGate) SetWake(f func()) {
	if wk, ok := g.Gate.(gate.Waker); ok {
		wk.SetWake(f)
	}
}

// newLaneSet returns the set of orgs' lanes: newGate (nil: gate.NewLane)
// makes each gate, under sameOrg.
func newLaneSet(orgs []*upstream, lc gate.LaneConfig, capFor func(*upstreampkg.Provider, string) int, speed float64, newGate func(gate.LaneConfig) gate.Gate, sameOrg *upstreampkg.Orgs) *laneSet {
	if newGate == nil {
		newGate = func(c gate.LaneConfig) gate.Gate { return gate.NewLane(c) }
	}
	s := &laneSet{orgs: orgs, capFor: capFor, speed: speed, pools: map[anthropic.Pool]*poolQueue{},
		places: promptcache.NewPlaces(speed), shares: map[string]*share{}}
	os := make([]org.Org, 0, len(orgs))
	for _, u := range orgs {
		os = append(os, u.Org)
	}
	s.up = upstreampkg.NewLanes(upstreampkg.LanesConfig{Orgs: os, Lane: lc, Speed: speed, SameOrg: sameOrg,
		NewGate: func(c gate.LaneConfig) gate.Gate {
			g := newGate(c)
			if h := s.dead[deadKey{c.Org, c.Pool}]; h != nil {
				g = &heldGate{Gate: g, h: h}
			}
			return g
		}})
	// For as long as the gateway lives: any release on any lane (the
	// engines' too) and any gate's own wake-up pumps the queues.
	s.up.Subscribe(s.wakeQueues)
	return s
}

// setClients gives the set its clients' weights, classes and hard shares.
// Call it before the first admission.
func (s *laneSet) setClients(cs []Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		s.shares[c.Name] = newShare(c)
	}
}

// shareLocked is client's share. s.mu is held.
func (s *laneSet) shareLocked(client string) *share {
	sh := s.shares[client]
	if sh == nil {
		sh = newShare(Client{Name: client})
		s.shares[client] = sh
	}
	return sh
}

// classOf is client's class when its request does not name one.
func (s *laneSet) classOf(client string) Class {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shareLocked(client).class
}

// queueLocked returns (creating on first use) the pool of p's model. s.mu
// is held.
func (s *laneSet) queueLocked(p *upstreampkg.Provider, model string) *poolQueue {
	pool := p.PoolOf(model)
	if q, ok := s.pools[pool]; ok {
		return q
	}
	return s.poolLocked(pool, s.capFor(p, model))
}

// poolLocked creates the queue of pool over its lanes (made with the cap
// capN unless an engine made them first). s.mu is held.
func (s *laneSet) poolLocked(pool anthropic.Pool, capN int) *poolQueue {
	q := &poolQueue{pool: pool}
	// The pool's lanes are its provider's orgs' (upstream.Lanes.Pool).
	byOrg := map[string]*upstreampkg.Lane{}
	for _, l := range s.up.Pool(pool, capN) {
		byOrg[l.Org] = l
	}
	for _, u := range s.orgs {
		if ul := byOrg[u.Name]; ul != nil {
			q.lanes = append(q.lanes, &lane{Lane: ul, up: u, pool: pool, q: q})
		}
	}
	s.pools[pool] = q
	qs := []*poolQueue{q}
	if old := s.queues.Load(); old != nil {
		qs = append(slices.Clone(*old), q)
	}
	s.queues.Store(&qs)
	return q
}

// wakeQueues pumps every pool's waiters after a release or a gate's
// wake-up. With no one waiting it takes no lock: a request queued after
// the check pumps the queue itself and finds the slot freed.
func (s *laneSet) wakeQueues() {
	qs := s.queues.Load()
	if qs == nil {
		return
	}
	for _, q := range *qs {
		if q.nwait.Load() > 0 {
			s.kick(q)
		}
	}
}

// kick pumps q from outside the lock (a timer, a shared gate's wake-up).
func (s *laneSet) kick(q *poolQueue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pumpLocked(q, time.Now())
}

// pumpLocked admits waiters in order while a lane admits them, and arms a
// timer for the earliest moment a blocked lane may admit again.
func (s *laneSet) pumpLocked(q *poolQueue, now time.Time) {
	for q.fq.len() > 0 {
		w := q.fq.next()
		if w == nil {
			return // every waiting client holds its hard share
		}
		next := time.Duration(math.MaxInt64)
		usable := 0
		admitted := false
		for _, li := range s.laneOrder(q, w, now) {
			l := q.lanes[li]
			if l.Disabled() != "" {
				continue
			}
			usable++
			p, wait, ok := l.TryAdmit(now, w.d)
			if ok {
				q.next = (li + 1) % len(q.lanes)
				q.fq.admitted(w)
				q.nwait.Store(int32(q.fq.len()))
				w.share.admitted(w.class, now.Sub(w.since))
				gr := s.granted(w, l, p, now)
				gr.share, gr.class = w.share, w.class
				w.ch <- gr
				admitted = true
				break
			}
			if wait > 0 {
				next = min(next, wait)
			}
		}
		if usable == 0 {
			q.fq.drain(func(w *waiter) { w.ch <- grant{err: ErrNoUsableOrg} })
			q.nwait.Store(0)
			return
		}
		if !admitted {
			if next != time.Duration(math.MaxInt64) {
				at := now.Add(next)
				if q.timer == nil || !q.timerAt.After(now) || at.Before(q.timerAt) {
					if q.timer != nil {
						q.timer.Stop()
					}
					q.timerAt = at
					q.timer = time.AfterFunc(next, func() { s.kick(q) })
				}
			}
			return
		}
	}
}

// admit waits until a lane of the pool of p's model admits a request of
// demand d for client in class c, ctx ends (the client went away) or
// deadline passes. pre is the request's cached prefix (nil: none), for
// placement.
func (s *laneSet) admit(ctx context.Context, deadline time.Time, p *upstreampkg.Provider, model string, d gate.Demand, pre *promptcache.Prefix, client string, c Class) (grant, error) {
	w := &waiter{d: d, pre: pre, ch: make(chan grant, 1), class: c}
	s.mu.Lock()
	if err := s.shutErr; err != nil {
		s.mu.Unlock()
		return grant{}, err
	}
	q := s.queueLocked(p, model)
	now := time.Now()
	w.share, w.since = s.shareLocked(client), now
	q.fq.push(w)
	q.nwait.Store(int32(q.fq.len()))
	s.pumpLocked(q, now)
	s.mu.Unlock()
	select {
	case g := <-w.ch:
		return g, g.err
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var cause error
	select {
	case g := <-w.ch:
		return g, g.err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-t.C:
		cause = ErrQueueTimeout
	}
	s.mu.Lock()
	if q.fq.remove(w) {
		q.nwait.Store(int32(q.fq.len()))
		s.mu.Unlock()
		return grant{}, cause
	}
	s.mu.Unlock()
	// Admitted meanwhile: give the slot back unused.
	if g := <-w.ch; g.err == nil {
		s.release(g, gate.Feedback{})
	}
	return grant{}, cause
}

// release returns g's permit with what the attempt taught; the lanes
// then wake the pools' waiters (wakeQueues: a client at its hard share
// may have waiters in every pool) and the engines.
func (s *laneSet) release(g grant, fb gate.Feedback) {
	now := time.Now()
	if sh := g.share; sh != nil {
		sh.inFlight[g.class].Add(-1)
	}
	s.prefixAnswered(g, now)
	g.lane.Release(now, g.permit, fb)
}

// disable takes an org (scope org) or one lane out of rotation.
func (s *laneSet) disable(l *lane, scope anthropic.Scope, reason string) {
	if scope == anthropic.ScopeOrg {
		s.disableOrg(l.up, reason)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l.Disable(reason)
	s.pumpLocked(s.pools[l.pool], time.Now())
}

// disableOrg takes every lane of u out of rotation, and u itself for the
// requests that go through no lane (count_tokens, models).
func (s *laneSet) disableOrg(u *upstream, reason string) {
	u.disabled.CompareAndSwap(nil, &reason)
	// Wakes the queues, which drain a pool left with no usable org.
	s.up.DisableOrg(u.Name, reason)
}

// snapshots describes every lane, those only the batches' engines have
// used yet too.
func (s *laneSet) snapshots(now time.Time) []gate.LaneSnapshot {
	all := s.up.All()
	out := make([]gate.LaneSnapshot, 0, len(all))
	for _, l := range all {
		out = append(out, l.Snapshot(now))
	}
	return out
}

// queued is how many requests wait for a lane.
func (s *laneSet) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.pools {
		n += q.fq.len()
	}
	return n
}

// shut makes every admission, waiting or to come, fail with err.
func (s *laneSet) shut(err error) {
	s.mu.Lock()
	s.shutErr = err
	for _, q := range s.pools {
		q.fq.drain(func(w *waiter) { w.ch <- grant{err: err} })
		q.nwait.Store(0)
	}
	s.mu.Unlock()
	s.up.Shut() // the engines' admissions too
}

// abort marks the requests in flight as cut (Gateway.Abort): an engine's
// attempt cut then keeps its slot, as the gateway's own do (cutAtExit).
func (s *laneSet) abort() { s.up.Abort() }

// stop stops the timers.
func (s *laneSet) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.pools {
		if q.timer != nil {
			q.timer.Stop()
		}
	}
}
