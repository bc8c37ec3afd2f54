// Package sqlite is the embedded implementation of store.Store: one SQLite
// file per run directory (state.db), written through the pure-Go
// modernc.org/sqlite driver, so the binary needs no C toolchain.
//
// Most callers want Open followed by the store.Store methods:
//
//	st, err := sqlite.Open(filepath.Join(runDir, "state.db"))
//	if err != nil { ... }
//	defer st.Close()
//	existing, err := st.Init(ctx, meta)
//
// # Durability
//
// The file is in WAL mode with synchronous=FULL: when Commit returns nil the
// batch's outcomes are on stable storage and survive a kill -9, an OS crash
// or a power cut (as far as the disk honours fsync). synchronous=NORMAL would
// also survive kill -9 (WAL keeps the file consistent) but may forget the
// last commits on power loss; the engine appends a result line to
// results.jsonl once Commit returns, so a forgotten commit would send that
// item again on resume and write its line twice. FULL costs one fsync of the
// WAL per Commit, which batches of a few hundred outcomes amortise to well
// beyond the engine's target (store/BENCH.md has the figures for both).
//
// A commit that cannot be written (disk full, I/O error, read-only file,
// cancelled context, store closed) returns an error and rolls back the
// whole batch: no item of it is terminal, no counter moved, no rseq given.
//
// # Concurrency
//
// A Store is safe for concurrent use. Writes (Init, AddItems, SetImported,
// Commit) go through one connection, serialised by a mutex and started with
// BEGIN IMMEDIATE, so a write transaction never has to upgrade a read lock
// and cannot deadlock. Reads (Meta, Imported, Pending, Results, Aggregate,
// LatencyPercentiles) use a small pool of read-only connections; under WAL
// they see the last committed state and neither wait for nor block a
// Commit. A Results callback may therefore call the other methods.
//
// Another process writing the same file waits up to 5 s (busyTimeout) for the
// write lock and then fails with SQLITE_BUSY; nothing is corrupted, but one
// run directory is meant for one running process. Within the process, do
// not open state.db (or its -wal file) with os.Open while a Store has it
// open: SQLite's locks are POSIX advisory locks, and closing any descriptor
// of the file drops every lock the process holds on it.
//
// # Schema and cost
//
// schema.go describes the tables and why they are shaped so. In short:
// items is written once at import, a small pending table lists what is
// left, and Commit deletes from pending (its guard) and appends to results,
// lines and per-group totals. The per-call costs, measured in
// store/BENCH.md: AddItems ~6 µs CPU an item, Commit ~16-19 µs an outcome,
// Pending ~3 µs an item, Aggregate ~30 ms and LatencyPercentiles ~0.7 s at
// a million items. Memory does not grow with the number of items: at most
// 32 MiB of page cache for the writer and 8 MiB for each of 4 readers.
package sqlite

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/apidispatch/apidispatch/store"
)

const (
	// busyTimeout is how long a statement waits for a lock held by another
	// connection (another process, or a checkpoint) before failing.
	busyTimeout = 5 * time.Second
	// readers is the size of the read-only connection pool.
	readers = 4
	// itemsPerInsert is how many items one INSERT statement carries in
	// AddItems (8 parameters each, far below SQLite's 32766 limit). Fewer
	// statements per item is most of the import speed.
	itemsPerInsert = 128
	// itemColumns is the number of parameters per item in an INSERT.
	itemColumns = 10
	// pendingPerInsert is how many seqs one INSERT INTO pending carries.
	pendingPerInsert = 256
	// resultsPerInsert is how many results one INSERT statement carries in
	// Commit, and resultColumns the parameters of each.
	resultsPerInsert = 32
	resultColumns    = 12
)

// config holds the choices Open makes; the benchmarks flip them to measure
// the alternatives documented in store/BENCH.md.
type config struct {
	// synchronous is SQLite's synchronous setting: "FULL" or "NORMAL".
	synchronous string
	// sharedConn makes reads use the single writer connection instead of
	// their own pool (the slower alternative, kept for the benchmark).
	sharedConn bool
}

func defaultConfig() config { return config{synchronous: "FULL"} }

