// Package upstream is what every route knows of the APIs' side: each
// API as a Provider (provider.go: addressing, the classifier, rate
// limits, usage and cost, the worst case, pools and caps), the one
// attempt (attempt.go), which organisation each key reaches, the one rule
// that two keys of one organisation hold one cap between them, and the
// lanes under it that a process's routes share (Lanes).
package upstream

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

// Orgs applies the same-organisation rule to the lanes of one process.
//
// The API's limits are per organisation, and an organisation may have
// several keys: two orgs of a configuration whose keys reach one
// organisation (the anthropic-organization-id of their answers, or
// OpenAI's openai-organization, as each org's Provider reads it) add no
// capacity. Orgs learns each key's organisation from its first answer
// and, until then, lets each of its lanes send one request at a time.
// Counted per model pool, the requests in flight of every organisation
// together with those of the keys not yet known (which may reach any of
// them) never pass the pool's cap; once a key is known to reach the
// organisation of an org listed before it, its lanes stop (Dropped), and
// the earlier org's carry the work.
//
// A key whose answers carry no organisation id (a 2xx without the header:
// an API or mock that does not send it) is taken to reach an
// organisation of its own. It is safe for concurrent use.
type Orgs struct {
	mu    sync.Mutex
	order map[string]int // org name → its place in the configuration
	keys  map[string]string
	info  map[string]*orgInfo
	pools map[anthropic.Pool]map[string]int // pool → org name → in flight
	// onSame, when set, is told (outside the lock) that drop reaches the
	// organisation id of keep.
	onSame func(drop, keep, id, reason string)
	// gates are the lane gates under the rule, by org (Wrap), told what
	// Discover learns; wakes are OnLearn's functions.
	gates    map[string][]*Gate
	wakes    map[uint64]func()
	nextWake uint64
}

type orgInfo struct {
	known bool
	// asking: the key's first discovery request is out (Discover); its
	// lanes send nothing meanwhile.
	asking  bool
	id      string // "" when known without an id: an organisation of its own
	dropped string // why its lanes stop, once it reaches an earlier org's organisation
	keep    string // the earlier org whose lanes carry its work, once dropped
}

// NewOrgs returns the rule for orgs, in their configured order (of two
// keys of one organisation the later stops). onSame, when set, is called
// once for each org that stops, outside any lock.
func NewOrgs(orgs []org.Org, onSame func(drop, keep, id, reason string)) *Orgs {
	o := &Orgs{order: map[string]int{}, keys: map[string]string{}, info: map[string]*orgInfo{},
		pools: map[anthropic.Pool]map[string]int{}, onSame: onSame}
	for i, x := range orgs {
		o.order[x.Name] = i
		o.keys[x.Name] = x.Key.Fingerprint()
		o.info[x.Name] = &orgInfo{}
	}
	return o
}

// ID is the organisation id org's key reaches, and whether it is known.
func (o *Orgs) ID(name string) (id string, known bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if in := o.info[name]; in != nil {
		return in.id, in.known
	}
	return "", false
}

// Dropped is why org's lanes stop (its key reaches the organisation of an
// org listed before it), or "".
func (o *Orgs) Dropped(name string) string {
	reason, _, _ := o.Drop(name)
	return reason
}

// Drop is why org's lanes stop, the org listed before it whose key reaches
// the same organisation, and that organisation's id; all "" while it does
// not stop.
func (o *Orgs) Drop(name string) (reason, keep, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if in := o.info[name]; in != nil && in.dropped != "" {
		return in.dropped, in.keep, in.id
	}
	return "", "", ""
}

// roomLocked reports whether a lane of org name in pool may admit one
// more request, with capN the pool's cap. o.mu is held.
func (o *Orgs) roomLocked(name string, pool anthropic.Pool, capN int) bool {
	in := o.info[name]
	if in == nil {
		return true // an org the rule was not told of: its own organisation
	}
	if in.dropped != "" {
		return false
	}
	fl := o.pools[pool]
	if !in.known && (in.asking || fl[name] > 0) {
		// Nothing while its first discovery request is out (TryAdmit),
		// then one request until the organisation is known.
		return false
	}
	unknown := 0
	for n, c := range fl {
		if x := o.info[n]; x != nil && !x.known {
			unknown += c
		}
	}
	if in.known {
		return o.groupLocked(fl, name)+unknown+1 <= capN
	}
	most := 0
	for n, c := range fl {
		if x := o.info[n]; c > 0 && x != nil && x.known {
			most = max(most, o.groupLocked(fl, n))
		}
	}
	return most+unknown+1 <= capN
}

// groupLocked is how many requests of fl (a pool's in flight by org) are
// in flight on the organisation of org name, which is known. o.mu is held.
func (o *Orgs) groupLocked(fl map[string]int, name string) int {
	id := o.info[name].id
	if id == "" {
		return fl[name] // an organisation of its own
	}
	n := 0
	for m, c := range fl {
		if x := o.info[m]; x != nil && x.known && x.id == id {
			n += c
		}
	}
	return n
}

// learn records what an answer of org name's key showed of its
// organisation; it returns the notice to give (drop non-empty) when the
// key turns out to reach an earlier org's organisation. o.mu is held.
func (o *Orgs) learnLocked(name string, fb gate.Feedback) (drop, keep, id, reason string) {
	in := o.info[name]
	if in == nil || in.known {
		return
	}
	id = fb.Limits.OrganizationID
	if id == "" && (fb.Outcome.Status < 200 || fb.Outcome.Status > 299) {
		return // no answer of the API's own yet: still unknown
	}
	in.known, in.id = true, id
	if id == "" {
		return "", "", "", ""
	}
	// Of the orgs that reach id, the first listed keeps its lanes.
	first := name
	for n, x := range o.info {
		if x.known && x.id == id && x.dropped == "" && o.order[n] < o.order[first] {
			first = n
		}
	}
	for n, x := range o.info {
		if n == first || !x.known || x.id != id || x.dropped != "" {
			continue
		}
		x.dropped, x.keep = fmt.Sprintf("key %s reaches the same organisation as org %s (%s): limits do not add, so its work goes through %s's lanes", o.keys[n], first, id, first), first
		if n == name || drop == "" {
			drop, keep, reason = n, first, x.dropped
		}
	}
	return drop, keep, id, reason
}

