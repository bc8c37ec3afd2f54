// Package cache is apidispatch's result cache across runs: one SQLite file
// that maps the canonical form of a request (KeyOf) to the API's whole
// response body, with its usage, cost, org, request id and time, so a run
// never pays twice for the same request.
//
// Only successes are stored. The file is safe for several processes at once
// (WAL, writes in short immediate transactions, first writer of a key wins),
// every entry carries a checksum of its body, and the file's format is
// versioned: a file from a newer apidispatch, a file that is not a cache, a
// truncated file or a damaged page is an error naming the file; one entry
// whose checksum fails is a miss with a warning. Nothing is ever answered
// from a damaged entry.
package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Format is the version of the file format this package writes (SQLite's
// user_version); applicationID marks the file as an apidispatch cache.
const (
	Format        = 1
	applicationID = 0x61706463 // "apdc"
)

// Errors callers can branch on; each is wrapped with the file's path.
var (
	// ErrNewerFormat: the file was written by a newer apidispatch.
	ErrNewerFormat = errors.New("cache: file has a newer format than this apidispatch reads")
	// ErrNotCache: the file is not an apidispatch cache (another SQLite
	// database, or not SQLite at all).
	ErrNotCache = errors.New("cache: file is not an apidispatch cache")
	// ErrCorrupt: the file is truncated or has a damaged page.
	ErrCorrupt = errors.New("cache: file is damaged")
)

// Entry is one cached success.
type Entry struct {
	Key   Key
	Model string
	// Body is the API's response body exactly as received.
	Body       []byte
	CostNanos  int64 // what the request cost when it was sent
	InputTok   int64
	OutputTok  int64
	CacheRead  int64
	CacheWrite int64
	Org        string // org that served it
	RequestID  string
	CreatedAt  time.Time
}

// Cache is an open cache file. It is safe for concurrent use, and several
// processes may open the same file. The zero value is not usable: call Open.
type Cache struct {
	path string
	db   *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS entries (
	-- A rowid table: rows of about a kilobyte are appended in rowid order,
	-- and only the small key index takes random inserts (a WITHOUT ROWID
	-- table keyed by a hash split pages on every insert: 9k puts/s).
	id          INTEGER PRIMARY KEY,
	key         BLOB NOT NULL UNIQUE, -- 32-byte SHA-256 of the canonical request
	model       TEXT NOT NULL,
	body        BLOB NOT NULL,     -- the API's response body
	body_sum    BLOB NOT NULL,     -- SHA-256 of body: a damaged entry is a miss
	cost_nanos  INTEGER NOT NULL,
	input_tok   INTEGER NOT NULL,
	output_tok  INTEGER NOT NULL,
	cache_read  INTEGER NOT NULL,
	cache_write INTEGER NOT NULL,
	org         TEXT NOT NULL,
	request_id  TEXT NOT NULL,
	created_ms  INTEGER NOT NULL   -- unix milliseconds
);
CREATE INDEX IF NOT EXISTS entries_created ON entries(created_ms);
`

// busyTimeout is how long a statement waits for another process's write lock.
const busyTimeout = 30 * time.Second

// Open opens the cache file at path, creating it when it does not exist.
func Open(path string) (*Cache, error) {
	if err := checkHeader(path); err != nil {
		return nil, err
	}
	// A new cache holds model outputs: only its owner reads it (SQLite
	// gives its -wal and -shm files the same permissions).
	if err := createPrivate(path); err != nil {
		return nil, fmt.Errorf("cache %s: %w", path, err)
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Set("_synchronous", "NORMAL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", path, err)
	}
	c := &Cache{path: path, db: db}
	if err := c.init(); err != nil {
		db.Close()
		return nil, err
	}
	return c, nil
}

// Path is the file's path.
func (c *Cache) Path() string { return c.path }

func (c *Cache) errorf(err error, what string) error {
	if err == nil {
		return nil
	}
	if isCorrupt(err) && !errors.Is(err, ErrCorrupt) {
		err = fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return fmt.Errorf("cache %s: %s: %w", c.path, what, err)
}

// isCorrupt tells SQLite's "malformed" and "not a database" errors, which
// the driver only reports as text with the code in it.
func isCorrupt(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() & 0xff {
		case 11, 26: // SQLITE_CORRUPT, SQLITE_NOTADB
			return true
		}
	}
	return false
}

// checkHeader refuses, before SQLite sees it, a file that is not SQLite or
// is shorter than its own header says (a truncated copy). SQLite would
// otherwise open it and fail later, or treat missing pages as empty.
// createPrivate creates path empty with mode 0600 when it does not exist.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

func checkHeader(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cache %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cache %s: %w", path, err)
	}
	if fi.Size() == 0 {
		return nil // a new file SQLite will initialise
	}
	var h [100]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return fmt.Errorf("cache %s: %w: shorter than an SQLite header (%d bytes)", path, ErrCorrupt, fi.Size())
	}
	if string(h[:16]) != "SQLite format 3\x00" {
		return fmt.Errorf("cache %s: %w: not an SQLite file", path, ErrNotCache)
	}
	pageSize := int64(binary.BigEndian.Uint16(h[16:18]))
	if pageSize == 1 {
		pageSize = 65536
	}
	pages := int64(binary.BigEndian.Uint32(h[28:32]))
	// The in-header page count is valid when the change counter matches
	// version-valid-for (SQLite ≥ 3.7.0 always writes both).
	if binary.BigEndian.Uint32(h[24:28]) == binary.BigEndian.Uint32(h[92:96]) && pages*pageSize > fi.Size() {
		return fmt.Errorf("cache %s: %w: truncated (%d bytes, its header says %d)", path, ErrCorrupt, fi.Size(), pages*pageSize)
	}
	return nil
}

func (c *Cache) init() error {
	ctx := context.Background()
	var app, ver int64
	if err := c.db.QueryRowContext(ctx, `PRAGMA application_id`).Scan(&app); err != nil {
		return c.errorf(err, "reading its header")
	}
	if err := c.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&ver); err != nil {
		return c.errorf(err, "reading its header")
	}
	switch {
	case app != 0 && app != applicationID:
		return fmt.Errorf("cache %s: %w (application id %#x)", c.path, ErrNotCache, app)
	case ver > Format:
		return fmt.Errorf("cache %s: %w (format %d; this apidispatch reads %d)", c.path, ErrNewerFormat, ver, Format)
	case app == 0:
		var tables int
		if err := c.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table'`).Scan(&tables); err != nil {
			return c.errorf(err, "reading its schema")
		}
		if tables > 0 {
			return fmt.Errorf("cache %s: %w (an SQLite database with other tables)", c.path, ErrNotCache)
		}
		if err := c.create(ctx); err != nil {
			return err
		}
	}
	var res string
	if err := c.db.QueryRowContext(ctx, `PRAGMA quick_check`).Scan(&res); err != nil {
		return c.errorf(err, "checking the file")
	}
	if res != "ok" {
		return fmt.Errorf("cache %s: %w: %s", c.path, ErrCorrupt, res)
	}
	return nil
}