// Store is a store.Store in one SQLite file. It is safe for concurrent use.
// The zero value is not usable; call Open.
type Store struct {
	path string
	w    *sql.DB // one connection: every write
	r    *sql.DB // read-only pool (w itself when cfg.sharedConn)

	wmu sync.Mutex // serialises writers and guards the write statements

	insertChunk    *sql.Stmt // itemsPerInsert items
	insertOne      *sql.Stmt // one item
	itemsBetween   *sql.Stmt
	itemExists     *sql.Stmt
	insertPendings *sql.Stmt // pendingPerInsert seqs
	insertPending  *sql.Stmt // one seq
	unpend         *sql.Stmt // the guard: removes an item from pending
	insertResults  *sql.Stmt // resultsPerInsert results
	insertResult   *sql.Stmt // one result
	insertLines    *sql.Stmt // resultsPerInsert lines
	insertLine     *sql.Stmt // one line
	maxRSeq        *sql.Stmt
	addTotal       *sql.Stmt
	addRouteTotal  *sql.Stmt
	addCounter     *sql.Stmt
	pending        *sql.Stmt // on r

	initialized atomic.Bool // a Meta is recorded
	closed      atomic.Bool
	closeOnce   sync.Once
	closeErr    error
}

var _ store.Store = (*Store)(nil)

// Open opens the store in the SQLite file at path, creating the file and its
// schema when absent. It refuses (store.ErrUnsupportedSchema) a file written
// by a newer schema or a SQLite file that is not a store, without changing
// it. Until some Init has recorded a Meta in the file (in this process or an
// earlier one) every method but Init and Close returns
// store.ErrNotInitialized, so a reader of a finished run may skip Init. Call
// Close when done.
func Open(path string) (*Store, error) {
	return open(path, defaultConfig())
}

