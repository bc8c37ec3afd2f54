// Package spend is the one spend gate of a run: every route and engine that
// can cost money (the sync engine, the batch route, auto's later engines, a
// pilot, a resume) reserves the worst case of a request or a batch before
// it is sent, and settles the reservation from usage when it ends, so that
// the cap (--max-cost) holds whatever runs at once.
//
// A Gate counts three figures: what was spent (settled from usage, and
// what the run had spent before it started), what is held for work whose
// cost is not known and never will be (a batch left open, a request whose
// answer was lost after it went out: counted at its worst case for good),
// and what is reserved for work in flight. Reserve admits a worst case only
// when the three and it stay within the cap.
//
// Gates nest: a gate made with Child reserves in its parent as well, so a
// gateway can hold one gate per client under one for the whole gateway and
// a request passes only when both have room.
//
// A gate made with NewShared or SharedChild keeps its cap in a Backend
// (the gateways on one Redis share their clients' and their own caps that
// way): a reservation whose chain holds such a gate is admitted by the
// backend, atomically for every shared gate of the chain, and ended there
// too; the gate's own figures then count this process's part only.
package spend

import (
	"errors"
	"fmt"
	"sync"

	"github.com/apidispatch/apidispatch/cost"
)

// ErrCapReached: a reservation would pass a gate's cap. The error Reserve
// returns is a *CapError, which matches it with errors.Is.
var ErrCapReached = errors.New("spend: cap reached")

// CapError says which gate refused a reservation and its figures then.
type CapError struct {
	// Name is the refusing gate's name ("" for an unnamed gate).
	Name string
	// Cap is the gate's cap; Spent, Held and Reserved its figures when it
	// refused; Want the worst case asked for.
	Cap, Spent, Held, Reserved, Want cost.Nanos
}

func (e *CapError) Error() string {
	who := "the cap"
	if e.Name != "" {
		who = e.Name
	}
	held := ""
	if h := e.Held + e.Reserved; h > 0 {
		held = fmt.Sprintf(", %s held for requests and batches whose cost is not known yet", h)
	}
	return fmt.Sprintf("%s %s reached: spent %s%s; a worst case of %s more would pass it", who, e.Cap, e.Spent, held, e.Want)
}

// Is makes a CapError match ErrCapReached.
func (e *CapError) Is(target error) bool { return target == ErrCapReached }

// Gate is a spend cap and what is spent and reserved against it. It is safe
// for concurrent use. The zero value is not usable; use New.
type Gate struct {
	name   string
	cap    cost.Nanos // 0: none
	parent *Gate
	// backend, when set, keeps the gate's cap and figures for every
	// process sharing it, under key.
	backend Backend
	key     string

	mu       sync.Mutex
	spent    cost.Nanos
	held     cost.Nanos
	reserved cost.Nanos
	n        int           // open reservations
	changed  chan struct{} // closed on the next release; nil until asked for
}

// New returns a gate with cap (0 or less: no cap, the gate only counts)
// that has spent already (what the run directory's store says was spent
// before this process: a resume continues against the same cap). name,
// when not empty, names the gate in CapError ("--max-cost").
func New(name string, cap, spent cost.Nanos) *Gate {
	return &Gate{name: name, cap: max(cap, 0), spent: spent}
}

// Child returns a gate with its own cap and spend whose every reservation
// is also made in g: a request passes only when both have room. spent is
// the child's alone (g's own figure already counts it, or not, as g was
// seeded).
func (g *Gate) Child(name string, cap, spent cost.Nanos) *Gate {
	c := New(name, cap, spent)
	c.parent = g
	return c
}

// NewShared returns a gate whose cap (0 or less: none) is judged by b,
// under key, against what every process sharing key spent and reserved.
// spent seeds the gate's own figure (this process's part, for its status);
// b is seeded apart.
func NewShared(name string, cap, spent cost.Nanos, b Backend, key string) *Gate {
	g := New(name, cap, spent)
	g.backend, g.key = b, key
	return g
}

// SharedChild is Child for a gate whose cap b judges under key (NewShared).
func (g *Gate) SharedChild(name string, cap, spent cost.Nanos, b Backend, key string) *Gate {
	c := NewShared(name, cap, spent, b, key)
	c.parent = g
	return c
}

// Cap is the gate's cap (0: none).
func (g *Gate) Cap() cost.Nanos { return g.cap }

// Capped reports whether g or a parent has a cap.
func (g *Gate) Capped() bool {
	for ; g != nil; g = g.parent {
		if g.cap > 0 {
			return true
		}
	}
	return false
}

// Spent is what was settled from usage, plus what the gate was seeded with.
func (g *Gate) Spent() cost.Nanos {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.spent
}

