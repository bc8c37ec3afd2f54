package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/store"
)

// The figures these produce, and the exact commands, are in store/BENCH.md.

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.dir != "" {
		os.RemoveAll(fixture.dir)
	}
	os.Exit(code)
}

// cpuTime is the CPU time (user and system, all threads) the process has
// used. The benchmarks report it per item besides the wall-clock rate: on a
// machine shared with other work the wall figures vary with the load, the
// CPU cost much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRate reports n things per second of wall-clock time and the CPU
// microseconds spent per thing (cpu is the CPU time spent in the timed part).
func reportRate(b *testing.B, n int, cpu time.Duration, unit string) {
	if n == 0 {
		return
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit+"s/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(n), "cpu-us/"+unit)
}

// importChunk is how many items the benchmarks pass to one AddItems call,
// the size the engine's importer uses.
const importChunk = 10_000

// BenchmarkAddItems imports one chunk of 10,000 items per op into a store
// that keeps growing; -benchtime=100x imports 1,000,000.
func BenchmarkAddItems(b *testing.B) {
	ctx := context.Background()
	s := openInit(b, filepath.Join(b.TempDir(), "state.db"), defaultConfig())
	next := int64(1)
	var cpu time.Duration
	for b.Loop() {
		chunk := testItems(next, next+importChunk-1)
		c0 := cpuTime()
		if err := s.AddItems(ctx, chunk); err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime() - c0
		next += importChunk
	}
	reportRate(b, int(next-1), cpu, "item")
}

// BenchmarkCommit commits one batch of outcomes with ~600-byte result lines
// per op, in the default configuration (synchronous=FULL: an fsync per
// commit) and with synchronous=NORMAL for comparison.
func BenchmarkCommit(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, size := range []int{256, 1024} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, size), func(b *testing.B) {
				benchCommit(b, config{synchronous: sync}, size)
			})
		}
	}
}

func benchCommit(b *testing.B, cfg config, size int) {
	ctx := context.Background()
	s := openInit(b, filepath.Join(b.TempDir(), "state.db"), cfg)
	var imported, next int64 // items imported; next seq to complete
	batches := 0
	var cpu time.Duration
	line := testOutcome(1, 600).Line
	for b.Loop() {
		if next+int64(size) > imported {
			b.StopTimer()
			if err := s.AddItems(ctx, testItems(imported+1, imported+50_000)); err != nil {
				b.Fatal(err)
			}
			imported += 50_000
			b.StartTimer()
		}
		batch := store.Batch{Outcomes: make([]store.Outcome, size), Counters: map[string]int64{"attempts": int64(size)}}
		for i := range batch.Outcomes {
			next++
			o := testOutcome(next, 0)
			o.Line = line
			batch.Outcomes[i] = o
		}
		c0 := cpuTime()
		c, err := s.Commit(ctx, batch)
		if err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime() - c0
		if c.RSeq[size-1] == 0 {
			b.Fatal("an outcome was skipped")
		}
		batches++
	}
	reportRate(b, batches*size, cpu, "outcome")
}

// fixture is a store of 1,000,000 items, the first 900,000 terminal (one in
// ten errored, spread over three orgs) and the last 100,000 pending: the
// end of a large run, or the start of its resume. It is built once per
// process, outside any timer (about half a minute).
var fixture struct {
	once sync.Once
	dir  string
	path string
	err  error
}

const (
	fixtureItems = 1_000_000
	fixtureDone  = 900_000
)

