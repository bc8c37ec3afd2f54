package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"

	"github.com/apidispatch/apidispatch/store"
)

// schemaVersion is the version of the schema below. Earlier versions are
// brought up to it when opened; a database recording a newer version is
// refused with store.ErrUnsupportedSchema: a newer program wrote it, whose
// meaning this one cannot know.
const schemaVersion = 5

// schema creates version 1; with batchSchema it is version 2, with
// prefixSchema version 3, with providerSchema version 4, with
// batchStateSchema version 5. Design notes for maintainers:
//
//   - items holds the input, one row per request located by byte range in
//     the input file, and is never updated after the import.
//   - pending holds the seq of every item still to do. AddItems fills it
//     with the seqs it inserts into items, never with one stored already (so
//     an item added again after it completed is not pending again; an AFTER
//     INSERT trigger did the same at 2.3 µs more per item). Pending
//     walks it; deleting an item's row there is Commit's guard: the DELETE
//     removes the row only if the item is still pending, and a result is
//     written only when it did.
//   - results holds one row per terminal item, appended in rseq order: the
//     outcome's numbers. lines holds its result line under the same rseq.
//     Commit therefore appends to two b-trees and deletes from a small one
//     instead of rewriting items rows and their indexes (~35 µs a row with
//     modernc.org/sqlite, more than the whole of Commit's cost now; see
//     store/BENCH.md). The lines (~600 bytes each) are apart so that
//     Aggregate and LatencyPercentiles scan ~60-byte rows, not 700-byte ones.
//   - totals holds the sums of results by (state, org, error_type), kept by
//     Commit in the same transaction as the results it adds (a few upserts
//     a batch), so Aggregate reads a handful of rows instead of grouping a
//     million: SQLite groups by sorting, and the transpiled sorter took 5 to
//     10 s for 900k results on the 2-core benchmark machine. The tests
//     recompute the sums from results and compare, after kill -9 too.
//   - The no-loss invariants are database constraints where SQLite can hold
//     them: one result per item (results.seq UNIQUE), one item per result
//     number (the primary key), only terminal states in results (CHECK).
//     That every result has its line is Commit's two inserts in one
//     transaction, checked like the rest by the crash test.
//     That an item is either pending or has a result, never both and never
//     neither, follows from Commit's delete-then-insert in one transaction;
//     the crash test checks it on files left by kill -9.
//   - STRICT tables refuse a value of the wrong type instead of storing it.
//   - item_states is a view for people inspecting a file with the sqlite3
//     shell; the program does not read it.
var schema = []string{
	`CREATE TABLE meta (
		key   TEXT PRIMARY KEY,
		value TEXT NOT NULL
	) STRICT, WITHOUT ROWID`,
	`CREATE TABLE items (
		seq         INTEGER PRIMARY KEY CHECK (seq >= 1),
		line        INTEGER NOT NULL,
		custom_id   TEXT    NOT NULL UNIQUE,
		byte_offset INTEGER NOT NULL,
		byte_length INTEGER NOT NULL,
		model       TEXT    NOT NULL,
		max_tokens  INTEGER NOT NULL,
		est_input   INTEGER NOT NULL
	) STRICT`,
	`CREATE TABLE pending (
		seq INTEGER PRIMARY KEY
	) STRICT`,
	`CREATE TABLE results (
		rseq        INTEGER PRIMARY KEY CHECK (rseq >= 1),
		seq         INTEGER NOT NULL UNIQUE,
		state       TEXT    NOT NULL CHECK (state IN ('succeeded', 'errored')),
		org         TEXT    NOT NULL,
		error_type  TEXT    NOT NULL,
		attempts    INTEGER NOT NULL,
		latency_ms  INTEGER NOT NULL,
		cost_nanos  INTEGER NOT NULL,
		input_tok   INTEGER NOT NULL,
		output_tok  INTEGER NOT NULL,
		cache_read  INTEGER NOT NULL,
		cache_write INTEGER NOT NULL
	) STRICT`,
	`CREATE TABLE lines (
		rseq INTEGER PRIMARY KEY,
		line BLOB NOT NULL
	) STRICT`,
	`CREATE TABLE totals (
		state       TEXT    NOT NULL,
		org         TEXT    NOT NULL,
		error_type  TEXT    NOT NULL,
		n           INTEGER NOT NULL,
		cost_nanos  INTEGER NOT NULL,
		input_tok   INTEGER NOT NULL,
		output_tok  INTEGER NOT NULL,
		cache_read  INTEGER NOT NULL,
		cache_write INTEGER NOT NULL,
		PRIMARY KEY (state, org, error_type)
	) STRICT, WITHOUT ROWID`,
	`CREATE TABLE counters (
		name  TEXT PRIMARY KEY,
		value INTEGER NOT NULL
	) STRICT, WITHOUT ROWID`,
	`CREATE VIEW item_states AS
		SELECT i.seq, i.custom_id, i.model, coalesce(r.state, 'pending') AS state,
			r.rseq, r.org, r.error_type, r.attempts, r.latency_ms, r.cost_nanos
		FROM items i LEFT JOIN results r ON r.seq = i.seq`,
}

