package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	"github.com/apidispatch/apidispatch/store"
)

// schemaVersion is the version of the schema below. A database recording a
// different version is refused with store.ErrUnsupportedSchema: there is no
// older version to migrate from yet, and a newer one was written by a newer
// program whose meaning this one cannot know.
const schemaVersion = 1

// schema creates version 1. Design notes for maintainers:
//
//   - items holds one row per input request, located by byte range in the
//     input file. Its rows stay small (~120 bytes) so the partial index for
//     pending work, Aggregate's full scan and the import stay fast at 1M rows.
//   - The result line (~600 bytes or more) lives in results, keyed by rseq, so
//     Commit appends to the end of one b-tree instead of growing items rows in
//     place, and Results is a plain primary-key range scan.
//   - The no-loss invariants are enforced by the database, not only by the
//     code: a terminal row has an rseq and a pending row has none (CHECK), an
//     rseq is given to one item only (items_rseq UNIQUE) and an item has at
//     most one result line (results.seq UNIQUE).
//   - STRICT tables refuse a value of the wrong type instead of storing it.
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
		est_input   INTEGER NOT NULL,
		state       TEXT    NOT NULL DEFAULT 'pending'
		            CHECK (state IN ('pending', 'succeeded', 'errored')),
		org         TEXT    NOT NULL DEFAULT '',
		error_type  TEXT    NOT NULL DEFAULT '',
		attempts    INTEGER NOT NULL DEFAULT 0,
		latency_ms  INTEGER NOT NULL DEFAULT 0,
		cost_nanos  INTEGER NOT NULL DEFAULT 0,
		input_tok   INTEGER NOT NULL DEFAULT 0,
		output_tok  INTEGER NOT NULL DEFAULT 0,
		cache_read  INTEGER NOT NULL DEFAULT 0,
		cache_write INTEGER NOT NULL DEFAULT 0,
		rseq        INTEGER,
		CHECK ((state = 'pending') = (rseq IS NULL))
	) STRICT`,
	// Pending walks this index: it holds only the rows still to do, so a
	// resume after 900k completions does not step over them.
	`CREATE INDEX items_pending ON items (seq) WHERE state = 'pending'`,
	`CREATE UNIQUE INDEX items_rseq ON items (rseq) WHERE rseq IS NOT NULL`,
	// LatencyPercentiles reads ranks from this index instead of sorting.
	`CREATE INDEX items_latency ON items (latency_ms) WHERE state = 'succeeded'`,
	`CREATE TABLE results (
		rseq INTEGER PRIMARY KEY CHECK (rseq >= 1),
		seq  INTEGER NOT NULL UNIQUE,
		line BLOB    NOT NULL
	) STRICT`,
	`CREATE TABLE counters (
		name  TEXT PRIMARY KEY,
		value INTEGER NOT NULL
	) STRICT, WITHOUT ROWID`,
}

// migrate creates the schema in an empty database, or checks the version of
// an existing one. It runs in one write transaction, so two processes
// opening the same new file cannot both create it, and it changes nothing in
// a database it refuses.
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
		for _, stmt := range schema {
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
	if v != strconv.Itoa(schemaVersion) {
		return fmt.Errorf("%w: %s has schema version %s, this program knows version %d (a newer apidispatch wrote it?)",
			store.ErrUnsupportedSchema, path, v, schemaVersion)
	}
	return nil
}
