package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := Open(path)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		// Runs after the suite closed the store (cleanups run last first).
		t.Cleanup(func() { checkFile(t, path) })
		return s
	})
}

// checkFile opens the database at path directly and checks what the Store
// interface cannot show: the totals table equals the sums recomputed from
// results, every result has its line and no other line exists, no item is
// both pending and done, and SQLite's own integrity check.
func checkFile(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_query_only=1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := func(query string) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(query).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
	if n := q(`SELECT count(*) FROM (
		SELECT state, org, error_type, count(*), sum(cost_nanos), sum(input_tok), sum(output_tok), sum(cache_read), sum(cache_write)
		FROM results GROUP BY state, org, error_type
		EXCEPT SELECT state, org, error_type, n, cost_nanos, input_tok, output_tok, cache_read, cache_write FROM totals)`); n != 0 {
		t.Errorf("%s: %d groups of results disagree with totals", path, n)
	}
	if n := q(`SELECT count(*) FROM totals`) - q(`SELECT count(*) FROM (SELECT DISTINCT state, org, error_type FROM results)`); n != 0 {
		t.Errorf("%s: %d totals rows of no result", path, n)
	}
	if n := q(`SELECT (SELECT count(*) FROM results) - (SELECT count(*) FROM results r JOIN lines l USING (rseq))`); n != 0 {
		t.Errorf("%s: %d results without a line", path, n)
	}
	if n := q(`SELECT (SELECT count(*) FROM lines) - (SELECT count(*) FROM results)`); n != 0 {
		t.Errorf("%s: %d lines without a result", path, n)
	}
	if n := q(`SELECT count(*) FROM pending p JOIN results r USING (seq)`); n != 0 {
		t.Errorf("%s: %d items both pending and done", path, n)
	}
	if n := q(`SELECT count(*) FROM results r LEFT JOIN items i USING (seq) WHERE i.seq IS NULL`); n != 0 {
		t.Errorf("%s: %d results of no item", path, n)
	}
	if n := q(`SELECT (SELECT count(*) FROM items) - (SELECT count(*) FROM pending) - (SELECT count(*) FROM results)`); n != 0 {
		t.Errorf("%s: %d items neither pending nor done", path, n)
	}
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("%s: integrity_check = %q (%v)", path, ok, err)
	}
}

var testMeta = store.Meta{
	InputPath: "/data/requests.jsonl",
	InputHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	N:         100,
	CreatedAt: time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC),
}

func testItems(from, to int64) []store.Item {
	var out []store.Item
	for s := from; s <= to; s++ {
		out = append(out, store.Item{
			Seq: s, Line: s, CustomID: fmt.Sprintf("item_%06d", s), Offset: s * 700, Length: 699,
			Model: "claude-sonnet-4-5", MaxTokens: 256, EstInput: 500,
		})
	}
	return out
}

func testOutcome(seq int64, lineLen int) store.Outcome {
	line := fmt.Appendf(nil, `{"custom_id":"item_%06d","result":{"type":"succeeded","message":{"text":"`, seq)
	line = append(line, bytes.Repeat([]byte{'x'}, max(0, lineLen-3-len(line)))...)
	line = append(line, `"}}`...)
	return store.Outcome{
		Seq: seq, State: store.Succeeded, Org: "high_prio", Attempts: 1, LatencyMs: 1000 + seq%977,
		CostNanos: 2_130_000, InputTok: 500, OutputTok: 180, Line: line,
	}
}