// batchSchema is what version 2 adds: the batch route's batches and their
// items, and the totals by route.
//
//   - batches holds one row per batch a run recorded, made in status
//     'submitting' before its create call (docs/design.md §12). batch_id is
//     unique among those that have one.
//   - batch_items maps a batch to its items; an item is in at most one
//     open batch (AddBatch checks it in the same transaction), and its
//     number of rows is how many batches it has been in.
//   - route_totals are the sums of results by route, kept by Commit like
//     totals.
var batchSchema = []string{
	`CREATE TABLE batches (
		local            INTEGER PRIMARY KEY CHECK (local >= 1),
		org              TEXT    NOT NULL,
		status           TEXT    NOT NULL CHECK (status IN ('submitting', 'submitted', 'harvested', 'abandoned')),
		batch_id         TEXT    NOT NULL,
		n                INTEGER NOT NULL,
		bytes            INTEGER NOT NULL,
		worst_nanos      INTEGER NOT NULL,
		created_at       INTEGER NOT NULL,
		submitted_at     INTEGER NOT NULL,
		ended_at         INTEGER NOT NULL,
		harvested_at     INTEGER NOT NULL,
		cancel_requested INTEGER NOT NULL,
		note             TEXT    NOT NULL
	) STRICT`,
	`CREATE UNIQUE INDEX batches_id ON batches (batch_id) WHERE batch_id != ''`,
	`CREATE TABLE batch_items (
		batch INTEGER NOT NULL,
		seq   INTEGER NOT NULL,
		PRIMARY KEY (batch, seq)
	) STRICT, WITHOUT ROWID`,
	`CREATE INDEX batch_items_seq ON batch_items (seq, batch)`,
	`CREATE TABLE route_totals (
		route       TEXT    NOT NULL,
		succeeded   INTEGER NOT NULL,
		errored     INTEGER NOT NULL,
		cost_nanos  INTEGER NOT NULL,
		input_tok   INTEGER NOT NULL,
		output_tok  INTEGER NOT NULL,
		cache_read  INTEGER NOT NULL,
		cache_write INTEGER NOT NULL,
		PRIMARY KEY (route)
	) STRICT, WITHOUT ROWID`,
}

// prefixSchema is what version 3 adds: the custom_id prefix each batch's
// requests were sent under (empty for the batches of versions 1 and 2, sent
// under the items' own custom_ids).
var prefixSchema = []string{
	`ALTER TABLE batches ADD COLUMN prefix TEXT NOT NULL DEFAULT ''`,
}

// providerSchema is what version 4 adds: each item's provider (” is
// Anthropic, the only provider before it, so a store of an earlier version
// reads as all Anthropic) and its number of choices (OpenAI's n; 0 is one).
var providerSchema = []string{
	`ALTER TABLE items ADD COLUMN provider TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE items ADD COLUMN choices INTEGER NOT NULL DEFAULT 0`,
}

