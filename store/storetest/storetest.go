// Package storetest is the conformance suite every store.Store
// implementation passes, and a checker of the no-loss invariants that
// engine tests can run on any store after a run.
//
// An implementation's test runs the suite against fresh stores:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s, err := sqlite.Open(filepath.Join(t.TempDir(), "state.db"))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The suite pins the contract the engine relies on: Init's three cases,
// idempotent AddItems, Pending's order and cursor, the guarded Commit (an
// item is completed once, whatever is sent twice), consecutive result
// numbers, counters, streamed Results, exact Aggregate sums, nearest-rank
// latency percentiles, Close, and concurrent use (run it with -race).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/store"
)

// Run runs the conformance suite. open must return a new, empty store that
// is not yet initialised; it is called once per subtest with that subtest's
// t (so t.TempDir is the natural home of a file), possibly from parallel
// subtests. The suite closes every store it opens.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) store.Store)
	}{
		{"InitFresh", testInitFresh},
		{"InitExisting", testInitExisting},
		{"InitMismatch", testInitMismatch},
		{"NotInitialized", testNotInitialized},
		{"AddItemsRoundTrip", testAddItemsRoundTrip},
		{"AddItemsIdempotent", testAddItemsIdempotent},
		{"Imported", testImported},
		{"PendingOrderCursorLimit", testPending},
		{"CommitGuard", testCommitGuard},
		{"CommitRSeqConsecutive", testRSeqConsecutive},
		{"CommitCounters", testCounters},
		{"CommitOutcomeCountersOnlyWhenTaken", testOutcomeCounters},
		{"CommitInvalidIsAtomic", testCommitInvalid},
		{"CommitCancelled", testCommitCancelled},
		{"CommitRacingCommitters", testRacingCommitters},
		{"Results", testResults},
		{"AggregateEmpty", testAggregateEmpty},
		{"Aggregate", testAggregate},
		{"LatencyPercentiles", testLatencyPercentiles},
		{"Close", testClose},
		{"PendingDuringCommit", testPendingDuringCommit},
		{"Batches", testBatches},
		{"ByRoute", testByRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open)
		})
	}
}

// testMeta is the Meta the suite initialises stores with, for hash.
func testMeta(hash string) store.Meta {
	return store.Meta{
		InputPath: "/data/requests-" + hash + ".jsonl",
		InputHash: hash,
		N:         1000,
		CreatedAt: time.Date(2026, 7, 1, 12, 30, 45, 123456789, time.UTC),
	}
}

const hashA = "a3f1c2d4e5b6978812345678901234567890abcdefabcdefabcdefabcdefabcd"

// fresh opens a store, closes it when the test ends, and initialises it.
func fresh(t *testing.T, open func(t *testing.T) store.Store) store.Store {
	t.Helper()
	s := open(t)
	t.Cleanup(func() { s.Close() })
	if _, err := s.Init(t.Context(), testMeta(hashA)); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return s
}

// item is the deterministic test item for seq.
func item(seq int64) store.Item {
	models := []string{"claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"}
	return store.Item{
		Seq:       seq,
		Line:      seq + 1,
		CustomID:  fmt.Sprintf("item_%06d", seq),
		Offset:    seq * 311,
		Length:    300 + seq%7,
		Model:     models[seq%3],
		MaxTokens: 256 + seq%5,
		EstInput:  1000 + seq,
	}
}

func items(from, to int64) []store.Item {
	var out []store.Item
	for s := from; s <= to; s++ {
		out = append(out, item(s))
	}
	return out
}

func add(t *testing.T, s store.Store, from, to int64) {
	t.Helper()
	if err := s.AddItems(t.Context(), items(from, to)); err != nil {
		t.Fatalf("AddItems(%d..%d): %v", from, to, err)
	}
}

// ok is a succeeded outcome for seq with a result line naming it.
func ok(seq int64) store.Outcome {
	return store.Outcome{
		Seq: seq, State: store.Succeeded, Org: "org_a", Attempts: 1, LatencyMs: 100 + seq,
		CostNanos: 1000 * seq, InputTok: 10, OutputTok: 20, CacheRead: 3, CacheWrite: 4,
		Line: resultLine(seq, "succeeded"),
	}
}

func resultLine(seq int64, typ string) []byte {
	return fmt.Appendf(nil, `{"custom_id":"item_%06d","result":{"type":%q}}`, seq, typ)
}

func commit(t *testing.T, s store.Store, b store.Batch) []int64 {
	t.Helper()
	c, err := s.Commit(t.Context(), b)
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if len(c.RSeq) != len(b.Outcomes) {
		t.Fatalf("Commit: %d rseqs for %d outcomes", len(c.RSeq), len(b.Outcomes))
	}
	return c.RSeq
}

