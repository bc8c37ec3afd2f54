package dispatch

import (
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/promptcache"
)

// Cache-affine placement. The API keeps a prompt cache per organisation;
// an item whose prefix (up to its last cache_control block) was sent
// recently goes to the lane of the org where that prefix is warm when that
// lane admits it, and to the next lane that admits it otherwise, warming
// it (promptcache.Rank), after the lanes with headroom have taken the
// items that are warm there or cold everywhere. An item whose prefix is being written (sent, not
// yet answered) and warm in no lane with headroom waits for that answer
// while this engine has requests in flight, since until the answer begins
// a second request would write the prefix again; the lanes meanwhile send
// the items behind it. Items without a prefix worth placing rotate over
// the lanes as before. Placement changes which item a lane sends and
// where, never whether a lane with headroom sends: it sends something
// whenever an item in sight may go.

// pickWindow is how far down its pool's queue admission looks for items
// a lane may send.
const pickWindow = 512

// itemPrefix is the prompt-cache prefix body (an item's params) marks.
func itemPrefix(model string, body []byte) (promptcache.Prefix, bool) {
	return promptcache.Of(model, body)
}

// anyPrefixed reports whether an item in sight in q has a prefix to
// place.
func anyPrefixed(q []*work) bool {
	for _, w := range q[:min(len(q), pickWindow)] {
		if w.hasPre {
			return true
		}
	}
	return false
}

// admitPlaced is admit for a pool queue q holding items with prefixes.
// A first pass, in queue order, sends each item in sight to the first of
// its warm lanes that admits it (to any lane, rotating, when its prefix
// is warm nowhere), and passes over the items whose warm lanes are all
// full; a second pass, while lanes still have headroom, sends those to the
// next lane that admits them, warming it. Items whose prefix is being
// written wait in both passes (see above). It returns the items left, in
// order, and stop when admission must end for every pool (the spend gate
// has no room).
func (e *Engine) admitPlaced(now time.Time, q []*work, order []*laneRef, workers *sync.WaitGroup, next *time.Duration) (rest []*work, stop bool) {
	ps := &placeState{e: e, now: now, order: order, workers: workers, next: next}
	n := len(order)
	ps.names = make([]string, n)
	for i, l := range order {
		ps.names[i] = l.org.Name
	}
	ps.warmth = make([]promptcache.Warmth, n)
	ps.rank = make([]int, n)
	ps.blocked = make([]bool, n)
	rest, deferred, stop := ps.pass(q, true)
	if stop || deferred == 0 || ps.nblocked == n {
		return rest, stop
	}
	rest, _, stop = ps.pass(rest, false)
	return rest, stop
}

// placeState is one admitPlaced call.
type placeState struct {
	e        *Engine
	now      time.Time
	order    []*laneRef
	workers  *sync.WaitGroup
	next     *time.Duration
	names    []string
	warmth   []promptcache.Warmth
	rank     []int
	blocked  []bool
	nblocked int
	rot      int // where items without a prefix start: they rotate
	memo     promptcache.Key
	haveMemo bool
	worth    bool
}

// pass goes over q once (see admitPlaced); first is the first pass. It
// returns the items left, how many of them were passed over for a full
// warm lane, and stop.
func (ps *placeState) pass(q []*work, first bool) (rest []*work, deferred int, stop bool) {
	e, n := ps.e, len(ps.order)
	rest = q[:0:0]
	for idx, w := range q {
		if ps.nblocked == n || idx >= pickWindow {
			return append(rest, q[idx:]...), deferred, false
		}
		for i := range ps.rank {
			ps.rank[i] = (ps.rot + i) % n
		}
		onlyWarm := false
		if w.hasPre {
			if !ps.haveMemo || w.pre.Key != ps.memo {
				ps.worth = e.places.Where(ps.now, w.pre, ps.names, ps.warmth)
				ps.memo, ps.haveMemo = w.pre.Key, true
			}
			if ps.worth {
				if e.inflight > 0 && promptcache.Waits(ps.warmth, ps.blocked) {
					rest = append(rest, w) // waits for the writer's answer
					continue
				}
				promptcache.Rank(ps.warmth, ps.rank)
				onlyWarm = first && ps.warmth[ps.rank[0]] == promptcache.Warm
			}
		}
		admitted := false
		for _, i := range ps.rank {
			if onlyWarm && ps.warmth[i] != promptcache.Warm {
				break
			}
			if ps.blocked[i] {
				continue
			}
			res, err := e.reserve(w)
			if err != nil {
				return append(rest, q[idx:]...), deferred, true
			}
			p, wait, ok := ps.order[i].TryAdmit(ps.now, gate.Demand{EstInput: w.it.EstInput, MaxTokens: w.it.MaxTokens})
			if !ok {
				res.Release()
				ps.blocked[i] = true
				ps.nblocked++
				if wait > 0 {
					*ps.next = min(*ps.next, wait)
				}
				continue
			}
			e.nready--
			e.start1(w, ps.order[i], p, res, ps.workers)
			if !w.hasPre || !ps.worth {
				ps.rot = (i + 1) % n
			}
			ps.haveMemo = false // its warmth changed
			admitted = true
			break
		}
		if !admitted {
			if onlyWarm {
				deferred++
			}
			rest = append(rest, w)
		}
	}
	return rest, deferred, false
}

// prefixSent and prefixAnswered keep Places up to date with a's attempt.
func (e *Engine) prefixSent(now time.Time, a *attempt) {
	if a.w.hasPre {
		e.places.Sent(now, a.w.pre, a.lane.org.Name)
	}
}

func (e *Engine) prefixAnswered(now time.Time, a *attempt, success bool) {
	if a.w.hasPre {
		e.places.Answered(now, a.w.pre, a.lane.org.Name, success, a.usage.CacheRead+a.usage.CacheWrite)
	}
}
