package rundir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
	"github.com/apidispatch/apidispatch/store/storetest"
)

// journalStore is a store of n pending items in dir.
func journalStore(t *testing.T, dir string, n int) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	storetest.Pending(t, st, n)
	return st
}

// A journal left by a dead process counts what may have been billed: the
// attempts in flight, the successes the store never recorded, and the
// maybe-billed ends not yet flushed; a replay is done once, and the file goes.
func TestReplayJournal(t *testing.T) {
	dir := t.TempDir()
	st := journalStore(t, dir, 6)
	ctx := context.Background()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Sent(1, 1, 100)
	j.Ended(1, 1, true) // flushed below: not counted again
	j.Sent(1, 2, 200)   // in flight: counted
	j.Sent(2, 1, 300)
	j.Succeeded(2, 1) // committed below: not counted
	j.Sent(3, 1, 400)
	j.Succeeded(3, 1) // never committed: sent again, counted
	j.Sent(4, 1, 500)
	j.Ended(4, 1, false) // a plain 429: not counted
	j.Sent(5, 1, 1000)
	j.Ended(5, 1, true) // not flushed: counted
	j.Sent(6, 1, 3000)
	j.Close(false)
	// The committer flushed one maybe-billed end and item 2's success.
	if _, err := st.Commit(ctx, store.Batch{
		Outcomes: []store.Outcome{{Seq: 2, State: store.Succeeded, Attempts: 1, Line: []byte(`{"custom_id":"c2"}`)}},
		Counters: map[string]int64{CounterMaybeBilled: 1, j.key: 1},
	}); err != nil {
		t.Fatal(err)
	}
	// A torn last record, as a kill mid-write leaves it: item 6's end is lost.
	f, _ := os.OpenFile(j.path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("C 6 1")
	f.Close()

	before, _ := st.Aggregate(ctx)
	n, nanos, err := replayJournals(ctx, dir, st, before.Counters)
	if err != nil {
		t.Fatal(err)
	}
	// In flight: 1/2 and 6/1; unrecorded success: 3; unflushed: 5.
	if n != 4 {
		t.Fatalf("replay counted %d, want 4", n)
	}
	// Their worst cases: 200 + 3000 + 400 + 1000 (the larger of the two
	// maybe-billed ends, since which one was flushed is not known).
	if nanos != 4600 {
		t.Fatalf("replay counted a worst case of %d nano-USD, want 4600", nanos)
	}
	agg, _ := st.Aggregate(ctx)
	if got := agg.Counters[CounterMaybeBilled]; got != 5 {
		t.Fatalf("possible_duplicate_billing = %d, want 1 flushed + 4 replayed", got)
	}
	if got := SpentBefore(agg); got != 4600 {
		t.Fatalf("a resume counts %d nano-USD as spent, want the 4600 replayed", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, journalGlob)); len(left) != 0 {
		t.Fatalf("journal not removed: %v", left)
	}
	// A crash after the commit but before the removal: the journal is back,
	// and the replay must not count it twice.
	os.WriteFile(j.path, []byte("S 1 3\n"), 0o600)
	if n, _, err := replayJournals(ctx, dir, st, agg.Counters); err != nil || n != 0 {
		t.Fatalf("second replay of the same journal counted %d (%v), want 0", n, err)
	}
}

func TestReadJournalRefusesGarbage(t *testing.T) {
	for _, body := range []string{"S 1\n", "X 1 1\n", "C 1 1 7\n", "S a 1\n", "R 1 1 1\n"} {
		p := filepath.Join(t.TempDir(), "attempts-x.journal")
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := readJournal(p); err == nil || !strings.Contains(err.Error(), ":1:") {
			t.Errorf("%q: got %v, want an error naming line 1", body, err)
		}
	}
}

// Two processes in one run directory would corrupt each other's journal
// and results: the second is refused while the first holds the lock.
func TestRunDirLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockRunDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockRunDir(dir); !errors.Is(err, ErrRunDirBusy) {
		t.Fatalf("a second lock of the same run directory: %v, want ErrRunDirBusy", err)
	}
	l.Close()
	l2, err := lockRunDir(dir)
	if err != nil {
		t.Fatalf("lock not released by close: %v", err)
	}
	l2.Close()
}