func open(path string, cfg config) (*Store, error) {
	if path == "" || strings.ContainsRune(path, '?') || strings.HasPrefix(path, "file:") {
		// The driver reads everything after '?' as connection options.
		return nil, fmt.Errorf("sqlite: open %q: path must be a plain file name without '?'", path)
	}
	ctx := context.Background()
	s := &Store{path: path}
	// A new store holds model outputs: only its owner reads it (SQLite
	// gives its -wal and -shm files the same permissions).
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		f.Close()
	} else if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}

	w, err := sql.Open("sqlite", dsn(path, cfg, false))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s.w = w
	if err := migrate(ctx, w, path); err != nil {
		w.Close()
		return nil, err
	}
	// WAL is set only now, so a file refused above is left as it was. The
	// mode is persistent: the readers opened below find it.
	var mode string
	if err := w.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode); err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: set WAL: %w", path, err)
	}
	if mode != "wal" {
		// SQLite keeps the old mode silently where WAL is impossible (some
		// network file systems); readers would then block Commit.
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: journal mode is %q, not WAL: put the run directory on a local file system", path, mode)
	}
	if cfg.sharedConn {
		s.r = w
	} else {
		r, err := sql.Open("sqlite", dsn(path, cfg, true))
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
		}
		r.SetMaxOpenConns(readers)
		r.SetMaxIdleConns(readers)
		r.SetConnMaxLifetime(0)
		r.SetConnMaxIdleTime(0)
		s.r = r
	}
	if err := s.prepare(ctx); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM meta WHERE key = 'input_hash'`).Scan(&n); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("sqlite: open %s: read meta: %w", path, err)
	}
	s.initialized.Store(n > 0)
	return s, nil
}

// dsn builds the driver's connection string. Pragmas are per connection, so
// they go in the DSN and every connection the pool opens gets them.
func dsn(path string, cfg config, reader bool) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busyTimeout.Milliseconds(), 10)+")")
	if reader {
		q.Add("_pragma", "cache_size(-8192)") // KiB: 8 MiB per reader
		q.Set("_query_only", "1")
	} else {
		q.Add("_pragma", "cache_size(-32768)")           // KiB: 32 MiB
		q.Add("_pragma", "journal_size_limit(67108864)") // truncate the WAL back to 64 MiB after a checkpoint
		q.Set("_synchronous", cfg.synchronous)
		q.Set("_txlock", "immediate") // take the write lock at BEGIN: no lock upgrade, no deadlock
	}
	return path + "?" + q.Encode()
}

// The queries on the hot paths; TestQueryPlans pins how SQLite runs them.
const (
	// pendingQuery walks pending by seq and looks each item up by rowid.
	// CROSS JOIN keeps pending the outer loop, so the walk never steps over
	// done items, however many there are.
	pendingQuery = `SELECT i.seq, i.line, i.custom_id, i.byte_offset, i.byte_length, i.model, i.max_tokens, i.est_input, i.provider, i.choices
		FROM pending AS p CROSS JOIN items AS i
		WHERE p.seq > ? AND i.seq = p.seq ORDER BY p.seq LIMIT ?`
	// unpendQuery is Commit's guard.
	unpendQuery = `DELETE FROM pending WHERE seq = ?`
	// resultsQuery streams result lines by rowid.
	resultsQuery = `SELECT rseq, line FROM lines WHERE rseq > ? ORDER BY rseq`
	// latenciesQuery reads the succeeded latencies in table order: no sort.
	latenciesQuery = `SELECT latency_ms FROM results WHERE state = 'succeeded' AND attempts > 0`
)

func (s *Store) prepare(ctx context.Context) error {
	const itemCols = `INSERT INTO items (seq, line, custom_id, byte_offset, byte_length, model, max_tokens, est_input, provider, choices) VALUES `
	row := "(" + strings.TrimSuffix(strings.Repeat("?,", itemColumns), ",") + ")"
	var err error
	prep := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		if err != nil {
			err = fmt.Errorf("prepare %.60q: %w", q, err)
		}
		return st
	}
	s.insertChunk = prep(s.w, itemCols+strings.TrimSuffix(strings.Repeat(row+",", itemsPerInsert), ","))
	s.insertOne = prep(s.w, itemCols+row)
	s.itemsBetween = prep(s.w, `SELECT seq FROM items WHERE seq BETWEEN ? AND ?`)
	s.itemExists = prep(s.w, `SELECT count(*) FROM items WHERE seq = ?`)
	s.insertPendings = prep(s.w, `INSERT INTO pending (seq) VALUES `+strings.TrimSuffix(strings.Repeat("(?),", pendingPerInsert), ","))
	s.insertPending = prep(s.w, `INSERT INTO pending (seq) VALUES (?)`)
	s.unpend = prep(s.w, unpendQuery)
	const resultCols = `INSERT INTO results (rseq, seq, state, org, error_type, attempts, latency_ms,
		cost_nanos, input_tok, output_tok, cache_read, cache_write) VALUES `
	resultRow := "(" + strings.TrimSuffix(strings.Repeat("?,", resultColumns), ",") + ")"
	s.insertResults = prep(s.w, resultCols+strings.TrimSuffix(strings.Repeat(resultRow+",", resultsPerInsert), ","))
	s.insertResult = prep(s.w, resultCols+resultRow)
	s.insertLines = prep(s.w, `INSERT INTO lines (rseq, line) VALUES `+strings.TrimSuffix(strings.Repeat("(?, ?),", resultsPerInsert), ","))
	s.insertLine = prep(s.w, `INSERT INTO lines (rseq, line) VALUES (?, ?)`)
	s.maxRSeq = prep(s.w, `SELECT coalesce(max(rseq), 0) FROM results`)
	s.addTotal = prep(s.w, `INSERT INTO totals (state, org, error_type, n, cost_nanos, input_tok, output_tok, cache_read, cache_write)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (state, org, error_type) DO UPDATE SET n = n + excluded.n, cost_nanos = cost_nanos + excluded.cost_nanos,
			input_tok = input_tok + excluded.input_tok, output_tok = output_tok + excluded.output_tok,
			cache_read = cache_read + excluded.cache_read, cache_write = cache_write + excluded.cache_write`)
	s.addRouteTotal = prep(s.w, `INSERT INTO route_totals (route, succeeded, errored, cost_nanos, input_tok, output_tok, cache_read, cache_write)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (route) DO UPDATE SET succeeded = succeeded + excluded.succeeded, errored = errored + excluded.errored,
			cost_nanos = cost_nanos + excluded.cost_nanos, input_tok = input_tok + excluded.input_tok,
			output_tok = output_tok + excluded.output_tok, cache_read = cache_read + excluded.cache_read,
			cache_write = cache_write + excluded.cache_write`)
	s.addCounter = prep(s.w, `INSERT INTO counters (name, value) VALUES (?, ?)
		ON CONFLICT (name) DO UPDATE SET value = value + excluded.value`)
	s.pending = prep(s.r, pendingQuery)
	return err
}

// Path returns the file the store was opened on.
func (s *Store) Path() string { return s.path }

// check returns the error a method must return before touching the
// database: ctx's own error, ErrClosed or ErrNotInitialized.
func (s *Store) check(ctx context.Context, needInit bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return store.ErrClosed
	}
	if needInit && !s.initialized.Load() {
		return store.ErrNotInitialized
	}
	return nil
}

const timeFormat = time.RFC3339Nano

// Init records meta in a new store, or checks that an existing one was made
// for the same input hash (see store.Store). A mismatch is reported as
// store.ErrInputMismatch with both paths and hashes, and changes nothing.
func (s *Store) Init(ctx context.Context, meta store.Meta) (existing bool, err error) {
	if err := s.check(ctx, false); err != nil {
		return false, err
	}
	if meta.InputHash == "" {
		return false, errors.New("sqlite: init: meta has no input hash")
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("sqlite: init: %w", err)
	}
	defer tx.Rollback()
	kv, err := readMeta(ctx, tx)
	if err != nil {
		return false, fmt.Errorf("sqlite: init: %w", err)
	}
	if have, ok := kv["input_hash"]; ok {
		if have != meta.InputHash {
			return false, fmt.Errorf("%w: %s was made for %s (sha256 %s), not for %s (sha256 %s)",
				store.ErrInputMismatch, s.path, kv["input_path"], have, meta.InputPath, meta.InputHash)
		}
		s.initialized.Store(true)
		return true, nil
	}
	for _, p := range [][2]string{
		{"input_path", meta.InputPath},
		{"input_hash", meta.InputHash},
		{"n", strconv.FormatInt(meta.N, 10)},
		{"created_at", meta.CreatedAt.UTC().Format(timeFormat)},
		{"imported", "0"},
	} {
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?)`, p[0], p[1]); err != nil {
			return false, fmt.Errorf("sqlite: init: record %s: %w", p[0], err)
		}
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("sqlite: init: commit: %w", err)
	}
	s.initialized.Store(true)
	return false, nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func readMeta(ctx context.Context, q querier) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT key, value FROM meta`)
	if err != nil {
		return nil, fmt.Errorf("read meta: %w", err)
	}
	defer rows.Close()
	kv := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("read meta: %w", err)
		}
		kv[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read meta: %w", err)
	}
	return kv, nil
}

// Meta returns what Init recorded.
func (s *Store) Meta(ctx context.Context) (store.Meta, error) {
	if err := s.check(ctx, true); err != nil {
		return store.Meta{}, err
	}
	kv, err := readMeta(ctx, s.r)
	if err != nil {
		return store.Meta{}, fmt.Errorf("sqlite: %w", err)
	}
	n, err := strconv.ParseInt(kv["n"], 10, 64)
	if err != nil {
		return store.Meta{}, fmt.Errorf("sqlite: meta n %q: %w", kv["n"], err)
	}
	created, err := time.Parse(timeFormat, kv["created_at"])
	if err != nil {
		return store.Meta{}, fmt.Errorf("sqlite: meta created_at %q: %w", kv["created_at"], err)
	}
	return store.Meta{InputPath: kv["input_path"], InputHash: kv["input_hash"], N: n, CreatedAt: created}, nil
}

// AddItems inserts items in one transaction; an item whose Seq exists is
// ignored, whatever its other fields, and so is a Seq repeated in items
// after its first occurrence. A CustomID already used by another Seq is an
// error (a UNIQUE constraint: silently keeping one would lose an item) and
// nothing of the call is inserted. Each call is one fsync: import a large
// input in calls of about 10,000 items.
func (s *Store) AddItems(ctx context.Context, items []store.Item) error {
	if err := s.check(ctx, true); err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	for _, it := range items {
		if it.Seq < 1 {
			return fmt.Errorf("sqlite: add items: seq %d (custom_id %q) is below 1", it.Seq, it.CustomID)
		}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: add items: %w", err)
	}
	defer tx.Rollback()
	// Only new items are inserted and made pending: an item added again,
	// perhaps after it completed, must not become pending again.
	fresh, err := s.newItems(ctx, tx, items)
	if err != nil {
		return fmt.Errorf("sqlite: add items: %w", err)
	}
	chunk := tx.StmtContext(ctx, s.insertChunk)
	one := tx.StmtContext(ctx, s.insertOne)
	args := make([]any, 0, itemsPerInsert*itemColumns)
	err = inChunks(len(fresh), itemsPerInsert, func(from, n int) error {
		st := chunk
		if n == 1 {
			st = one
		}
		args = args[:0]
		for _, it := range fresh[from : from+n] {
			args = append(args, it.Seq, it.Line, it.CustomID, it.Offset, it.Length, it.Model, it.MaxTokens, it.EstInput, it.Provider, it.Choices)
		}
		if _, err := st.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("sqlite: add items (seq %d..%d): %w", fresh[from].Seq, fresh[from+n-1].Seq, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.makePending(ctx, tx, fresh); err != nil {
		return fmt.Errorf("sqlite: add items: make pending: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: add items: commit: %w", err)
	}
	return nil
}

// newItems returns the items whose Seq is not stored yet, each Seq once
// (its first occurrence), in the given order. It runs in AddItems' write
// transaction, so nothing can be inserted between its answer and the
// insert. One range query serves the usual call, a run of consecutive
// seqs, whatever the size of the store.
func (s *Store) newItems(ctx context.Context, tx *sql.Tx, items []store.Item) ([]store.Item, error) {
	lo, hi := items[0].Seq, items[0].Seq
	increasing := true
	for i, it := range items {
		lo, hi = min(lo, it.Seq), max(hi, it.Seq)
		if i > 0 && it.Seq <= items[i-1].Seq {
			increasing = false
		}
	}
	stored := map[int64]bool{}
	if span := hi - lo + 1; span <= 4*int64(len(items))+1024 {
		rows, err := tx.StmtContext(ctx, s.itemsBetween).QueryContext(ctx, lo, hi)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				return nil, err
			}
			stored[seq] = true
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	} else { // scattered seqs: ask for each
		exists := tx.StmtContext(ctx, s.itemExists)
		for _, it := range items {
			var n int
			if err := exists.QueryRowContext(ctx, it.Seq).Scan(&n); err != nil {
				return nil, err
			}
			if n > 0 {
				stored[it.Seq] = true
			}
		}
	}
	if len(stored) == 0 && increasing {
		return items, nil // the import's case: all new, no repeats
	}
	fresh := make([]store.Item, 0, len(items))
	for _, it := range items {
		if !stored[it.Seq] {
			stored[it.Seq] = true // a repeat later in the call is not new
			fresh = append(fresh, it)
		}
	}
	return fresh, nil
}

// makePending adds the seqs of fresh, just inserted, to pending.
func (s *Store) makePending(ctx context.Context, tx *sql.Tx, fresh []store.Item) error {
	chunk := tx.StmtContext(ctx, s.insertPendings)
	one := tx.StmtContext(ctx, s.insertPending)
	args := make([]any, 0, pendingPerInsert)
	return inChunks(len(fresh), pendingPerInsert, func(from, n int) error {
		st := chunk
		if n == 1 {
			st = one
		}
		args = args[:0]
		for _, it := range fresh[from : from+n] {
			args = append(args, it.Seq)
		}
		_, err := st.ExecContext(ctx, args...)
		return err
	})
}

// SetImported marks the import complete.
func (s *Store) SetImported(ctx context.Context) error {
	if err := s.check(ctx, true); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.w.ExecContext(ctx, `UPDATE meta SET value = '1' WHERE key = 'imported'`); err != nil {
		return fmt.Errorf("sqlite: set imported: %w", err)
	}
	return nil
}

// Imported reports whether SetImported was called.
func (s *Store) Imported(ctx context.Context) (bool, error) {
	if err := s.check(ctx, true); err != nil {
		return false, err
	}
	var v string
	if err := s.r.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'imported'`).Scan(&v); err != nil {
		return false, fmt.Errorf("sqlite: imported: %w", err)
	}
	return v == "1", nil
}

