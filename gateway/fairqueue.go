package gateway

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// waitKeep is how many of its latest waits a (client, class) keeps for
// its percentiles.
const waitKeep = 1024

// share is one client's part of the gateway's lanes: its weight, default
// class and hard share (MaxInFlight, 0: none), what it has in flight and
// how long its latest requests waited for a lane. Safe for concurrent use.
type share struct {
	name        string
	weight      float64
	class       Class
	maxInFlight int64

	inFlight [nClasses]atomic.Int64

	mu    sync.Mutex
	waits [nClasses][]time.Duration // a ring of the latest waitKeep
	nwait [nClasses]int             // waits ever recorded
}

func newShare(c Client) *share {
	w := c.Weight
	if w <= 0 {
		w = 1
	}
	return &share{name: c.Name, weight: w, class: c.Priority, maxInFlight: int64(c.MaxInFlight)}
}

// full reports that the client holds its hard share.
func (s *share) full() bool {
	return s.maxInFlight > 0 && s.inFlight[Interactive].Load()+s.inFlight[Bulk].Load() >= s.maxInFlight
}

// admitted counts a request of class c admitted after waiting wait.
func (s *share) admitted(c Class, wait time.Duration) {
	s.inFlight[c].Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waits[c]) < waitKeep {
		s.waits[c] = append(s.waits[c], wait)
	} else {
		s.waits[c][s.nwait[c]%waitKeep] = wait
	}
	s.nwait[c]++
}

// waitQuantiles are the p50 and p99 of the latest waits of class c, and
// how many waits they are of.
func (s *share) waitQuantiles(c Class) (p50, p99 time.Duration, n int) {
	s.mu.Lock()
	w := slices.Clone(s.waits[c])
	s.mu.Unlock()
	if len(w) == 0 {
		return 0, 0, 0
	}
	slices.Sort(w)
	at := func(q float64) time.Duration { return w[min(len(w)-1, int(q*float64(len(w))))] }
	return at(0.50), at(0.99), len(w)
}

// flow is the waiters of one (client, class) in one pool, first come first
// served among themselves.
type flow struct {
	share   *share
	class   Class
	waiters []*waiter
	// start is its head's virtual start tag: the finish tag of the
	// request before it, or the class's virtual time if the flow was
	// empty when the head came. finish is its last admitted's finish tag.
	start, finish float64
}

// fairQueue is the requests waiting for a lane of one pool: weighted fair
// queuing between clients within a class (start-time fair queuing: each
// admission advances the client's virtual clock by 1 ÷ its weight, and
// the waiter whose next finish tag is least goes first), interactive
// before bulk. It is work-conserving: a client alone, or a class alone,
// is admitted as fast as the lanes allow, and a client at its hard share
// is passed over, not waited for. A client that stops waiting and comes
// back later starts at the class's virtual time, with no credit saved up;
// one that keeps waiting keeps its tags, so a heavier client's admissions
// never push it back.
// Not safe for concurrent use (laneSet.mu guards it).
type fairQueue struct {
	flows []*flow // every (client, class) that has waited here
	vtime [nClasses]float64
	n     int
	seq   uint64 // arrival order, for ties
}

// push queues w at the end of its client's and class's flow.
func (q *fairQueue) push(w *waiter) {
	q.seq++
	w.seq = q.seq
	f := q.flowOf(w.share, w.class)
	if len(f.waiters) == 0 {
		f.start = max(q.vtime[f.class], f.finish)
	}
	f.waiters = append(f.waiters, w)
	q.n++
}

func (q *fairQueue) flowOf(s *share, c Class) *flow {
	for _, f := range q.flows {
		if f.share == s && f.class == c {
			return f
		}
	}
	f := &flow{share: s, class: c}
	q.flows = append(q.flows, f)
	return f
}

// finishOf is f's head's finish tag.
func (f *flow) finishOf() float64 { return f.start + 1/f.share.weight }

// next is the waiter to admit next, or nil when every waiting client holds
// its hard share (or none waits).
func (q *fairQueue) next() *waiter {
	for c := range nClasses {
		var best *flow
		var bestTag float64
		for _, f := range q.flows {
			if f.class != c || len(f.waiters) == 0 || f.share.full() {
				continue
			}
			tag := f.finishOf()
			if best == nil || tag < bestTag || (tag == bestTag && f.waiters[0].seq < best.waiters[0].seq) {
				best, bestTag = f, tag
			}
		}
		if best != nil {
			return best.waiters[0]
		}
	}
	return nil
}

// admitted takes w, the waiter next returned, off the queue and advances
// its client's and its class's virtual clocks.
func (q *fairQueue) admitted(w *waiter) {
	f := q.flowOf(w.share, w.class)
	f.finish, q.vtime[f.class] = f.finishOf(), f.start
	f.start = f.finish // the next head's, if any
	f.waiters[0] = nil
	f.waiters = f.waiters[1:]
	q.n--
}

// remove takes w off the queue (its client went away or its deadline
// passed) and reports whether it was there.
func (q *fairQueue) remove(w *waiter) bool {
	f := q.flowOf(w.share, w.class)
	i := slices.Index(f.waiters, w)
	if i < 0 {
		return false
	}
	f.waiters = slices.Delete(f.waiters, i, i+1)
	q.n--
	return true
}

// len is how many wait.
func (q *fairQueue) len() int { return q.n }

// drain takes every waiter off, calling fn on each.
func (q *fairQueue) drain(fn func(*waiter)) {
	for _, f := range q.flows {
		for _, w := range f.waiters {
			fn(w)
		}
		f.waiters = nil
	}
	q.n = 0
}

// QueueStatus is one (client, class)'s part of the gateway's queue now:
// how many of its requests wait for a lane and how many the lanes
// admitted and have not yet released, and how long its latest requests
// (up to 1,024) waited to be admitted.
type QueueStatus struct {
	Client      string  `json:"client"`
	Class       string  `json:"class"`
	Weight      float64 `json:"weight"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	Queued      int     `json:"queued"`
	InFlight    int64   `json:"in_flight"`
	// Waits is how many waits the percentiles are of (0: none yet).
	Waits     int     `json:"waits"`
	WaitP50Ms float64 `json:"wait_p50_ms"`
	WaitP99Ms float64 `json:"wait_p99_ms"`
}

// queueStatus describes every (client, class) that has waited, is
// waiting or is in flight, and every known client's own class, sorted by
// client then class.
func (s *laneSet) queueStatus() []QueueStatus {
	s.mu.Lock()
	depth := map[*share]*[nClasses]int{}
	for _, sh := range s.shares {
		depth[sh] = new([nClasses]int)
	}
	for _, q := range s.pools {
		for _, f := range q.fq.flows {
			depth[f.share][f.class] += len(f.waiters)
		}
	}
	s.mu.Unlock()
	var out []QueueStatus
	for sh, d := range depth {
		for c := range nClasses {
			p50, p99, n := sh.waitQuantiles(c)
			inf := sh.inFlight[c].Load()
			if c != sh.class && n == 0 && inf == 0 && d[c] == 0 {
				continue
			}
			out = append(out, QueueStatus{Client: sh.name, Class: c.String(), Weight: sh.weight, MaxInFlight: int(sh.maxInFlight),
				Queued: d[c], InFlight: inf, Waits: n, WaitP50Ms: ms(p50), WaitP99Ms: ms(p99)})
		}
	}
	slices.SortFunc(out, func(a, b QueueStatus) int {
		if a.Client != b.Client {
			return strings.Compare(a.Client, b.Client)
		}
		return strings.Compare(a.Class, b.Class)
	})
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