func fixtureStore(b *testing.B) *Store {
	b.Helper()
	fixture.once.Do(func() {
		fixture.dir, fixture.err = os.MkdirTemp("", "storebench")
		if fixture.err != nil {
			return
		}
		fixture.path = filepath.Join(fixture.dir, "state.db")
		fixture.err = buildFixture(fixture.path)
	})
	if fixture.err != nil {
		b.Fatal(fixture.err)
	}
	s, err := Open(fixture.path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func buildFixture(path string) error {
	ctx := context.Background()
	s, err := Open(path)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Init(ctx, testMeta); err != nil {
		return err
	}
	for from := int64(1); from <= fixtureItems; from += importChunk {
		if err := s.AddItems(ctx, testItems(from, from+importChunk-1)); err != nil {
			return err
		}
	}
	orgs := []string{"high_prio", "batch", "default"}
	for from := int64(1); from <= fixtureDone; from += 1000 {
		b := store.Batch{Counters: map[string]int64{"attempts": 1000}}
		for seq := from; seq < from+1000; seq++ {
			o := testOutcome(seq, 120)
			o.Org = orgs[seq%3]
			if seq%10 == 0 {
				o.State, o.ErrorType = store.Errored, "invalid_request_error"
			}
			b.Outcomes = append(b.Outcomes, o)
		}
		if _, err := s.Commit(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkPending reads one page of 256 pending items per op from the
// 1M-item fixture, walking the 100,000 pending items with the cursor (past
// the 900,000 done ones) and starting over at the end.
func BenchmarkPending(b *testing.B) {
	s := fixtureStore(b)
	ctx := context.Background()
	var after int64
	items := 0
	c0 := cpuTime()
	for b.Loop() {
		its, err := s.Pending(ctx, after, 256)
		if err != nil {
			b.Fatal(err)
		}
		if len(its) == 0 {
			after = 0
			continue
		}
		after = its[len(its)-1].Seq
		items += len(its)
	}
	reportRate(b, items, cpuTime()-c0, "item")
}

// BenchmarkPendingDuringCommit measures a Pending page while another
// goroutine commits 256-outcome batches without pause, with reads on their
// own connection pool (the default) and on the writer's single connection
// (the alternative), as the engine's scheduler and writer do.
func BenchmarkPendingDuringCommit(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  config
	}{
		{"conn=pool", defaultConfig()},
		{"conn=shared", config{synchronous: "FULL", sharedConn: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			s := openInit(b, filepath.Join(b.TempDir(), "state.db"), tc.cfg)
			const n = 200_000
			for from := int64(1); from <= n; from += importChunk {
				if err := s.AddItems(ctx, testItems(from, from+importChunk-1)); err != nil {
					b.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for next := int64(1); next+256 <= n; {
					select {
					case <-stop:
						return
					default:
					}
					batch := store.Batch{Outcomes: make([]store.Outcome, 256)}
					for i := range batch.Outcomes {
						batch.Outcomes[i] = testOutcome(next, 600)
						next++
					}
					if _, err := s.Commit(ctx, batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
			var after int64
			for b.Loop() {
				its, err := s.Pending(ctx, after, 256)
				if err != nil {
					b.Fatal(err)
				}
				after = 0
				if len(its) > 0 && after < n-10_000 {
					after = its[len(its)-1].Seq
				}
			}
			close(stop)
			wg.Wait()
		})
	}
}

// BenchmarkAggregate sums the 1M-item fixture per op.
func BenchmarkAggregate(b *testing.B) {
	s := fixtureStore(b)
	ctx := context.Background()
	c0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1e3/float64(b.N), "cpu-ms/op") }()
	for b.Loop() {
		a, err := s.Aggregate(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if a.N != fixtureItems {
			b.Fatalf("N = %d", a.N)
		}
	}
}

// BenchmarkLatencyPercentiles reads p50, p95 and p99 over the fixture's
// 810,000 succeeded items per op.
func BenchmarkLatencyPercentiles(b *testing.B) {
	s := fixtureStore(b)
	ctx := context.Background()
	c0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1e3/float64(b.N), "cpu-ms/op") }()
	for b.Loop() {
		if _, err := s.LatencyPercentiles(ctx, []float64{0.5, 0.95, 0.99}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResults streams every result line of the fixture (900,000) per op.
func BenchmarkResults(b *testing.B) {
	s := fixtureStore(b)
	ctx := context.Background()
	lines := 0
	c0 := cpuTime()
	for b.Loop() {
		if err := s.Results(ctx, 0, func(int64, []byte) error {
			lines++
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, lines, cpuTime()-c0, "line")
}