func seqs(its []store.Item) []int64 {
	out := make([]int64, len(its))
	for i, it := range its {
		out[i] = it.Seq
	}
	return out
}

func pending(t *testing.T, s store.Store, after int64, limit int) []int64 {
	t.Helper()
	its, err := s.Pending(t.Context(), after, limit)
	if err != nil {
		t.Fatalf("Pending(%d, %d): %v", after, limit, err)
	}
	return seqs(its)
}

func aggregate(t *testing.T, s store.Store) store.Aggregate {
	t.Helper()
	a, err := s.Aggregate(t.Context())
	if err != nil {
		t.Fatalf("Aggregate: %v", err)
	}
	return a
}

func check(t *testing.T, s store.Store) {
	t.Helper()
	if err := Check(t.Context(), s); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

func testInitFresh(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	defer s.Close()
	want := testMeta(hashA)
	existing, err := s.Init(t.Context(), want)
	if err != nil || existing {
		t.Fatalf("Init on a fresh store = (%v, %v), want (false, nil)", existing, err)
	}
	got, err := s.Meta(t.Context())
	if err != nil {
		t.Fatalf("Meta: %v", err)
	}
	if got.InputPath != want.InputPath || got.InputHash != want.InputHash || got.N != want.N || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("Meta = %+v, want %+v", got, want)
	}
}

func testInitExisting(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	again := testMeta(hashA)
	again.InputPath = "/moved/requests.jsonl"
	again.CreatedAt = again.CreatedAt.Add(time.Hour)
	existing, err := s.Init(t.Context(), again)
	if err != nil || !existing {
		t.Fatalf("second Init with the same hash = (%v, %v), want (true, nil)", existing, err)
	}
	got, err := s.Meta(t.Context())
	if err != nil {
		t.Fatalf("Meta: %v", err)
	}
	if want := testMeta(hashA); got.InputPath != want.InputPath || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("second Init changed Meta to %+v, want the first %+v", got, want)
	}
	if a := aggregate(t, s); a.N != 10 || a.Pending != 10 {
		t.Fatalf("second Init changed items: N=%d pending=%d, want 10, 10", a.N, a.Pending)
	}
}

func testInitMismatch(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(3)}})
	before := aggregate(t, s)
	const other = "ffff00000000000000000000000000000000000000000000000000000000eeee"
	existing, err := s.Init(t.Context(), testMeta(other))
	if !errors.Is(err, store.ErrInputMismatch) {
		t.Fatalf("Init with another hash = (%v, %v), want ErrInputMismatch", existing, err)
	}
	if msg := err.Error(); !strings.Contains(msg, hashA) || !strings.Contains(msg, other) {
		t.Errorf("mismatch error %q should show both hashes", msg)
	}
	m, err := s.Meta(t.Context())
	if err != nil || m.InputHash != hashA {
		t.Fatalf("after a mismatch Meta = (%+v, %v), want the original hash", m, err)
	}
	if after := aggregate(t, s); !equalAggregate(before, after) {
		t.Fatalf("a refused Init changed the store:\nbefore %+v\nafter  %+v", before, after)
	}
}

func testNotInitialized(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	defer s.Close()
	ctx := t.Context()
	if _, err := s.Meta(ctx); !errors.Is(err, store.ErrNotInitialized) {
		t.Errorf("Meta before Init: %v, want ErrNotInitialized", err)
	}
	if _, err := s.Pending(ctx, 0, 10); !errors.Is(err, store.ErrNotInitialized) {
		t.Errorf("Pending before Init: %v, want ErrNotInitialized", err)
	}
	if err := s.AddItems(ctx, items(1, 2)); !errors.Is(err, store.ErrNotInitialized) {
		t.Errorf("AddItems before Init: %v, want ErrNotInitialized", err)
	}
	if _, err := s.Commit(ctx, store.Batch{Outcomes: []store.Outcome{ok(1)}}); !errors.Is(err, store.ErrNotInitialized) {
		t.Errorf("Commit before Init: %v, want ErrNotInitialized", err)
	}
	if _, err := s.Aggregate(ctx); !errors.Is(err, store.ErrNotInitialized) {
		t.Errorf("Aggregate before Init: %v, want ErrNotInitialized", err)
	}
}

