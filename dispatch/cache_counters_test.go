package dispatch

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
	"github.com/apidispatch/apidispatch/store/storetest"
)

// counterStore is a store of n pending items in dir.
func counterStore(t *testing.T, dir string, n int) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(dir, rundir.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	storetest.Pending(t, st, n)
	return st
}

// counterSink is counterStore's store with a sink of its results file in
// dir, both closed when the test ends.
func counterSink(t *testing.T, dir string, n int) (store.Store, *rundir.Sink) {
	t.Helper()
	st := counterStore(t, dir, n)
	sink, err := rundir.OpenSink(context.Background(), filepath.Join(dir, rundir.ResultsFile), st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return st, sink
}

// TestCacheCountersCountedOnce pins issue #19 case 8: a run answered
// wholly by the cache reported hits: 800, misses: -400 for 400 items.
// The committer committed its last group a second time when its input
// closed after that group's timer had fired (likely under -race on a
// loaded machine); the outcomes were skipped as terminal, but the cache's
// figures were added again. Here the group is committed by its timer
// before the close, every time; and an outcome submitted twice (its item
// already terminal) counts nothing the second time.
func TestCacheCountersCountedOnce(t *testing.T) {
	const n = 400
	const savedEach = cost.Nanos(1234)
	ctx := context.Background()
	dir := t.TempDir()
	st, sink := counterSink(t, dir, n)
	var c counters
	com := newCommitter(sink, &c, nil)
	done := make(chan struct{})
	go func() { defer close(done); com.run() }()
	hit := func(seq int64) store.Outcome {
		return hitOutcome(store.Item{Seq: seq, CustomID: fmt.Sprintf("c%d", seq)}, answer{body: []byte(`{"id":"msg"}`), org: "a", costN: savedEach})
	}
	for i := int64(1); i <= n; i++ {
		com.submitHit(hit(i), savedEach, i > n/2)
	}
	// Wait for the group's timer to commit them, then close.
	for deadline := time.Now().Add(time.Minute); ; {
		agg, err := st.Aggregate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if agg.Succeeded == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d hits committed after a minute", agg.Succeeded, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	com.close()
	<-done
	check := func(when string) {
		t.Helper()
		if com.err != nil {
			t.Fatal(com.err)
		}
		agg, err := st.Aggregate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hits, saved, dups := agg.Counters[rundir.CounterCacheHits], agg.Counters[rundir.CounterCacheSavedNanos], agg.Counters[rundir.CounterCacheDuplicates]
		if hits != n || saved != int64(n*savedEach) || dups != n/2 || agg.Succeeded != n || agg.Results != n {
			t.Fatalf("%s: store counters: %d hits, %d saved nanos, %d duplicates, %d succeeded, %d results; want %d, %d, %d, %d, %d",
				when, hits, saved, dups, agg.Succeeded, agg.Results, n, n*savedEach, n/2, n, n)
		}
	}
	check("after the close")
	// The same outcomes once more, by another committer (a second engine
	// of the run): their items are terminal, so nothing counts.
	com = newCommitter(sink, &counters{}, nil)
	done = make(chan struct{})
	go func() { defer close(done); com.run() }()
	for i := int64(1); i <= 10; i++ {
		com.submitHit(hit(i), savedEach, false)
	}
	com.close()
	<-done
	check("after submitting 10 terminal items again")
	if c.cacheHits.Load() != n || c.cacheSaved.Load() != int64(n*savedEach) {
		t.Fatalf("in-memory counters: %d hits, %d saved nanos", c.cacheHits.Load(), c.cacheSaved.Load())
	}
}
