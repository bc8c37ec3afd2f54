package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
)

// Group-commit bounds: a batch is committed when it holds commitMax outcomes
// or its first outcome has waited commitWait.
const (
	commitMax  = 512
	commitWait = 20 * time.Millisecond
)

// committer is the one writer of durable state: it commits outcomes in
// batches, and only then appends their result lines, so results.jsonl never
// holds anything the store does not.
type committer struct {
	sink *rundir.Sink
	c    *counters
	ev   *rundir.EventLog
	in   chan queued
	// cache, when set, stores the entries of successes (queued.put) in
	// the same group commit as their results, just before them.
	cache *cache.Cache
	mu    sync.Mutex
	err   error
	// failed is set when a commit failed: the run must stop; nothing more
	// is marked done.
	failed atomic.Bool
	closed bool
	// warnedPut: a failed cache write has been reported.
	warnedPut bool
	// journalKey, when set, is the store counter that records how many of
	// the attempt journal's maybe-billed records have been flushed.
	journalKey string
}

func newCommitter(sink *rundir.Sink, c *counters, ev *rundir.EventLog) *committer {
	return &committer{sink: sink, c: c, ev: ev, in: make(chan queued, 4096)}
}

// queued is an outcome waiting for the committer, with what it means for
// the cache.
type queued struct {
	store.Outcome
	// hit: the item was answered without a request; saved is what that
	// request cost when it was sent, dup whether the answer came from a
	// duplicate inside the input rather than the cache file.
	hit   bool
	dup   bool
	saved cost.Nanos
	// put is the cache entry of a success, when the run writes the cache.
	put *cache.Entry
}

// submit queues an outcome; after a failure it is dropped (the item stays
// pending in the store and is sent again on resume).
func (m *committer) submit(o store.Outcome) { m.submitQ(queued{Outcome: o}) }

// submitHit queues the outcome of an item answered without a request.
// It is safe to call from any goroutine.
func (m *committer) submitHit(o store.Outcome, saved cost.Nanos, dup bool) {
	m.submitQ(queued{Outcome: o, hit: true, dup: dup, saved: saved})
}

func (m *committer) submitQ(q queued) {
	if m.failed.Load() {
		return
	}
	m.in <- q
}

func (m *committer) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
	m.failed.Store(true)
}

// close ends the input; run commits what is left and returns.
func (m *committer) close() {
	if !m.closed {
		m.closed = true
		close(m.in)
	}
}

func (m *committer) run() {
	batch := make([]queued, 0, commitMax)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		o, ok := <-m.in
		if !ok {
			m.commit(batch) // counters, at least
			return
		}
		batch = append(batch[:0], o)
		timer.Reset(commitWait)
	collect:
		for len(batch) < commitMax {
			select {
			case o, ok := <-m.in:
				if !ok {
					m.commit(batch)
					return
				}
				batch = append(batch, o)
			case <-timer.C:
				break collect
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		m.commit(batch)
		// Committed: the input closing next must not commit it again (its
		// outcomes would be skipped, but it once added the cache's
		// figures a second time).
		batch = batch[:0]
	}
}

func (m *committer) commit(qs []queued) {
	if m.failed.Load() {
		return
	}
	ctr := m.takeCounters()
	if len(qs) == 0 && len(ctr) == 0 {
		return
	}
	batch := make([]store.Outcome, len(qs))
	var puts []cache.Entry
	var putAt []int // batch index of each put
	for i, q := range qs {
		batch[i] = q.Outcome
		if q.hit {
			// Counted by the store with the outcome, only when it takes
			// it: once per item, whatever submits it again.
			c := map[string]int64{rundir.CounterCacheHits: 1, rundir.CounterCacheSavedNanos: int64(q.saved)}
			if q.dup {
				c[rundir.CounterCacheDuplicates] = 1
			}
			batch[i].Counters = c
		}
		if q.put != nil && m.cache != nil {
			puts = append(puts, *q.put)
			putAt = append(putAt, i)
		}
	}
	if len(puts) > 0 {
		// The cache only saves money: a write that fails is a warning,
		// never a reason to hold back a result that is paid for.
		if _, err := m.cache.Put(context.Background(), puts); err != nil {
			m.c.cachePutFailed.Add(int64(len(puts)))
			// Counted with each outcome, when the store takes it, so the
			// summary of the run directory says how many successes the
			// cache misses (and a later run will send again).
			for _, i := range putAt {
				if batch[i].Counters == nil {
					batch[i].Counters = map[string]int64{}
				}
				batch[i].Counters[rundir.CounterCacheWriteFailed]++
			}
			if !m.warnedPut {
				m.warnedPut = true
				m.ev.Emit(rundir.EventWarning, "writing the cache failed; results are kept, the cache misses them (a later run sends them again; the summary's cache.write_failed counts them): "+err.Error(), nil)
			}
		}
	}
	res, err := m.sink.Commit(context.Background(), store.Batch{Outcomes: batch, Counters: ctr})
	if err != nil {
		m.fail(err)
		return
	}
	var succ, errd, costN, hits, saved int64
	for i, o := range batch {
		if res.RSeq[i] == 0 {
			continue // already terminal: never a second line
		}
		if qs[i].hit {
			hits++
			saved += int64(qs[i].saved)
		}
		if o.State == store.Succeeded {
			succ++
		} else {
			errd++
		}
		costN += o.CostNanos
	}
	m.c.succeeded.Add(succ)
	m.c.errored.Add(errd)
	m.c.costN.Add(costN)
	m.c.cacheHits.Add(hits)
	m.c.cacheSaved.Add(saved)
}

func (m *committer) takeCounters() map[string]int64 {
	out := map[string]int64{}
	take := func(name string, v *atomic.Int64, last *int64) {
		cur := v.Load()
		if d := cur - *last; d != 0 {
			out[name] = d
			*last = cur
		}
	}
	take(rundir.CounterAttempts, &m.c.attempts, &m.c.lastAttempts)
	take(rundir.CounterRateLimited, &m.c.rateLimited, &m.c.lastRL)
	take(rundir.CounterOverloaded, &m.c.overloaded, &m.c.lastOL)
	take(rundir.CounterOtherRetries, &m.c.otherRetries, &m.c.lastOther)
	take(rundir.CounterMaybeBilledNanos, &m.c.maybeBilledN, &m.c.lastMBN)
	mb := m.c.lastMB
	take(rundir.CounterMaybeBilled, &m.c.maybeBilled, &m.c.lastMB)
	if d := m.c.lastMB - mb; d != 0 && m.journalKey != "" {
		out[m.journalKey] = d
	}
	return out
}