// openInit opens a store at path and initialises it with testMeta.
func openInit(t testing.TB, path string, cfg config) *Store {
	t.Helper()
	s, err := open(path, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Init(context.Background(), testMeta); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return s
}

func TestReopenKeepsEverything(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s := openInit(t, path, defaultConfig())
	if err := s.AddItems(ctx, testItems(1, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetImported(ctx); err != nil {
		t.Fatal(err)
	}
	var b store.Batch
	for seq := int64(1); seq <= 40; seq++ {
		b.Outcomes = append(b.Outcomes, testOutcome(seq, 600))
	}
	b.Counters = map[string]int64{"attempts": 55}
	if _, err := s.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	before, err := s.Aggregate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	// A report reader may look before any Init of its own.
	m, err := s2.Meta(ctx)
	if err != nil || m.InputHash != testMeta.InputHash {
		t.Fatalf("Meta after reopen = (%+v, %v)", m, err)
	}
	existing, err := s2.Init(ctx, testMeta)
	if err != nil || !existing {
		t.Fatalf("Init after reopen = (%v, %v), want existing", existing, err)
	}
	after, err := s2.Aggregate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Results != 40 || after.Pending != 60 || after.Counters["attempts"] != 55 || after.CostNanos != before.CostNanos {
		t.Fatalf("after reopen: %+v, want %+v", after, before)
	}
	if imp, err := s2.Imported(ctx); err != nil || !imp {
		t.Fatalf("Imported after reopen = (%v, %v)", imp, err)
	}
	c, err := s2.Commit(ctx, store.Batch{Outcomes: []store.Outcome{testOutcome(40, 600), testOutcome(41, 600)}})
	if err != nil || !slices.Equal(c.RSeq, []int64{0, 41}) {
		t.Fatalf("Commit after reopen = (%v, %v), want [0 41]", c.RSeq, err)
	}
	if err := storetest.Check(ctx, s2); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	checkFile(t, path)
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	execSQL(t, path, `UPDATE meta SET value = '7' WHERE key = 'schema_version'`)

	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(path)
	if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(before, after) {
		t.Errorf("the refused database was changed (%v)", rerr)
	}
	if !errors.Is(err, store.ErrUnsupportedSchema) {
		t.Fatalf("Open of a version 7 store: %v, want ErrUnsupportedSchema", err)
	}
	if !strings.Contains(err.Error(), "version 7") || !strings.Contains(err.Error(), fmt.Sprintf("version %d", schemaVersion)) {
		t.Errorf("error %q should name both versions", err)
	}
}

func TestOpenRefusesForeignDatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "other.db")
	execSQL(t, path, `CREATE TABLE invoices (id INTEGER PRIMARY KEY)`)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); !errors.Is(err, store.ErrUnsupportedSchema) {
		t.Fatalf("Open of a foreign database: %v, want ErrUnsupportedSchema", err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the refused database was changed (%v)", err)
	}
}

func TestOpenRejectsQueryInPath(t *testing.T) {
	t.Parallel()
	if _, err := Open(filepath.Join(t.TempDir(), "state.db?mode=ro")); err == nil {
		t.Fatal("Open accepted a path with '?'")
	}
}

func TestAddItemsDuplicateCustomIDFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openInit(t, filepath.Join(t.TempDir(), "state.db"), defaultConfig())
	if err := s.AddItems(ctx, testItems(1, 10)); err != nil {
		t.Fatal(err)
	}
	// Seq 11 reuses item 3's custom_id: silently ignoring it would lose
	// an item, so the whole call fails.
	batch := testItems(11, 20)
	batch[0].CustomID = "item_000003"
	if err := s.AddItems(ctx, batch); err == nil {
		t.Fatal("AddItems accepted a duplicate custom_id")
	}
	a, err := s.Aggregate(ctx)
	if err != nil || a.N != 10 {
		t.Fatalf("after the failed call N = %d (%v), want 10 (nothing of it inserted)", a.N, err)
	}
}

// TestCommitOnFullDiskWritesNothing simulates a full disk with SQLite's
// max_page_count, which fails a write with SQLITE_FULL exactly where a full
// file system would: when the transaction needs a new page. (A read-only
// file cannot be used for this in tests that may run as root.)
func TestCommitOnFullDiskWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openInit(t, filepath.Join(t.TempDir(), "state.db"), defaultConfig())
	if err := s.AddItems(ctx, testItems(1, 1000)); err != nil {
		t.Fatal(err)
	}
	var pages int64
	if err := s.w.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
	var b store.Batch
	for seq := int64(1); seq <= 500; seq++ {
		b.Outcomes = append(b.Outcomes, testOutcome(seq, 600))
	}
	b.Counters = map[string]int64{"attempts": 500}
	if c, err := s.Commit(ctx, b); err == nil {
		t.Fatalf("Commit on a full disk succeeded: %v", c.RSeq[:3])
	} else {
		t.Logf("Commit on a full disk: %v", err)
	}
	a, err := s.Aggregate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.Pending != 1000 || a.Results != 0 || len(a.Counters) != 0 {
		t.Fatalf("a failed Commit left traces: %+v", a)
	}
	if its, err := s.Pending(ctx, 0, 1); err != nil || len(its) != 1 || its[0].Seq != 1 {
		t.Fatalf("item 1 not pending after the failed commit: %v %v", its, err)
	}
	// Space again: the same batch goes through, numbered from 1.
	if _, err := s.w.Exec(`PRAGMA max_page_count = 1073741823`); err != nil {
		t.Fatal(err)
	}
	c, err := s.Commit(ctx, b)
	if err != nil {
		t.Fatalf("Commit after space returned: %v", err)
	}
	if c.RSeq[0] != 1 || c.RSeq[499] != 500 {
		t.Fatalf("rseqs after the failed commit start at %d, end at %d; want 1, 500", c.RSeq[0], c.RSeq[499])
	}
	if err := storetest.Check(ctx, s); err != nil {
		t.Fatal(err)
	}
	s.Close()
	checkFile(t, s.Path())
}