// create writes the schema in one transaction; a process that raced us to
// it finds the tables there (IF NOT EXISTS) and the same header.
func (c *Cache) create(ctx context.Context) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return c.errorf(err, "creating it")
	}
	defer tx.Rollback()
	for _, s := range []string{schema, fmt.Sprintf("PRAGMA application_id = %d", applicationID), fmt.Sprintf("PRAGMA user_version = %d", Format)} {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return c.errorf(err, "creating it")
		}
	}
	return c.errorf(tx.Commit(), "creating it")
}

// Close closes the file.
func (c *Cache) Close() error { return c.db.Close() }

// Bad is an entry that failed its checksum: treated as a miss.
type Bad struct {
	Key    Key
	Reason string
}

// lookupChunk bounds the keys of one SELECT … IN (…).
const lookupChunk = 256

// Get looks keys up. It returns the hits, and the entries that were found
// but damaged (a miss each, for the caller to warn about). An error means
// the file could not be read; nothing of the call should be used then.
func (c *Cache) Get(ctx context.Context, keys []Key) (map[Key]Entry, []Bad, error) {
	hits := make(map[Key]Entry, len(keys))
	var bad []Bad
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		chunk := keys[:n]
		keys = keys[n:]
		args := make([]any, n)
		for i := range chunk {
			args[i] = chunk[i][:]
		}
		rows, err := c.db.QueryContext(ctx, `SELECT key, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms
			FROM entries WHERE key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, nil, c.errorf(err, "lookup")
		}
		for rows.Next() {
			var e Entry
			var k, sum []byte
			var ms int64
			if err := rows.Scan(&k, &e.Model, &e.Body, &sum, &e.CostNanos, &e.InputTok, &e.OutputTok, &e.CacheRead, &e.CacheWrite, &e.Org, &e.RequestID, &ms); err != nil {
				rows.Close()
				return nil, nil, c.errorf(err, "lookup")
			}
			if len(k) != len(e.Key) {
				continue // not a key this package wrote: no request can hash to it
			}
			copy(e.Key[:], k)
			if got := sha256.Sum256(e.Body); !bytes.Equal(got[:], sum) {
				bad = append(bad, Bad{Key: e.Key, Reason: "response body does not match its checksum"})
				continue
			}
			e.CreatedAt = time.UnixMilli(ms).UTC()
			hits[e.Key] = e
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, nil, c.errorf(err, "lookup")
		}
	}
	return hits, bad, nil
}

// Put stores entries in one transaction: all of them or, on error, none. A
// key already present keeps its first entry (so two processes filling one
// file never duplicate or overwrite). It returns how many were new.
func (c *Cache) Put(ctx context.Context, entries []Entry) (added int64, err error) {
	if len(entries) == 0 {
		return 0, nil
	}
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, c.errorf(err, "write")
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO entries (key, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return 0, c.errorf(err, "write")
	}
	defer st.Close()
	for _, e := range entries {
		sum := sha256.Sum256(e.Body)
		created := e.CreatedAt
		if created.IsZero() {
			created = time.Now()
		}
		r, err := st.ExecContext(ctx, e.Key[:], e.Model, e.Body, sum[:], e.CostNanos, e.InputTok, e.OutputTok, e.CacheRead, e.CacheWrite, e.Org, e.RequestID, created.UnixMilli())
		if err != nil {
			return 0, c.errorf(err, "write")
		}
		n, _ := r.RowsAffected()
		added += n
	}
	if err := tx.Commit(); err != nil {
		return 0, c.errorf(err, "write")
	}
	return added, nil
}

// Costs returns, for the keys present, what each stored request cost,
// without reading the bodies (for projections; a damaged entry counts as
// present here and is a miss when a run reads it with Get).
func (c *Cache) Costs(ctx context.Context, keys []Key) (map[Key]int64, error) {
	out := make(map[Key]int64, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		chunk := keys[:n]
		keys = keys[n:]
		args := make([]any, n)
		for i := range chunk {
			args[i] = chunk[i][:]
		}
		rows, err := c.db.QueryContext(ctx, `SELECT key, cost_nanos FROM entries WHERE key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, c.errorf(err, "lookup")
		}
		for rows.Next() {
			var k []byte
			var cn int64
			if err := rows.Scan(&k, &cn); err != nil {
				rows.Close()
				return nil, c.errorf(err, "lookup")
			}
			var key Key
			if copy(key[:], k) == len(key) {
				out[key] = cn
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, c.errorf(err, "lookup")
		}
	}
	return out, nil
}