// Held is what is counted for good for work whose cost is not known (see
// Reservation.Keep).
func (g *Gate) Held() cost.Nanos {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// Reserved is the worst case of the work in flight (open reservations, less
// what has been charged to them).
func (g *Gate) Reserved() cost.Nanos {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reserved
}

// Open is the number of open reservations.
func (g *Gate) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Committed is spent + held + reserved: what the cap is judged against.
func (g *Gate) Committed() cost.Nanos {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.spent + g.held + g.reserved
}

// Changed returns a channel closed the next time a reservation of g ends or
// is charged (room may have come free). Take it before looking at the
// figures, so that no change between the two is missed.
func (g *Gate) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.changed
}

// chain is g and its parents, leaf first: the order locks are taken in.
func (g *Gate) chain() []*Gate {
	var out []*Gate
	for ; g != nil; g = g.parent {
		out = append(out, g)
	}
	return out
}

func lockAll(gs []*Gate) {
	for _, g := range gs {
		g.mu.Lock()
	}
}

func unlockAll(gs []*Gate) {
	for i := len(gs) - 1; i >= 0; i-- {
		gs[i].mu.Unlock()
	}
}

// notify wakes Changed's waiters; g.mu is held.
func (g *Gate) notify() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// Reserve reserves worst (the most the work can cost) in g and its
// parents, or returns a *CapError (matching ErrCapReached) from the first
// gate it would pass, reserving nothing. A negative worst counts as 0.
// When the chain holds a shared gate its backend decides for the shared
// gates; when one gate of the chain is capped, an unreachable backend
// refuses (an error matching ErrUnavailable): a cap nobody can judge is
// not passed. Without a cap the work passes, counted here alone.
func (g *Gate) Reserve(worst cost.Nanos) (*Reservation, error) {
	return g.reserve(max(worst, 0), false, "")
}

// ReserveTagged is Reserve with a tag the backend of a shared gate keeps
// with the reservation (Backend.Reserve); a gate without one ignores it.
func (g *Gate) ReserveTagged(worst cost.Nanos, tag string) (*Reservation, error) {
	return g.reserve(max(worst, 0), false, tag)
}

// Check returns the error Reserve(worst) would return now, reserving
// nothing: nil when there is room. Another goroutine may take the room
// before a Reserve that follows; Reserve decides. Shared gates are
// judged by their Reserve only.
func (g *Gate) Check(worst cost.Nanos) error {
	gs := g.chain()
	lockAll(gs)
	defer unlockAll(gs)
	return checkLocked(gs, max(worst, 0), sharedCapped(gs))
}

// sharedCapped reports whether a gate of gs is shared and one is capped:
// then the shared gates' caps are judged by their backend.
func sharedCapped(gs []*Gate) bool {
	shared, capped := sharedOf(gs)
	return shared && capped
}

// sharedOf reports whether a gate of gs is shared and whether one is
// capped.
func sharedOf(gs []*Gate) (shared, capped bool) {
	for _, x := range gs {
		shared = shared || x.backend != nil
		capped = capped || x.cap > 0
	}
	return shared, capped
}

func checkLocked(gs []*Gate, worst cost.Nanos, remote bool) error {
	for _, x := range gs {
		if remote && x.backend != nil {
			continue // its backend judges it, with every process's figures
		}
		if x.cap > 0 && x.spent+x.held+x.reserved+worst > x.cap {
			return &CapError{Name: x.name, Cap: x.cap, Spent: x.spent, Held: x.held, Reserved: x.reserved, Want: worst}
		}
	}
	return nil
}

// CountLocal adds c to the spent of g and its parents in this process
// only, never in a backend: spend an earlier process counted there
// already (a resumed batch's, which it charged as it went).
func (g *Gate) CountLocal(c cost.Nanos) {
	if c <= 0 {
		return
	}
	gs := g.chain()
	lockAll(gs)
	defer unlockAll(gs)
	for _, x := range gs {
		x.spent += c
		x.notify()
	}
}

// Hold reserves worst whatever the cap says, for work already sent that
// this gate learns of late (a batch of an earlier process, re-attached).
func (g *Gate) Hold(worst cost.Nanos) *Reservation {
	return g.HoldTagged(worst, "")
}

// HoldTagged is Hold with a tag, as ReserveTagged.
func (g *Gate) HoldTagged(worst cost.Nanos, tag string) *Reservation {
	r, _ := g.reserve(max(worst, 0), true, tag)
	return r
}