// Pending returns up to limit pending items with Seq > after, in Seq order.
// It walks the pending table, so its cost does not depend on how many items
// are already done.
func (s *Store) Pending(ctx context.Context, after int64, limit int) ([]store.Item, error) {
	if err := s.check(ctx, true); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pending.QueryContext(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: pending after %d: %w", after, err)
	}
	defer rows.Close()
	items := make([]store.Item, 0, min(limit, 1024))
	for rows.Next() {
		var it store.Item
		if err := rows.Scan(&it.Seq, &it.Line, &it.CustomID, &it.Offset, &it.Length,
			&it.Model, &it.MaxTokens, &it.EstInput, &it.Provider, &it.Choices); err != nil {
			return nil, fmt.Errorf("sqlite: pending after %d: %w", after, err)
		}
		items = append(items, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: pending after %d: %w", after, err)
	}
	return items, nil
}

// Commit makes b durable in one transaction (see store.Store and the
// package's Durability section). Each outcome first deletes its item from
// the pending table, the guard; only when that removed a row is the outcome
// appended to results with the next rseq, counted on from the highest one in
// the file.
func (s *Store) Commit(ctx context.Context, b store.Batch) (store.Committed, error) {
	if err := s.check(ctx, true); err != nil {
		return store.Committed{}, err
	}
	for i, o := range b.Outcomes {
		if why := invalidOutcome(o); why != "" {
			return store.Committed{}, fmt.Errorf("%w: outcome %d (seq %d): %s", store.ErrInvalidOutcome, i, o.Seq, why)
		}
	}
	got := store.Committed{RSeq: make([]int64, len(b.Outcomes))}
	if len(b.Outcomes) == 0 && len(b.Counters) == 0 {
		return got, nil
	}

	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return store.Committed{}, fmt.Errorf("sqlite: commit: %w", err)
	}
	defer tx.Rollback()

	var next int64
	if err := tx.StmtContext(ctx, s.maxRSeq).QueryRowContext(ctx).Scan(&next); err != nil {
		return store.Committed{}, fmt.Errorf("sqlite: commit: read last rseq: %w", err)
	}
	next++
	// The guard: an outcome is taken only if deleting its item from pending
	// removed a row. A seq repeated in the batch finds it gone already.
	unpend := tx.StmtContext(ctx, s.unpend)
	taken := make([]int, 0, len(b.Outcomes))
	for i, o := range b.Outcomes {
		res, err := unpend.ExecContext(ctx, o.Seq)
		if err != nil {
			return store.Committed{}, fmt.Errorf("sqlite: commit: seq %d: %w", o.Seq, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return store.Committed{}, fmt.Errorf("sqlite: commit: seq %d: %w", o.Seq, err)
		}
		if n == 0 {
			continue // not pending (terminal already, repeated in this batch, or unknown): skipped
		}
		got.RSeq[i] = next
		next++
		taken = append(taken, i)
	}
	// The taken outcomes and their lines, resultsPerInsert rows per
	// statement.
	chunk, one := tx.StmtContext(ctx, s.insertResults), tx.StmtContext(ctx, s.insertResult)
	lchunk, lone := tx.StmtContext(ctx, s.insertLines), tx.StmtContext(ctx, s.insertLine)
	args := make([]any, 0, resultsPerInsert*resultColumns)
	err = inChunks(len(taken), resultsPerInsert, func(from, n int) error {
		st, lst := chunk, lchunk
		if n == 1 {
			st, lst = one, lone
		}
		args = args[:0]
		for _, i := range taken[from : from+n] {
			o := &b.Outcomes[i]
			args = append(args, got.RSeq[i], o.Seq, string(o.State), o.Org, o.ErrorType, o.Attempts,
				o.LatencyMs, o.CostNanos, o.InputTok, o.OutputTok, o.CacheRead, o.CacheWrite)
		}
		if _, err := st.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("sqlite: commit: results of seq %d..: %w", b.Outcomes[taken[from]].Seq, err)
		}
		args = args[:0]
		for _, i := range taken[from : from+n] {
			args = append(args, got.RSeq[i], b.Outcomes[i].Line)
		}
		if _, err := lst.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("sqlite: commit: result lines of seq %d..: %w", b.Outcomes[taken[from]].Seq, err)
		}
		return nil
	})
	if err != nil {
		return store.Committed{}, err
	}
	if err := s.addTotals(ctx, tx, b.Outcomes, got.RSeq); err != nil {
		return store.Committed{}, fmt.Errorf("sqlite: commit: totals: %w", err)
	}
	// An outcome's own counters count only when it was taken.
	counters, own := b.Counters, false
	for _, i := range taken {
		if len(b.Outcomes[i].Counters) == 0 {
			continue
		}
		if !own {
			counters, own = maps.Clone(b.Counters), true
			if counters == nil {
				counters = map[string]int64{}
			}
		}
		for name, v := range b.Outcomes[i].Counters {
			counters[name] += v
		}
	}
	if len(counters) > 0 {
		add := tx.StmtContext(ctx, s.addCounter)
		// Sorted, so concurrent processes (or a Postgres store) would take
		// row locks in one order.
		for _, name := range slices.Sorted(maps.Keys(counters)) {
			if _, err := add.ExecContext(ctx, name, counters[name]); err != nil {
				return store.Committed{}, fmt.Errorf("sqlite: commit: counter %q: %w", name, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return store.Committed{}, fmt.Errorf("sqlite: commit %d outcomes to %s: %w", len(b.Outcomes), s.path, err)
	}
	return got, nil
}

// totalsKey identifies a row of the totals table.
type totalsKey struct{ state, org, errorType string }

// addTotals adds the outcomes that were taken (rseq != 0) to the totals
// table, one upsert per (state, org, error_type) in the batch, in key order.
func (s *Store) addTotals(ctx context.Context, tx *sql.Tx, outs []store.Outcome, rseq []int64) error {
	sums := map[totalsKey]*store.OrgTotals{} // Succeeded holds the count
	routes := map[string]*store.OrgTotals{}
	for i := range outs {
		if rseq[i] == 0 {
			continue
		}
		o := &outs[i]
		route := o.Route
		if route == "" {
			route = store.RouteSync
		}
		r := routes[route]
		if r == nil {
			r = &store.OrgTotals{}
			routes[route] = r
		}
		if o.State == store.Succeeded {
			r.Succeeded++
		} else {
			r.Errored++
		}
		r.CostNanos += o.CostNanos
		r.InputTok += o.InputTok
		r.OutputTok += o.OutputTok
		r.CacheRead += o.CacheRead
		r.CacheWrite += o.CacheWrite
		k := totalsKey{string(o.State), o.Org, o.ErrorType}
		t := sums[k]
		if t == nil {
			t = &store.OrgTotals{}
			sums[k] = t
		}
		t.Succeeded++
		t.CostNanos += o.CostNanos
		t.InputTok += o.InputTok
		t.OutputTok += o.OutputTok
		t.CacheRead += o.CacheRead
		t.CacheWrite += o.CacheWrite
	}
	if len(sums) == 0 {
		return nil
	}
	keys := slices.SortedFunc(maps.Keys(sums), func(a, b totalsKey) int {
		return cmp.Or(cmp.Compare(a.state, b.state), cmp.Compare(a.org, b.org), cmp.Compare(a.errorType, b.errorType))
	})
	radd := tx.StmtContext(ctx, s.addRouteTotal)
	for _, name := range slices.Sorted(maps.Keys(routes)) {
		r := routes[name]
		if _, err := radd.ExecContext(ctx, name, r.Succeeded, r.Errored,
			r.CostNanos, r.InputTok, r.OutputTok, r.CacheRead, r.CacheWrite); err != nil {
			return err
		}
	}
	add := tx.StmtContext(ctx, s.addTotal)
	for _, k := range keys {
		t := sums[k]
		if _, err := add.ExecContext(ctx, k.state, k.org, k.errorType, t.Succeeded,
			t.CostNanos, t.InputTok, t.OutputTok, t.CacheRead, t.CacheWrite); err != nil {
			return err
		}
	}
	return nil
}

// inChunks calls do for consecutive ranges of [0, n): per rows at a time
// while that many remain, then single rows, so that two prepared
// statements (per rows and one row) serve any n.
func inChunks(n, per int, do func(from, n int) error) error {
	for from := 0; from < n; {
		k := min(n-from, per)
		if k < per {
			k = 1
		}
		if err := do(from, k); err != nil {
			return err
		}
		from += k
	}
	return nil
}

// invalidOutcome says why o cannot be recorded, or "" when it can.
func invalidOutcome(o store.Outcome) string {
	switch {
	case o.State != store.Succeeded && o.State != store.Errored:
		return fmt.Sprintf("state %q is not terminal", o.State)
	case o.Seq < 1:
		return "seq below 1"
	case len(o.Line) == 0:
		return "empty result line"
	case bytes.IndexByte(o.Line, '\n') >= 0:
		return "result line holds a newline"
	}
	return ""
}
