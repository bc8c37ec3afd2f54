package gateway

import (
	"testing"
)

// admitN admits n requests from q in its order and counts them by client.
func admitN(q *fairQueue, n int) map[string]int {
	got := map[string]int{}
	for range n {
		w := q.next()
		if w == nil {
			break
		}
		q.admitted(w)
		got[w.share.name]++
	}
	return got
}

func queueN(q *fairQueue, s *share, c Class, n int) []*waiter {
	var ws []*waiter
	for range n {
		w := &waiter{share: s, class: c}
		q.push(w)
		ws = append(ws, w)
	}
	return ws
}

// Within a class, backlogged clients are admitted in proportion to their
// weights, whoever queued first.
func TestFairQueueSharesByWeight(t *testing.T) {
	var q fairQueue
	a := newShare(Client{Name: "a", Weight: 1, Priority: Bulk})
	b := newShare(Client{Name: "b", Weight: 3, Priority: Bulk})
	queueN(&q, a, Bulk, 1000) // a queued all of its first
	queueN(&q, b, Bulk, 1000)
	got := admitN(&q, 400)
	if got["a"] != 100 || got["b"] != 300 {
		t.Errorf("admitted %v: want a 100, b 300", got)
	}
}

// Every waiting interactive request goes before any bulk one; bulk gets
// everything when no interactive request waits (work-conserving).
func TestFairQueueInteractiveFirst(t *testing.T) {
	var q fairQueue
	bulk := newShare(Client{Name: "bulk", Priority: Bulk})
	inter := newShare(Client{Name: "inter"})
	queueN(&q, bulk, Bulk, 50)
	queueN(&q, inter, Interactive, 2)
	if got := admitN(&q, 2); got["inter"] != 2 {
		t.Errorf("first two admitted: %v, want both interactive", got)
	}
	if got := admitN(&q, 100); got["bulk"] != 50 || q.len() != 0 {
		t.Errorf("then %v with %d left: want the 50 bulk", got, q.len())
	}
}

// A client that was away comes back at the class's virtual time: its idle
// time saves up no credit to crowd the others out with.
func TestFairQueueNoCreditForIdleTime(t *testing.T) {
	var q fairQueue
	a := newShare(Client{Name: "a"})
	b := newShare(Client{Name: "b"})
	queueN(&q, a, Interactive, 1000)
	admitN(&q, 500) // a alone for a while
	queueN(&q, b, Interactive, 1000)
	if got := admitN(&q, 100); got["a"] != 50 || got["b"] != 50 {
		t.Errorf("after b's return: %v, want 50 each", got)
	}
}

// A client at its max_in_flight is passed over, not waited for; the
// others take the slot. It comes back when its requests end.
func TestFairQueueHardSharePassedOver(t *testing.T) {
	var q fairQueue
	capped := newShare(Client{Name: "capped", Weight: 10, MaxInFlight: 2})
	other := newShare(Client{Name: "other"})
	queueN(&q, capped, Interactive, 10)
	queueN(&q, other, Bulk, 10)
	next := func() string {
		w := q.next()
		if w == nil {
			return ""
		}
		q.admitted(w)
		w.share.admitted(w.class, 0)
		return w.share.name
	}
	var order []string
	for range 4 {
		order = append(order, next())
	}
	if order[0] != "capped" || order[1] != "capped" || order[2] != "other" || order[3] != "other" {
		t.Errorf("order %v: want capped twice, then other", order)
	}
	capped.inFlight[Interactive].Add(-1)
	if n := next(); n != "capped" {
		t.Errorf("after a release of capped: %q, want capped", n)
	}
	var only fairQueue
	queueN(&only, capped, Interactive, 1)
	if w := only.next(); w != nil {
		t.Error("a queue of only a client at its hard share offered a waiter")
	}
}

// A waiter that leaves is taken off; the rest keep their order.
func TestFairQueueRemove(t *testing.T) {
	var q fairQueue
	a := newShare(Client{Name: "a"})
	ws := queueN(&q, a, Interactive, 3)
	if !q.remove(ws[1]) || q.remove(ws[1]) || q.len() != 2 {
		t.Fatalf("remove: len %d", q.len())
	}
	if w := q.next(); w != ws[0] {
		t.Error("head changed")
	}
	q.admitted(ws[0])
	if w := q.next(); w != ws[2] {
		t.Error("the third is not next")
	}
	if q.depth(a, Interactive) != 1 || q.depth(a, Bulk) != 0 {
		t.Error("depth")
	}
}

// depth is how many of s's requests of class c wait.
func (q *fairQueue) depth(s *share, c Class) int {
	for _, f := range q.flows {
		if f.share == s && f.class == c {
			return len(f.waiters)
		}
	}
	return 0
}