// Wrap returns g (the gate of lane cfg) under the rule. A gate that is
// already under o is returned as it is.
func (o *Orgs) Wrap(g gate.Gate, cfg gate.LaneConfig) gate.Gate {
	if u, ok := g.(interface{ SameOrg() *Orgs }); ok && u.SameOrg() == o {
		return g
	}
	capN := cfg.Cap
	if capN <= 0 {
		capN = cfg.WithDefaults().Cap
	}
	w := &Gate{Gate: g, o: o, org: cfg.Org, pool: cfg.Pool, cap: capN}
	o.mu.Lock()
	if o.gates == nil {
		o.gates = map[string][]*Gate{}
	}
	o.gates[cfg.Org] = append(o.gates[cfg.Org], w)
	id := ""
	if in := o.info[cfg.Org]; in != nil && in.known {
		id = in.id
	}
	o.mu.Unlock()
	// A lane made after its key's organisation was learnt (a pool's first
	// request after the discovery, or after an answer in another pool)
	// starts on what is known of it, as the lanes then were told.
	tellOrganisation([]*Gate{w}, id)
	return w
}

// tellOrganisation tells the gates of gs that keep their own record of
// their key's organisation (a shared gate: its budget is the
// organisation's once known) that it is id; nothing when id is "".
func tellOrganisation(gs []*Gate, id string) {
	if id == "" {
		return
	}
	for _, g := range gs {
		if l, ok := g.Gate.(organisationLearner); ok {
			l.LearnOrganisation(id)
		}
	}
}

// askingRecheck is the wait a lane held by its key's first discovery
// request reports (its end wakes the lane's callers sooner).
const askingRecheck = 100 * time.Millisecond

// Gate is a lane's gate under the same-organisation rule. It implements
// gate.Gate and gate.Waker (forwarded to the gate it wraps).
type Gate struct {
	gate.Gate
	o    *Orgs
	org  string
	pool anthropic.Pool
	cap  int
}

var (
	_ gate.Gate  = (*Gate)(nil)
	_ gate.Waker = (*Gate)(nil)
)

// SameOrg is the rule g is under.
func (g *Gate) SameOrg() *Orgs { return g.o }

// TryAdmit implements gate.Gate: the wrapped gate admits only while the
// rule leaves room (a refusal for room waits for a release: the request
// that holds it is in flight in the same pool).
func (g *Gate) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	o := g.o
	o.mu.Lock()
	defer o.mu.Unlock()
	in := o.info[g.org]
	if in != nil && in.dropped != "" {
		return gate.Permit{}, time.Duration(math.MaxInt64), false
	}
	if in != nil && !in.known && in.asking {
		// The key's first discovery request is out: its end wakes the
		// callers (OnLearn); the bound only tells a caller with nothing
		// in flight that the lane will admit again.
		return gate.Permit{}, askingRecheck, false
	}
	if !o.roomLocked(g.org, g.pool, g.cap) {
		return gate.Permit{}, 0, false
	}
	p, wait, ok := g.Gate.TryAdmit(now, d)
	if ok {
		fl := o.pools[g.pool]
		if fl == nil {
			fl = map[string]int{}
			o.pools[g.pool] = fl
		}
		fl[g.org]++
	}
	return p, wait, ok
}

// Done implements gate.Gate: what the answer showed of the key's
// organisation is learnt before the slot is freed.
func (g *Gate) Done(now time.Time, p gate.Permit, fb gate.Feedback) {
	o := g.o
	o.mu.Lock()
	in := o.info[g.org]
	wasKnown := in == nil || in.known
	drop, keep, id, reason := o.learnLocked(g.org, fb)
	var others []*Gate
	learnt := ""
	if !wasKnown && in.known {
		// The other lanes of the key (other pools) learn it too: a
		// shared gate whose first request is still out would stay on
		// the key's own budget until its own answer.
		learnt = in.id
		for _, x := range o.gates[g.org] {
			if x != g {
				others = append(others, x)
			}
		}
	}
	if fl := o.pools[g.pool]; fl[g.org] > 0 {
		fl[g.org]--
	}
	o.mu.Unlock()
	g.Gate.Done(now, p, fb)
	tellOrganisation(others, learnt)
	if drop != "" && o.onSame != nil {
		o.onSame(drop, keep, id, reason)
	}
}

// Disabled implements gate.Gate: a lane whose key reaches an earlier
// org's organisation is out too.
func (g *Gate) Disabled() string {
	if r := g.Gate.Disabled(); r != "" {
		return r
	}
	return g.o.Dropped(g.org)
}

// Snapshot implements gate.Gate.
func (g *Gate) Snapshot(now time.Time) gate.LaneSnapshot {
	s := g.Gate.Snapshot(now)
	if s.Disabled == "" {
		s.Disabled = g.o.Dropped(g.org)
	}
	return s
}

// SetWake implements gate.Waker for a wrapped gate that wakes its
// callers itself.
func (g *Gate) SetWake(wake func()) {
	if w, ok := g.Gate.(gate.Waker); ok {
		w.SetWake(wake)
	}
}
