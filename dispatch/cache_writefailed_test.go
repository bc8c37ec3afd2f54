package dispatch

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
)

// TestCacheWriteFailedIsCounted pins campaign seed 173: on a full disk the
// cache write of a group failed while its results were kept (as they must
// be: they are paid for), so the cache missed a success and a later run
// sent it again, and nothing durable said so. The run directory's store
// now counts, with each outcome it takes, the successes whose entry was
// not written (the summary's cache.write_failed), once per item however
// often it is submitted.
func TestCacheWriteFailedIsCounted(t *testing.T) {
	const n = 50
	ctx := context.Background()
	dir := t.TempDir()
	st, sink := counterSink(t, dir, n)
	c, err := cache.Open(filepath.Join(dir, "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close() // every Put now fails, as on a full disk
	success := func(seq int64) queued {
		body := fmt.Sprintf(`{"id":"msg_%d"}`, seq)
		o := store.Outcome{Seq: seq, State: store.Succeeded, Route: store.RouteSync,
			Line: rundir.ResultLine(fmt.Sprintf("c%d", seq), rundir.SucceededResult([]byte(body)), rundir.Dispatch{Org: "a", Route: store.RouteSync})}
		return queued{Outcome: o, put: &cache.Entry{Key: cache.Key{byte(seq)}, Body: []byte(body), Org: "a"}}
	}
	for round := range 2 { // the second submits the same items again: terminal, nothing counts
		com := newCommitter(sink, &counters{}, nil)
		com.cache = c
		done := make(chan struct{})
		go func() { defer close(done); com.run() }()
		for i := int64(1); i <= n; i++ {
			com.submitQ(success(i))
		}
		com.close()
		<-done
		if com.err != nil {
			t.Fatal(com.err)
		}
		agg, err := st.Aggregate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := agg.Counters[rundir.CounterCacheWriteFailed]; agg.Succeeded != n || agg.Results != n || got != n {
			t.Fatalf("round %d: %d succeeded, %d results, %d counted as not in the cache; want %d of each", round+1, agg.Succeeded, agg.Results, got, n)
		}
	}
}