func testAddItemsRoundTrip(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	// More than one INSERT's worth, in an order other than seq's.
	in := items(1, 1000)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
	if err := s.AddItems(t.Context(), in); err != nil {
		t.Fatalf("AddItems: %v", err)
	}
	got, err := s.Pending(t.Context(), 0, 2000)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if want := items(1, 1000); !slices.Equal(got, want) {
		t.Fatalf("Pending after AddItems: %d items, differing from the %d added (first: %+v)", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(got, want []store.Item) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("at %d got %+v want %+v", i, got[i], want[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(got), len(want))
}

func testAddItemsIdempotent(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 100)
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(7)}})
	// Adding again overlapping items, one with changed fields: the stored
	// ones win, and the completed item stays completed.
	again := items(50, 150)
	again[0].Model = "changed"
	again[0].CustomID = "changed_50"
	if err := s.AddItems(t.Context(), again); err != nil {
		t.Fatalf("AddItems again: %v", err)
	}
	if err := s.AddItems(t.Context(), items(1, 100)); err != nil {
		t.Fatalf("AddItems a third time: %v", err)
	}
	a := aggregate(t, s)
	if a.N != 150 || a.Pending != 149 || a.Succeeded != 1 {
		t.Fatalf("after re-adding: N=%d pending=%d succeeded=%d, want 150, 149, 1", a.N, a.Pending, a.Succeeded)
	}
	got, err := s.Pending(t.Context(), 49, 1)
	if err != nil || len(got) != 1 || got[0] != item(50) {
		t.Fatalf("item 50 after re-adding = %+v (%v), want the first version %+v", got, err, item(50))
	}
	if err := s.AddItems(t.Context(), nil); err != nil {
		t.Fatalf("AddItems(nil): %v", err)
	}
	// Within one call a repeated seq is added once (the first wins), and
	// seqs far apart are fine.
	first := item(500_000)
	repeat := first
	repeat.Model = "changed"
	if err := s.AddItems(t.Context(), []store.Item{item(2_000_000), first, item(7), repeat, item(151)}); err != nil {
		t.Fatalf("AddItems with repeats and gaps: %v", err)
	}
	if got, want := pending(t, s, 150, 10), []int64{151, 500_000, 2_000_000}; !slices.Equal(got, want) {
		t.Fatalf("Pending after adding with repeats and gaps = %v, want %v", got, want)
	}
	if got, err := s.Pending(t.Context(), 499_999, 1); err != nil || len(got) != 1 || got[0] != first {
		t.Fatalf("repeated item = %+v (%v), want the first %+v", got, err, first)
	}
	check(t, s)
}

func testImported(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	if got, err := s.Imported(t.Context()); err != nil || got {
		t.Fatalf("Imported on a fresh store = (%v, %v), want false", got, err)
	}
	if err := s.SetImported(t.Context()); err != nil {
		t.Fatalf("SetImported: %v", err)
	}
	if got, err := s.Imported(t.Context()); err != nil || !got {
		t.Fatalf("Imported after SetImported = (%v, %v), want true", got, err)
	}
	if existing, err := s.Init(t.Context(), testMeta(hashA)); err != nil || !existing {
		t.Fatalf("Init again: (%v, %v)", existing, err)
	}
	if got, err := s.Imported(t.Context()); err != nil || !got {
		t.Fatalf("Imported after a second Init = (%v, %v), want true", got, err)
	}
}

func testPending(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 11, 20)
	add(t, s, 1, 10)
	if got, want := pending(t, s, 0, 100), seqRange(1, 20); !slices.Equal(got, want) {
		t.Fatalf("Pending(0, 100) = %v, want %v", got, want)
	}
	if got, want := pending(t, s, 0, 5), seqRange(1, 5); !slices.Equal(got, want) {
		t.Fatalf("Pending(0, 5) = %v, want %v", got, want)
	}
	if got, want := pending(t, s, 5, 5), seqRange(6, 10); !slices.Equal(got, want) {
		t.Fatalf("Pending(5, 5) = %v, want %v", got, want)
	}
	if got := pending(t, s, 20, 5); len(got) != 0 {
		t.Fatalf("Pending after the last = %v, want none", got)
	}
	if got := pending(t, s, 0, 0); len(got) != 0 {
		t.Fatalf("Pending with limit 0 = %v, want none", got)
	}
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(2), ok(3), ok(7), errored(8, "invalid_request_error")}})
	if got, want := pending(t, s, 1, 4), []int64{4, 5, 6, 9}; !slices.Equal(got, want) {
		t.Fatalf("Pending(1, 4) after completing 2, 3, 7, 8 = %v, want %v", got, want)
	}
	// A cursor walk visits every pending item once, in order.
	var walked []int64
	for after := int64(0); ; {
		page := pending(t, s, after, 3)
		if len(page) == 0 {
			break
		}
		walked = append(walked, page...)
		after = page[len(page)-1]
	}
	if want := []int64{1, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}; !slices.Equal(walked, want) {
		t.Fatalf("cursor walk = %v, want %v", walked, want)
	}
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func errored(seq int64, typ string) store.Outcome {
	return store.Outcome{
		Seq: seq, State: store.Errored, Org: "org_b", ErrorType: typ, Attempts: 1, LatencyMs: 50,
		Line: resultLine(seq, "errored"),
	}
}