// batchStateSchema is what version 5 adds to each batch: how many of its
// results files were read to their end (parts_read), and the enqueued-token
// limit an OpenAI batch's failure taught (queue_tokens); 0 for the batches
// of earlier versions.
var batchStateSchema = []string{
	`ALTER TABLE batches ADD COLUMN parts_read INTEGER NOT NULL DEFAULT 0`,
	`ALTER TABLE batches ADD COLUMN queue_tokens INTEGER NOT NULL DEFAULT 0`,
}

// migrate creates the schema in an empty database, or checks the version of
// an existing one. It runs in one write transaction, so two processes
// opening the same new file cannot both create it, and it changes nothing in
// a database it refuses. A version 1 file (before the batch route) is
// brought to version 2 by adding batchSchema's tables, which it lacked.
func migrate(ctx context.Context, db *sql.DB, path string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	defer tx.Rollback()

	var hasMeta, objects int
	if err := tx.QueryRowContext(ctx,
		`SELECT count(*) FILTER (WHERE type = 'table' AND name = 'meta'), count(*) FROM sqlite_schema`,
	).Scan(&hasMeta, &objects); err != nil {
		return fmt.Errorf("sqlite: open %s: read schema: %w", path, err)
	}
	if hasMeta == 0 {
		if objects > 0 {
			return fmt.Errorf("%w: %s is a SQLite database but not an apidispatch store (no meta table)",
				store.ErrUnsupportedSchema, path)
		}
		for _, stmt := range slices.Concat(schema, batchSchema, prefixSchema, providerSchema, batchStateSchema) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlite: open %s: create schema: %w", path, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('schema_version', ?)`,
			strconv.Itoa(schemaVersion)); err != nil {
			return fmt.Errorf("sqlite: open %s: record schema version: %w", path, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("sqlite: open %s: commit schema: %w", path, err)
		}
		return nil
	}

	var v string
	err = tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&v)
	if err == sql.ErrNoRows {
		return fmt.Errorf("%w: %s has no schema version", store.ErrUnsupportedSchema, path)
	}
	if err != nil {
		return fmt.Errorf("sqlite: open %s: read schema version: %w", path, err)
	}
	if v == "1" {
		// Version 1 lacks the batch route's tables; route_totals starts
		// from its results, which all came by sync.
		for _, stmt := range batchSchema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlite: open %s: upgrade schema 1 to 2: %w", path, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO route_totals
			SELECT 'sync', count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'errored'),
				coalesce(sum(cost_nanos), 0), coalesce(sum(input_tok), 0), coalesce(sum(output_tok), 0),
				coalesce(sum(cache_read), 0), coalesce(sum(cache_write), 0)
			FROM results HAVING count(*) > 0`); err != nil {
			return fmt.Errorf("sqlite: open %s: upgrade schema 1 to 2: %w", path, err)
		}
		v = "2"
	}
	if v == "2" {
		for _, stmt := range prefixSchema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlite: open %s: upgrade schema 2 to 3: %w", path, err)
			}
		}
		v = "3"
	}
	if v == "3" {
		for _, stmt := range providerSchema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlite: open %s: upgrade schema 3 to 4: %w", path, err)
			}
		}
		v = "4"
	}
	if v == "4" {
		for _, stmt := range batchStateSchema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlite: open %s: upgrade schema 4 to 5: %w", path, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE key = 'schema_version'`, strconv.Itoa(schemaVersion)); err != nil {
			return fmt.Errorf("sqlite: open %s: upgrade schema to %d: %w", path, schemaVersion, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("sqlite: open %s: upgrade schema to %d: %w", path, schemaVersion, err)
		}
		return nil
	}
	if v != strconv.Itoa(schemaVersion) {
		return fmt.Errorf("%w: %s has schema version %s, this program knows version %d (a newer apidispatch wrote it?)",
			store.ErrUnsupportedSchema, path, v, schemaVersion)
	}
	return nil
}