// A write that fails (a full disk) breaks the journal: nothing is written
// after it, so the journal stays readable and the replay counts what came
// before.
func TestJournalStopsAfterFailedWrite(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Sent(1, 1, 0)
	good := j.f
	ro, err := os.Open(j.path) // read-only: every write fails
	if err != nil {
		t.Fatal(err)
	}
	j.f = ro
	j.Sent(2, 1, 0)
	j.f = good
	j.Sent(3, 1, 0) // the disk has room again, but the journal stays broken
	j.Close(false)
	ro.Close()
	b, _ := os.ReadFile(j.path)
	if string(b) != "S 1 1\n" {
		t.Fatalf("journal after a failed write holds %q, want only the record before it", b)
	}
	tally, err := readJournal(j.path)
	if err != nil || tally.inFlight != 1 {
		t.Fatalf("replay of a broken journal: %+v %v", tally, err)
	}
}

// The gateway's durable journal: tagged records written by many callers at
// once (each returns once its record is synced), and OpenAttempts lists
// those sent and never ended with their worst case and tag, whatever the
// tag holds.
func TestDurableJournalOpenAttempts(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenDurableJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			tag := fmt.Sprintf("client %d ñ", i%3)
			errs <- j.SentTagged(int64(i+1), 1, cost.Nanos(1000+i), tag)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if i%2 == 0 {
			j.Ended(int64(i+1), 1, false)
		}
	}
	j.Sent(1000, 1, 5) // an untagged record reads too
	if err := j.SentTagged(1001, 1, 5, ""); !errors.Is(err, ErrJournal) {
		t.Errorf("an empty tag: %v, want ErrJournal", err)
	}
	if err := j.Close(false); err != nil {
		t.Fatal(err)
	}
	paths, open, err := OpenAttempts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || len(open) != n/2+1 {
		t.Fatalf("%d journals, %d open attempts; want 1 and %d", len(paths), len(open), n/2+1)
	}
	for _, a := range open[:n/2] {
		i := a.Seq - 1
		if i%2 == 0 || a.Attempt != 1 || a.Worst != cost.Nanos(1000+i) || a.Tag != fmt.Sprintf("client %d ñ", i%3) {
			t.Errorf("open attempt %+v", a)
		}
	}
	if last := open[n/2]; last.Seq != 1000 || last.Tag != "" || last.Worst != 5 {
		t.Errorf("untagged attempt %+v", last)
	}
	if err := RemoveJournals(paths); err != nil {
		t.Fatal(err)
	}
	if paths, open, err := OpenAttempts(dir); err != nil || len(paths)+len(open) != 0 {
		t.Errorf("after removal: %v %v %v", paths, open, err)
	}
	var nilJ *Journal
	if err := nilJ.SentTagged(1, 1, 1, "x"); !errors.Is(err, ErrJournal) {
		t.Errorf("nil journal: %v", err)
	}
}

// BenchmarkDurableJournal is the gateway's cost of journaling an attempt
// before it is sent: SentTagged on a durable journal from 16 goroutines at
// once (one fsync for each group of records written meanwhile), in
// records per second and the mean wait of one.
//
//	go test ./rundir -run '^$' -bench DurableJournal -benchtime 2000x
func BenchmarkDurableJournal(b *testing.B) {
	j, err := OpenDurableJournal(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close(true)
	tag := `{"client":"alice","org":"high_prio","model":"claude-sonnet-4-5"}`
	var seq atomic.Int64
	b.SetParallelism(8) // 16 goroutines on 2 CPUs
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := j.SentTagged(seq.Add(1), 1, 4_680_000, tag); err != nil {
				b.Error(err)
				return
			}
		}
	})
	wall := time.Since(start)
	b.ReportMetric(float64(b.N)/wall.Seconds(), "records/s")
	b.ReportMetric(float64(wall.Microseconds())*16/float64(b.N), "µs/record-wait")
}