func testCommitGuard(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	if got := commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(5)}}); !slices.Equal(got, []int64{1}) {
		t.Fatalf("first Commit of 5: rseq %v, want [1]", got)
	}
	// The same item again, as succeeded or as errored: skipped.
	if got := commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(5), errored(5, "x")}}); !slices.Equal(got, []int64{0, 0}) {
		t.Fatalf("second Commit of 5: rseq %v, want [0 0]", got)
	}
	// Twice in one batch: the first wins; an unknown seq is skipped.
	first := ok(6)
	first.Org = "first"
	second := errored(6, "second")
	if got := commit(t, s, store.Batch{Outcomes: []store.Outcome{first, second, ok(999), ok(7)}}); !slices.Equal(got, []int64{2, 0, 0, 3}) {
		t.Fatalf("Commit [6, 6, 999, 7]: rseq %v, want [2 0 0 3]", got)
	}
	a := aggregate(t, s)
	if a.Succeeded != 3 || a.Errored != 0 || a.Pending != 7 || a.Results != 3 {
		t.Fatalf("after guarded commits: %+v, want 3 succeeded, 0 errored, 7 pending, 3 results", a)
	}
	if _, ok := a.ByOrg["first"]; !ok {
		t.Fatalf("the first outcome of seq 6 should have won: ByOrg %v", a.ByOrg)
	}
	var lines []string
	if err := s.Results(t.Context(), 0, func(_ int64, line []byte) error {
		lines = append(lines, string(line))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{string(resultLine(5, "succeeded")), string(resultLine(6, "succeeded")), string(resultLine(7, "succeeded"))}
	if !slices.Equal(lines, want) {
		t.Fatalf("result lines %q, want %q", lines, want)
	}
	if got := pending(t, s, 0, 100); slices.Contains(got, 5) || slices.Contains(got, 6) || slices.Contains(got, 7) {
		t.Fatalf("completed items still pending: %v", got)
	}
	check(t, s)
}

func testRSeqConsecutive(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 300)
	r := rand.New(rand.NewPCG(3, 4))
	order := r.Perm(300)
	var want int64 = 1
	for len(order) > 0 {
		n := min(len(order), 1+r.IntN(40))
		var b store.Batch
		for _, p := range order[:n] {
			b.Outcomes = append(b.Outcomes, ok(int64(p+1)))
			if r.IntN(4) == 0 { // a repeat of something done: skipped
				b.Outcomes = append(b.Outcomes, ok(int64(1+r.IntN(p+1))))
			}
		}
		order = order[n:]
		done := map[int64]bool{}
		for i, rs := range commit(t, s, b) {
			if rs == 0 {
				continue
			}
			if rs != want {
				t.Fatalf("outcome %d got rseq %d, want %d (consecutive across batches)", i, rs, want)
			}
			if done[b.Outcomes[i].Seq] {
				t.Fatalf("seq %d got two rseqs in one batch", b.Outcomes[i].Seq)
			}
			done[b.Outcomes[i].Seq] = true
			want++
		}
	}
	if want != 301 {
		t.Fatalf("gave %d rseqs for 300 items", want-1)
	}
	if a := aggregate(t, s); a.Results != 300 || a.Succeeded != 300 || a.Pending != 0 {
		t.Fatalf("Aggregate %+v, want 300 results, all succeeded", a)
	}
	check(t, s)
}

func testCounters(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(1)}, Counters: map[string]int64{"attempts": 3, "rate_limited_429": 2}})
	commit(t, s, store.Batch{Counters: map[string]int64{"attempts": 4, "overloaded_529": 1}}) // counters only
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(1)}, Counters: map[string]int64{"attempts": 1, "rate_limited_429": -1}})
	commit(t, s, store.Batch{})
	a := aggregate(t, s)
	want := map[string]int64{"attempts": 8, "rate_limited_429": 1, "overloaded_529": 1}
	if !maps.Equal(a.Counters, want) {
		t.Fatalf("Counters = %v, want %v", a.Counters, want)
	}
	if a.Results != 1 {
		t.Fatalf("Results = %d, want 1", a.Results)
	}
}

// An outcome's own counters are added only when the outcome is taken:
// never for an item already terminal, nor for a seq repeated in a batch.
func testOutcomeCounters(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	with := func(seq int64) store.Outcome {
		o := ok(seq)
		o.Counters = map[string]int64{"cache_hits": 1, "cache_saved_nanos": 100}
		return o
	}
	commit(t, s, store.Batch{Outcomes: []store.Outcome{with(1), with(2), with(2)}, Counters: map[string]int64{"attempts": 1}})
	commit(t, s, store.Batch{Outcomes: []store.Outcome{with(1), with(3)}})
	commit(t, s, store.Batch{Outcomes: []store.Outcome{with(3)}})
	want := map[string]int64{"attempts": 1, "cache_hits": 3, "cache_saved_nanos": 300}
	if a := aggregate(t, s); !maps.Equal(a.Counters, want) || a.Results != 3 {
		t.Fatalf("Counters = %v, %d results; want %v, 3", a.Counters, a.Results, want)
	}
}