func TestNearestRank(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		q    float64
		n, k int64
	}{
		{0, 10, 1}, {0.1, 10, 1}, {0.11, 10, 2}, {0.5, 10, 5}, {0.95, 10, 10}, {1, 10, 10},
		{0.95, 20, 19}, {0.99, 100, 99}, {0.999, 1000, 999}, {0.5, 1, 1}, {0.29, 100, 29}, {0.57, 100, 57},
	} {
		if got := nearestRank(tc.q, tc.n); got != tc.k {
			t.Errorf("nearestRank(%v, %d) = %d, want %d", tc.q, tc.n, got, tc.k)
		}
	}
}

func TestQueryPlans(t *testing.T) {
	t.Parallel()
	s := openInit(t, filepath.Join(t.TempDir(), "state.db"), defaultConfig())
	for _, tc := range []struct {
		q    string
		args []any
		want string
	}{
		{pendingQuery, []any{5, 10}, "SEARCH p USING INTEGER PRIMARY KEY (rowid>?); SEARCH i USING INTEGER PRIMARY KEY (rowid=?)"},
		{resultsQuery, []any{5}, "SEARCH lines USING INTEGER PRIMARY KEY (rowid>?)"},
		{unpendQuery, []any{5}, "SEARCH pending USING INTEGER PRIMARY KEY (rowid=?)"},
		{latenciesQuery, nil, "SCAN results"},
	} {
		rows, err := s.r.Query("EXPLAIN QUERY PLAN "+tc.q, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		p := strings.Join(plan, "; ")
		if p != tc.want {
			t.Errorf("plan of %q = %q, want %q", tc.q, p, tc.want)
		}
	}
}

// TestResultsStreamsInBoundedMemory pins that Results does not load the
// lines it streams: the live heap, measured after a GC in the middle of the
// stream, stays far below the size of all lines together.
func TestResultsStreamsInBoundedMemory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openInit(t, filepath.Join(t.TempDir(), "state.db"), defaultConfig())
	const n, lineLen = 2000, 4000 // 8 MB of lines
	if err := s.AddItems(ctx, testItems(1, n)); err != nil {
		t.Fatal(err)
	}
	for from := int64(1); from <= n; from += 500 {
		var b store.Batch
		for seq := from; seq < from+500; seq++ {
			b.Outcomes = append(b.Outcomes, testOutcome(seq, lineLen))
		}
		if _, err := s.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := live()
	var peak uint64
	if err := s.Results(ctx, 0, func(rseq int64, line []byte) error {
		if rseq%500 == 0 {
			peak = max(peak, live())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Other parallel tests allocate too; 2 MB is a quarter of the lines.
	if peak > before && peak-before > 2<<20 {
		t.Fatalf("live heap grew by %d bytes while streaming %d bytes of lines", peak-before, n*lineLen)
	}
}

// TestOpenUpgradesVersion1 opens a file as the version before the batch
// route wrote it: it gains the batch tables, and its results count as sync.
func TestOpenUpgradesVersion1(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Init(ctx, store.Meta{InputPath: "/x.jsonl", InputHash: "abc", N: 3}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddItems(ctx, []store.Item{{Seq: 1, CustomID: "a", Model: "m"}, {Seq: 2, CustomID: "b", Model: "m"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, store.Batch{Outcomes: []store.Outcome{{Seq: 1, State: store.Succeeded, Org: "o", CostNanos: 42, Line: []byte(`{"custom_id":"a"}`)}}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	execSQL(t, path, `DROP TABLE batches`, `DROP TABLE batch_items`, `DROP TABLE route_totals`,
		`ALTER TABLE items DROP COLUMN provider`, `ALTER TABLE items DROP COLUMN choices`,
		`UPDATE meta SET value = '1' WHERE key = 'schema_version'`)
	s, err = Open(path)
	if err != nil {
		t.Fatalf("Open of a version 1 store: %v", err)
	}
	defer s.Close()
	if _, err := s.Init(ctx, store.Meta{InputPath: "/x.jsonl", InputHash: "abc", N: 3}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Aggregate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := a.ByRoute[store.RouteSync]; r.Succeeded != 1 || r.CostNanos != 42 {
		t.Fatalf("sync route after the upgrade = %+v; want the one result", r)
	}
	if _, err := s.AddBatch(ctx, store.BatchRecord{Org: "o"}, []int64{2}); err != nil {
		t.Fatalf("AddBatch after the upgrade: %v", err)
	}
}

// TestOpenUpgradesVersion3 opens a store written before items had a
// provider: its items read as Anthropic's (provider "", one choice), and
// an OpenAI item added after the upgrade keeps its provider and n.
func TestOpenUpgradesVersion3(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	meta := store.Meta{InputPath: "/x.jsonl", InputHash: "abc", N: 2}
	if _, err := s.Init(ctx, meta); err != nil {
		t.Fatal(err)
	}
	if err := s.AddItems(ctx, []store.Item{{Seq: 1, CustomID: "a", Model: "claude-sonnet-4-5", MaxTokens: 9}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	execSQL(t, path, `ALTER TABLE items DROP COLUMN provider`, `ALTER TABLE items DROP COLUMN choices`,
		`ALTER TABLE batches DROP COLUMN parts_read`, `ALTER TABLE batches DROP COLUMN queue_tokens`,
		`UPDATE meta SET value = '3' WHERE key = 'schema_version'`)
	if s, err = Open(path); err != nil {
		t.Fatalf("Open of a version 3 store: %v", err)
	}
	defer s.Close()
	if _, err := s.Init(ctx, meta); err != nil {
		t.Fatal(err)
	}
	oa := store.Item{Seq: 2, CustomID: "b", Model: "gpt-4.1-mini", MaxTokens: 50, Provider: "openai", Choices: 3}
	if err := s.AddItems(ctx, []store.Item{oa}); err != nil {
		t.Fatal(err)
	}
	its, err := s.Pending(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(its) != 2 || its[0].Provider != "" || its[0].Choices != 0 || its[0].MaxTokens != 9 || its[1] != oa {
		t.Fatalf("pending after the upgrade: %+v", its)
	}
}

// TestOpenUpgradesVersion4 opens a store written before batches kept the
// results files read and the enqueued-token limit learnt: its batches read
// with none (0), and an update after the upgrade keeps both.
func TestOpenUpgradesVersion4(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	meta := store.Meta{InputPath: "/x.jsonl", InputHash: "abc", N: 1}
	if _, err := s.Init(ctx, meta); err != nil {
		t.Fatal(err)
	}
	if err := s.AddItems(ctx, []store.Item{{Seq: 1, CustomID: "a", Model: "gpt-4.1-mini", Provider: "openai"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddBatch(ctx, store.BatchRecord{Org: "gpt", Prefix: "adtest"}, []int64{1}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	execSQL(t, path, `ALTER TABLE batches DROP COLUMN parts_read`, `ALTER TABLE batches DROP COLUMN queue_tokens`,
		`UPDATE meta SET value = '4' WHERE key = 'schema_version'`)
	if s, err = Open(path); err != nil {
		t.Fatalf("Open of a version 4 store: %v", err)
	}
	defer s.Close()
	if _, err := s.Init(ctx, meta); err != nil {
		t.Fatal(err)
	}
	bs, err := s.Batches(ctx)
	if err != nil || len(bs) != 1 || bs[0].PartsRead != 0 || bs[0].QueueTokens != 0 || bs[0].Prefix != "adtest" {
		t.Fatalf("batches after the upgrade: %+v, %v", bs, err)
	}
	b := bs[0]
	b.Status, b.ID, b.PartsRead, b.QueueTokens = store.BatchHarvested, "batch_1", 1, 12345
	if err := s.UpdateBatch(ctx, b); err != nil {
		t.Fatal(err)
	}
	if bs, err = s.Batches(ctx); err != nil || bs[0] != b {
		t.Fatalf("batch after an update: %+v, %v; want %+v", bs, err, b)
	}
}

// execSQL runs the statements qs on the SQLite database at path, as
// another program (or an older apidispatch) would have left it.
func execSQL(t *testing.T, path string, qs ...string) {
	t.Helper()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, q := range qs {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}