func (g *Gate) reserve(worst cost.Nanos, force bool, tag string) (*Reservation, error) {
	gs := g.chain()
	lockAll(gs)
	viaBackend, capped := sharedOf(gs)
	if !force {
		if err := checkLocked(gs, worst, viaBackend); err != nil {
			unlockAll(gs)
			return nil, err
		}
	}
	r := g.reserveLocked(gs, worst)
	unlockAll(gs)
	if !viaBackend {
		return r, nil
	}
	var b Backend
	var budgets []Budget
	for _, x := range gs {
		if x.backend != nil {
			b = x.backend
			budgets = append(budgets, Budget{Key: x.key, Name: x.name, Cap: x.cap})
		}
	}
	id, err := b.Reserve(budgets, worst, force, tag)
	if err != nil {
		if !capped && errors.Is(err, ErrUnavailable) {
			// No cap to judge: the work is counted here alone (its
			// shared figures miss it).
			return r, nil
		}
		r.Release()
		return nil, err
	}
	r.remote = &remote{b: b, id: id, budgets: budgets}
	return r, nil
}

func (g *Gate) reserveLocked(gs []*Gate, worst cost.Nanos) *Reservation {
	for _, x := range gs {
		x.reserved += worst
		x.n++
	}
	return &Reservation{g: g, worst: worst, left: worst}
}

// Reservation is the worst case of one request or batch, held in a gate
// (and its parents) until it ends. Its methods are safe for concurrent
// use; once it has ended (Settle, Release, Keep) they do nothing. A nil
// *Reservation does nothing either.
type Reservation struct {
	g     *Gate
	worst cost.Nanos
	// left (what is still reserved), charged and done are guarded by the
	// leaf gate's mutex.
	left    cost.Nanos
	charged cost.Nanos
	done    bool
	// remote is the reservation in the shared gates' backend (nil: none).
	// Set before the reservation is handed out, read only after.
	remote *remote
}

// remote is a reservation's part in a Backend.
type remote struct {
	b       Backend
	id      string
	budgets []Budget
}

// end tells the backend, outside the gates' locks, that the reservation
// was charged (OpCharge) or ended.
func (m *remote) end(op Op, amount cost.Nanos) {
	if m != nil {
		m.b.End(m.id, m.budgets, op, amount)
	}
}

// Worst is the worst case reserved.
func (r *Reservation) Worst() cost.Nanos {
	if r == nil {
		return 0
	}
	return r.worst
}

// Charge records c of the work's cost as known and spent (part of a batch's
// results, harvested): it moves from reserved to spent; the rest stays
// reserved. A charge beyond the worst case is spent all the same.
func (r *Reservation) Charge(c cost.Nanos) {
	if r == nil || c <= 0 {
		return
	}
	gs := r.g.chain()
	lockAll(gs)
	if r.done {
		unlockAll(gs)
		return
	}
	r.chargeLocked(gs, c)
	unlockAll(gs)
	r.remote.end(OpCharge, c)
}

func (r *Reservation) chargeLocked(gs []*Gate, c cost.Nanos) {
	d := min(c, r.left)
	for _, x := range gs {
		x.spent += c
		x.reserved -= d
		x.notify()
	}
	r.left -= d
	r.charged += c
}

// Settle ends the reservation with the work's whole cost, actual (what was
// charged already included): the rest of the worst case is free again.
func (r *Reservation) Settle(actual cost.Nanos) {
	if r == nil {
		return
	}
	gs := r.g.chain()
	lockAll(gs)
	if r.done {
		unlockAll(gs)
		return
	}
	if extra := actual - r.charged; extra > 0 {
		r.chargeLocked(gs, extra)
	}
	r.endLocked(gs, false)
	unlockAll(gs)
	r.remote.end(OpSettle, actual)
}

// Release ends the reservation with nothing billed beyond what was
// charged (an answer that bills nothing: a 429, a 4xx, a create refused).
func (r *Reservation) Release() { r.end(false) }

// Keep ends the reservation with its cost unknown (an answer lost after
// the request went out; a batch left running, or given up on, whose
// billing cannot be read): what is left of the worst case stays counted,
// as held, for the life of the gate, so the cap can never be passed by it.
func (r *Reservation) Keep() { r.end(true) }

// end ends the reservation once; keep holds what is left of its worst case.
func (r *Reservation) end(keep bool) {
	if r == nil {
		return
	}
	gs := r.g.chain()
	lockAll(gs)
	if r.done {
		unlockAll(gs)
		return
	}
	r.endLocked(gs, keep)
	unlockAll(gs)
	op := OpRelease
	if keep {
		op = OpKeep
	}
	r.remote.end(op, 0)
}

func (r *Reservation) endLocked(gs []*Gate, keep bool) {
	for _, x := range gs {
		x.reserved -= r.left
		if keep {
			x.held += r.left
		}
		x.n--
		x.notify()
	}
	r.left = 0
	r.done = true
}