func testCommitInvalid(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	bad := []store.Outcome{
		{Seq: 2, State: store.Pending, Line: resultLine(2, "x")},
		{Seq: 2, State: "", Line: resultLine(2, "x")},
		{Seq: 0, State: store.Succeeded, Line: resultLine(0, "x")},
		{Seq: 2, State: store.Succeeded},
		{Seq: 2, State: store.Succeeded, Line: []byte("{}\n{}")},
	}
	for _, o := range bad {
		_, err := s.Commit(t.Context(), store.Batch{
			Outcomes: []store.Outcome{ok(1), o},
			Counters: map[string]int64{"attempts": 1},
		})
		if !errors.Is(err, store.ErrInvalidOutcome) {
			t.Errorf("Commit with %+v: %v, want ErrInvalidOutcome", o, err)
		}
	}
	if a := aggregate(t, s); a.Pending != 10 || a.Results != 0 || len(a.Counters) != 0 {
		t.Fatalf("a refused batch left traces: %+v", a)
	}
}

func testCommitCancelled(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.Commit(ctx, store.Batch{Outcomes: []store.Outcome{ok(1)}, Counters: map[string]int64{"attempts": 1}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit with a cancelled context: %v, want context.Canceled", err)
	}
	if a := aggregate(t, s); a.Pending != 10 || a.Results != 0 || len(a.Counters) != 0 {
		t.Fatalf("a cancelled batch left traces: %+v", a)
	}
	if got := commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(1)}}); !slices.Equal(got, []int64{1}) {
		t.Fatalf("Commit after a cancelled one: %v, want [1]", got)
	}
}

