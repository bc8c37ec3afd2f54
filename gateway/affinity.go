package gateway

import (
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/promptcache"
)

// Cache-affine placement. The API keeps a prompt cache per organisation: a
// request whose prefix (up to its last cache_control block) was sent
// recently goes to the org where that prefix is warm when that org's lane
// admits it, and to the next lane that admits it otherwise, warming that
// one (promptcache.Rank). Requests without a prefix rotate over the orgs
// as before.

// cacheNote is what an attempt's answer showed of its prefix, written by
// the exchange (exchange.feedback) before its grant is released.
type cacheNote struct {
	ok     bool  // the attempt succeeded
	cached int64 // prompt tokens read from or written to the cache
}

// prefixOf is the prefix body marks for caching with model, or nil.
func prefixOf(model string, body []byte) *promptcache.Prefix {
	if p, ok := promptcache.Of(model, body); ok {
		return &p
	}
	return nil
}

// laneOrder returns the order in which q's lanes are tried for w: the
// rotation from q.next, ranked by where w's prefix is warm. The slice is
// q's own, valid until the next call. s.mu is held.
func (s *laneSet) laneOrder(q *poolQueue, w *waiter, now time.Time) []int {
	n := len(q.lanes)
	q.order = q.order[:0]
	for i := range n {
		q.order = append(q.order, (q.next+i)%n)
	}
	if w.pre == nil {
		return q.order
	}
	if cap(q.names) < n {
		q.names = make([]string, n)
		q.warmth = make([]promptcache.Warmth, n)
	}
	names, warmth := q.names[:n], q.warmth[:n]
	for i, l := range q.lanes {
		names[i] = l.up.Name
	}
	if s.places.Where(now, *w.pre, names, warmth) {
		promptcache.Rank(warmth, q.order)
	}
	return q.order
}

// granted is w's grant by lane l, its prefix recorded as sent there.
func (s *laneSet) granted(w *waiter, l *lane, p gate.Permit, now time.Time) grant {
	g := grant{lane: l, permit: p}
	if w.pre != nil {
		s.places.Sent(now, *w.pre, l.up.Name)
		g.pre, g.note = w.pre, &cacheNote{}
	}
	return g
}

// prefixAnswered records the end of g's attempt for its prefix.
func (s *laneSet) prefixAnswered(g grant, now time.Time) {
	if g.pre == nil {
		return
	}
	s.places.Answered(now, *g.pre, g.lane.up.Name, g.note.ok, g.note.cached)
}

// noteCache records in x's current grant what the attempt's answer showed
// of its prefix.
func (x *exchange) noteCache(o anthropic.Outcome, u *anthropic.Usage) {
	if x.note == nil {
		return
	}
	x.note.ok = o.Kind == anthropic.Success
	if u != nil {
		x.note.cached = u.CacheReadInputTokens + u.CacheCreationInputTokens
	}
}