// testRacingCommitters pins the guard under concurrency: several committers
// send every item; each item is completed exactly once.
func testRacingCommitters(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	const n = 400
	add(t, s, 1, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := map[int64]int64{} // seq -> rseq
	for g := range 4 {
		wg.Go(func() {
			order := rand.New(rand.NewPCG(uint64(g), 9)).Perm(n)
			for len(order) > 0 {
				k := min(len(order), 25)
				var b store.Batch
				for _, p := range order[:k] {
					b.Outcomes = append(b.Outcomes, ok(int64(p+1)))
				}
				order = order[k:]
				c, err := s.Commit(t.Context(), b)
				if err != nil {
					t.Errorf("Commit: %v", err)
					return
				}
				mu.Lock()
				for i, rs := range c.RSeq {
					if rs == 0 {
						continue
					}
					if prev, dup := winners[b.Outcomes[i].Seq]; dup {
						t.Errorf("seq %d completed twice (rseq %d and %d)", b.Outcomes[i].Seq, prev, rs)
					}
					winners[b.Outcomes[i].Seq] = rs
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(winners) != n {
		t.Fatalf("%d items completed, want %d", len(winners), n)
	}
	check(t, s)
}

func testResults(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 50)
	// Bytes the engine could meet in a line: UTF-8, escapes, a NUL.
	odd := ok(50)
	odd.Line = []byte("{\"custom_id\":\"item_000050\",\"text\":\"é\\u0000\x00 \\\"q\\\"\"}")
	var want [][]byte
	for b := int64(0); b < 5; b++ {
		var batch store.Batch
		for i := b*10 + 1; i <= b*10+10; i++ {
			o := ok(i)
			if i == 50 {
				o = odd
			}
			batch.Outcomes = append(batch.Outcomes, o)
			want = append(want, o.Line)
		}
		commit(t, s, batch)
	}
	collect := func(after int64) (rseqs []int64, lines [][]byte) {
		t.Helper()
		if err := s.Results(t.Context(), after, func(rseq int64, line []byte) error {
			rseqs = append(rseqs, rseq)
			lines = append(lines, line) // kept past the callback on purpose
			return nil
		}); err != nil {
			t.Fatalf("Results(%d): %v", after, err)
		}
		return rseqs, lines
	}
	rseqs, lines := collect(0)
	if !slices.Equal(rseqs, seqRange(1, 50)) {
		t.Fatalf("Results(0) rseqs %v, want 1..50", rseqs)
	}
	for i := range want {
		if string(lines[i]) != string(want[i]) {
			t.Fatalf("line %d = %q, want %q", i+1, lines[i], want[i])
		}
	}
	if rseqs, _ := collect(42); !slices.Equal(rseqs, seqRange(43, 50)) {
		t.Fatalf("Results(42) rseqs %v, want 43..50", rseqs)
	}
	if rseqs, _ := collect(50); len(rseqs) != 0 {
		t.Fatalf("Results(50) = %v, want none", rseqs)
	}
	stop := errors.New("stop here")
	calls := 0
	err := s.Results(t.Context(), 0, func(int64, []byte) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 3 {
		t.Fatalf("Results with fn failing at 3: err %v after %d calls, want the fn's error unchanged after 3", err, calls)
	}
}

func testAggregateEmpty(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	a := aggregate(t, s)
	if a.ErroredByType == nil || a.ByOrg == nil || a.Counters == nil {
		t.Fatalf("Aggregate of an empty store has nil maps: %+v", a)
	}
	if !equalAggregate(a, store.Aggregate{ErroredByType: map[string]int64{}, ByOrg: map[string]store.OrgTotals{}, Counters: map[string]int64{}}) {
		t.Fatalf("Aggregate of an empty store = %+v, want zeros", a)
	}
}

func testAggregate(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 20)
	const big = int64(1) << 42 // sums must be exact integers, not floats
	out := func(seq int64, state store.State, org, typ string, cost int64) store.Outcome {
		return store.Outcome{
			Seq: seq, State: state, Org: org, ErrorType: typ, Attempts: 2, LatencyMs: 10,
			CostNanos: cost, InputTok: seq, OutputTok: 2 * seq, CacheRead: 3 * seq, CacheWrite: 4 * seq,
			Line: resultLine(seq, string(state)),
		}
	}
	commit(t, s, store.Batch{
		Outcomes: []store.Outcome{
			out(1, store.Succeeded, "a", "", big+1),
			out(2, store.Succeeded, "a", "", big+2),
			out(3, store.Succeeded, "b", "", 7),
			out(4, store.Errored, "b", "invalid_request_error", 0),
			out(5, store.Errored, "b", "invalid_request_error", 0),
			out(6, store.Errored, "a", "not_found_error", 0),
			out(7, store.Errored, "", "request_too_large", 0),
		},
		Counters: map[string]int64{"attempts": 14, "rate_limited_429": big},
	})
	commit(t, s, store.Batch{Outcomes: []store.Outcome{out(8, store.Succeeded, "b", "", big)}})
	got := aggregate(t, s)
	tok := func(seqs ...int64) (in, o, cr, cw int64) {
		for _, q := range seqs {
			in, o, cr, cw = in+q, o+2*q, cr+3*q, cw+4*q
		}
		return
	}
	aIn, aOut, aCR, aCW := tok(1, 2, 6)
	bIn, bOut, bCR, bCW := tok(3, 4, 5, 8)
	nIn, nOut, nCR, nCW := tok(7)
	want := store.Aggregate{
		N: 20, Pending: 12, Succeeded: 4, Errored: 4,
		ErroredByType: map[string]int64{"invalid_request_error": 2, "not_found_error": 1, "request_too_large": 1},
		ByOrg: map[string]store.OrgTotals{
			"a": {Succeeded: 2, Errored: 1, CostNanos: 2*big + 3, InputTok: aIn, OutputTok: aOut, CacheRead: aCR, CacheWrite: aCW},
			"b": {Succeeded: 2, Errored: 2, CostNanos: big + 7, InputTok: bIn, OutputTok: bOut, CacheRead: bCR, CacheWrite: bCW},
			"":  {Errored: 1, InputTok: nIn, OutputTok: nOut, CacheRead: nCR, CacheWrite: nCW},
		},
		CostNanos: 3*big + 10,
		InputTok:  aIn + bIn + nIn, OutputTok: aOut + bOut + nOut, CacheRead: aCR + bCR + nCR, CacheWrite: aCW + bCW + nCW,
		Results:  8,
		Counters: map[string]int64{"attempts": 14, "rate_limited_429": big},
		ByRoute: map[string]store.OrgTotals{"sync": {Succeeded: 4, Errored: 4, CostNanos: 3*big + 10,
			InputTok: aIn + bIn + nIn, OutputTok: aOut + bOut + nOut, CacheRead: aCR + bCR + nCR, CacheWrite: aCW + bCW + nCW}},
	}
	if !equalAggregate(got, want) {
		t.Fatalf("Aggregate:\n got %+v\nwant %+v", got, want)
	}
	check(t, s)
}

func equalAggregate(a, b store.Aggregate) bool {
	return a.N == b.N && a.Pending == b.Pending && a.Succeeded == b.Succeeded && a.Errored == b.Errored &&
		maps.Equal(a.ErroredByType, b.ErroredByType) && maps.Equal(a.ByOrg, b.ByOrg) &&
		a.CostNanos == b.CostNanos && a.InputTok == b.InputTok && a.OutputTok == b.OutputTok &&
		a.CacheRead == b.CacheRead && a.CacheWrite == b.CacheWrite && a.Results == b.Results &&
		maps.Equal(a.Counters, b.Counters) && maps.Equal(a.ByRoute, b.ByRoute)
}

func testLatencyPercentiles(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	ctx := t.Context()
	qs := []float64{0, 0.5, 0.95, 0.99, 1}
	if got, err := s.LatencyPercentiles(ctx, qs); err != nil || !slices.Equal(got, make([]int64, len(qs))) {
		t.Fatalf("LatencyPercentiles with no items = (%v, %v), want zeros", got, err)
	}
	add(t, s, 1, 130)
	// Succeeded latencies 10, 20, …, 1000 (100 of them), committed in a
	// shuffled order; errored items with huge latencies must not count.
	var b store.Batch
	for _, p := range rand.New(rand.NewPCG(5, 6)).Perm(100) {
		o := ok(int64(p + 1))
		o.LatencyMs = int64(p+1) * 10
		b.Outcomes = append(b.Outcomes, o)
	}
	for seq := int64(101); seq <= 110; seq++ {
		e := errored(seq, "overloaded")
		e.LatencyMs = 1_000_000
		b.Outcomes = append(b.Outcomes, e)
	}
	commit(t, s, b)
	got, err := s.LatencyPercentiles(ctx, []float64{0, 0.01, 0.5, 0.505, 0.95, 0.99, 1, 0.5})
	if err != nil {
		t.Fatalf("LatencyPercentiles: %v", err)
	}
	// Nearest rank: k = ceil(q·100), the k-th smallest, k at least 1.
	if want := []int64{10, 10, 500, 510, 950, 990, 1000, 500}; !slices.Equal(got, want) {
		t.Fatalf("LatencyPercentiles = %v, want %v", got, want)
	}
	// 20 values: 0.95·20 is 19 exactly, so p95 is the 19th.
	s2 := fresh(t, open)
	add(t, s2, 1, 20)
	b = store.Batch{}
	for seq := int64(1); seq <= 20; seq++ {
		o := ok(seq)
		o.LatencyMs = seq
		b.Outcomes = append(b.Outcomes, o)
	}
	commit(t, s2, b)
	if got, err := s2.LatencyPercentiles(ctx, []float64{0.5, 0.95, 0.99}); err != nil || !slices.Equal(got, []int64{10, 19, 20}) {
		t.Fatalf("LatencyPercentiles over 1..20 = (%v, %v), want [10 19 20]", got, err)
	}
	for _, q := range []float64{-0.1, 1.5} {
		if _, err := s2.LatencyPercentiles(ctx, []float64{q}); err == nil {
			t.Errorf("LatencyPercentiles(%v) should fail", q)
		}
	}
}

func testClose(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	if _, err := s.Init(t.Context(), testMeta(hashA)); err != nil {
		t.Fatal(err)
	}
	add(t, s, 1, 3)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := t.Context()
	if _, err := s.Commit(ctx, store.Batch{Outcomes: []store.Outcome{ok(1)}}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Commit after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Pending(ctx, 0, 1); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Pending after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Init(ctx, testMeta(hashA)); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Init after Close: %v, want ErrClosed", err)
	}
	if err := s.Results(ctx, 0, func(int64, []byte) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Results after Close: %v, want ErrClosed", err)
	}
}

// testPendingDuringCommit is the engine's shape: one goroutine commits while
// others read pending work, results and aggregates. Nothing may block for
// good, fail, or see a half-written batch.
func testPendingDuringCommit(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	const n, batch = 1200, 30
	add(t, s, 1, n)
	ctx := t.Context()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for from := int64(1); from <= n; from += batch {
			var b store.Batch
			for seq := from; seq < from+batch; seq++ {
				b.Outcomes = append(b.Outcomes, ok(seq))
			}
			b.Counters = map[string]int64{"outcomes": batch}
			if _, err := s.Commit(ctx, b); err != nil {
				t.Errorf("Commit: %v", err)
				return
			}
		}
	})
	wg.Go(func() { // the dispatcher's reader: a cursor over pending work
		after := int64(0)
		for {
			select {
			case <-done:
				return
			default:
			}
			its, err := s.Pending(ctx, after, 64)
			if err != nil {
				t.Errorf("Pending: %v", err)
				return
			}
			for _, it := range its {
				if it.Seq <= after {
					t.Errorf("Pending(%d) returned seq %d out of order", after, it.Seq)
					return
				}
				after = it.Seq
			}
			if len(its) == 0 {
				after = 0
			}
		}
	})
	wg.Go(func() { // progress readers: whole batches only
		var last int64
		for {
			select {
			case <-done:
				return
			default:
			}
			a, err := s.Aggregate(ctx)
			if err != nil {
				t.Errorf("Aggregate: %v", err)
				return
			}
			if a.Succeeded%batch != 0 || a.Results != a.Succeeded || a.Counters["outcomes"] != a.Succeeded {
				t.Errorf("Aggregate saw a partial batch: %+v", a)
				return
			}
			if err := s.Results(ctx, last, func(rseq int64, _ []byte) error {
				if rseq != last+1 {
					return fmt.Errorf("rseq %d after %d", rseq, last)
				}
				last = rseq
				return nil
			}); err != nil {
				t.Errorf("Results: %v", err)
				return
			}
		}
	})
	wg.Wait()
	if a := aggregate(t, s); a.Succeeded != n || a.Pending != 0 {
		t.Fatalf("after the run: %+v, want all %d succeeded", a, n)
	}
	check(t, s)
}

// Check verifies, through the Store interface only, the invariants that
// mean no item was lost or duplicated:
//
//   - result numbers are exactly 1..Aggregate.Results, each once, in order,
//     and no result line is empty;
//   - every terminal item has one result: Succeeded+Errored == Results;
//   - every item is pending or terminal: Pending+Succeeded+Errored == N;
//   - a full Pending cursor walk returns Aggregate.Pending items in strictly
//     increasing Seq order;
//   - ErroredByType and ByOrg add up to the totals.
//
// Run it when nothing is writing to s (after a run, or after reopening a
// store a crash left behind); it reads every result line once.
func Check(ctx context.Context, s store.Store) error {
	a, err := s.Aggregate(ctx)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	var next int64 = 1
	err = s.Results(ctx, 0, func(rseq int64, line []byte) error {
		if rseq != next {
			return fmt.Errorf("result number %d where %d was due", rseq, next)
		}
		if len(line) == 0 {
			return fmt.Errorf("result %d has an empty line", rseq)
		}
		next++
		return nil
	})
	if err != nil {
		return fmt.Errorf("check: results: %w", err)
	}
	var problems []string
	if next-1 != a.Results {
		problems = append(problems, fmt.Sprintf("%d result lines but the highest result number is %d", next-1, a.Results))
	}
	if a.Succeeded+a.Errored != a.Results {
		problems = append(problems, fmt.Sprintf("%d succeeded + %d errored items but %d results", a.Succeeded, a.Errored, a.Results))
	}
	if a.Pending+a.Succeeded+a.Errored != a.N {
		problems = append(problems, fmt.Sprintf("%d pending + %d succeeded + %d errored != %d items", a.Pending, a.Succeeded, a.Errored, a.N))
	}
	var walked, after int64
	for {
		its, err := s.Pending(ctx, after, 1000)
		if err != nil {
			return fmt.Errorf("check: pending after %d: %w", after, err)
		}
		if len(its) == 0 {
			break
		}
		for _, it := range its {
			if it.Seq <= after {
				return fmt.Errorf("check: pending after %d returned seq %d", after, it.Seq)
			}
			after = it.Seq
		}
		walked += int64(len(its))
	}
	if walked != a.Pending {
		problems = append(problems, fmt.Sprintf("the pending walk found %d items, Aggregate says %d", walked, a.Pending))
	}
	var byType int64
	for _, n := range a.ErroredByType {
		byType += n
	}
	if byType != a.Errored {
		problems = append(problems, fmt.Sprintf("errored by type adds up to %d, not %d", byType, a.Errored))
	}
	var sum store.OrgTotals
	for _, o := range a.ByOrg {
		sum.Succeeded += o.Succeeded
		sum.Errored += o.Errored
		sum.CostNanos += o.CostNanos
		sum.InputTok += o.InputTok
		sum.OutputTok += o.OutputTok
		sum.CacheRead += o.CacheRead
		sum.CacheWrite += o.CacheWrite
	}
	if want := (store.OrgTotals{Succeeded: a.Succeeded, Errored: a.Errored, CostNanos: a.CostNanos, InputTok: a.InputTok,
		OutputTok: a.OutputTok, CacheRead: a.CacheRead, CacheWrite: a.CacheWrite}); sum != want {
		problems = append(problems, fmt.Sprintf("per-org totals add up to %+v, not %+v", sum, want))
	}
	if len(problems) > 0 {
		return fmt.Errorf("check: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Pending initialises st, a new store, as a run of n items all pending
// (Seq and Line 1 to n, one model, max_tokens 10): the fixture of a test
// of what runs over a store.
func Pending(t *testing.T, st store.Store, n int) {
	t.Helper()
	ctx := t.Context()
	if _, err := st.Init(ctx, store.Meta{InputPath: "in.jsonl", InputHash: strings.Repeat("ab", 32), N: int64(n), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var its []store.Item
	for i := 1; i <= n; i++ {
		its = append(its, store.Item{Seq: int64(i), Line: int64(i), CustomID: "c" + string(rune('a'+i)), Model: "claude-sonnet-4-5", MaxTokens: 10})
	}
	if err := st.AddItems(ctx, its); err != nil {
		t.Fatal(err)
	}
}
