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
	"crypto/rand"
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
// Format 2 records each entry's origin; a format 1 file is upgraded when
// opened, its entries of unknown origin (see OriginUnknown).
const (
	Format        = 2
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
	// Origin is the API that answered: the scheme and host of the run's
	// base URL (OriginOf); OriginUnknown for an entry stored before
	// origins were recorded. Simulated: the answer came from apidispatch's
	// simulator (its response carried SimulatorHeader).
	Origin    string
	Simulated bool
}

// OriginUnknown is the origin of entries stored by an apidispatch that did
// not record it (format 1): they answer no run.
const OriginUnknown = ""

// SimulatorHeader is the header apidispatch's simulator sets on every
// response (its speed factor K; see package sim): a response that carries
// it is a simulation, whatever the URL it came from.
const SimulatorHeader = "X-Sim-Speed-Factor"

// OriginOf is the origin of an API root: its scheme and host, lower-cased,
// with the scheme's default port left out
// ("https://api.anthropic.com", "http://127.0.0.1:8080"). The path is not
// part of it.
func OriginOf(u *url.URL) string {
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if p := u.Port(); scheme == "https" && p == "443" || scheme == "http" && p == "80" {
		host = strings.ToLower(u.Hostname())
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	}
	return scheme + "://" + host
}

// Describe names an origin for a message: the URL, "a simulator at" it, or
// "an unknown origin".
func Describe(origin string, simulated bool) string {
	switch {
	case origin == OriginUnknown:
		return "an unknown origin (stored before apidispatch recorded origins)"
	case simulated:
		return "the simulator at " + origin
	}
	return origin
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
	key         BLOB NOT NULL,     -- 32-byte SHA-256 of the canonical request
	origin      TEXT NOT NULL,     -- scheme://host of the API that answered; '' unknown
	simulated   INTEGER NOT NULL,  -- 1: the simulator answered
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
	created_ms  INTEGER NOT NULL,  -- unix milliseconds
	UNIQUE (key, origin)           -- one answer per request and API
);
CREATE INDEX IF NOT EXISTS entries_created ON entries(created_ms);
`

// upgrade1 turns a format 1 file into format 2: the table is rebuilt
// (format 1 made key alone unique), its entries of unknown origin.
const upgrade1 = `
ALTER TABLE entries RENAME TO entries_v1;
DROP INDEX IF EXISTS entries_created;
` + schema + `
INSERT INTO entries (id, key, origin, simulated, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms)
	SELECT id, key, '', 0, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms FROM entries_v1;
DROP TABLE entries_v1;
`

// busyTimeout is how long a statement waits for another process's write lock.
const busyTimeout = 30 * time.Second

// Open opens the cache file at path, creating it when it does not exist.
// Several processes may open the same new path at once: a new file is
// made whole (schema, header, WAL mode) under a temporary name and linked
// into place, so each sees either no file or a whole cache, and joins the
// one that was linked first.
func Open(path string) (*Cache, error) {
	if err := createWhole(path); err != nil {
		return nil, fmt.Errorf("cache %s: %w", path, err)
	}
	if err := checkHeader(path); err != nil {
		return nil, err
	}
	// A new cache holds model outputs: only its owner reads it (SQLite
	// gives its -wal and -shm files the same permissions).
	if err := createPrivate(path); err != nil {
		return nil, fmt.Errorf("cache %s: %w", path, err)
	}
	c, err := open(path, "WAL")
	if err != nil {
		return nil, err
	}
	if err := c.init(); err != nil {
		c.db.Close()
		return nil, err
	}
	return c, nil
}

// open opens the SQLite file at path with the given journal mode.
func open(path, journal string) (*Cache, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode("+journal+")")
	q.Set("_synchronous", "NORMAL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", path, err)
	}
	return &Cache{path: path, db: db}, nil
}

// createWhole creates the cache at path when no file is there: it writes
// a whole cache under a temporary name beside it and hard-links that to
// path, which fails when another process linked its own first (then that
// one is used). The temporary name is removed either way. Where the file
// system has no hard links, path is left absent and Open initialises it in
// place (a single immediate transaction decides, see init).
func createWhole(path string) error {
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		return nil // there (or unreadable: checkHeader says why)
	}
	var id [8]byte
	rand.Read(id[:])
	tmp := fmt.Sprintf("%s.new-%x", path, id)
	if err := createPrivate(tmp); err != nil {
		return err
	}
	defer os.Remove(tmp)
	// The schema is committed straight into the file (rollback journal),
	// then the file is switched to WAL, which SQLite records in its header;
	// closing the only connection leaves nothing in a -wal file.
	c, err := open(tmp, "DELETE")
	if err != nil {
		return err
	}
	c.db.SetMaxOpenConns(1)
	err = c.create(context.Background())
	if err == nil {
		_, err = c.db.Exec(`PRAGMA journal_mode(WAL)`)
	}
	if cerr := c.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// Link does not replace: ErrExist means another opener's cache is
	// in place. Any other failure (a file system without hard links)
	// leaves path to be initialised in place.
	os.Link(tmp, path)
	return nil
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
	// A file with a WAL beside it is open in another process, or was left
	// by one: its header may be one a checkpoint has written before the
	// pages it counts (the file grows as they are written), so it is not
	// judged by its size; init's quick_check reads it whole.
	if wal, err := os.Stat(path + "-wal"); err == nil && wal.Size() > 0 {
		return nil
	}
	// The in-header page count is valid when the change counter matches
	// version-valid-for (SQLite ≥ 3.7.0 always writes both).
	if binary.BigEndian.Uint32(h[24:28]) == binary.BigEndian.Uint32(h[92:96]) && pages*pageSize > fi.Size() {
		return fmt.Errorf("cache %s: %w: truncated (%d bytes, its header says %d)", path, ErrCorrupt, fi.Size(), pages*pageSize)
	}
	return nil
}

func (c *Cache) init() error {
	deadline := time.Now().Add(busyTimeout)
	for {
		err := c.init1()
		switch {
		case errors.Is(err, errCreatedMeanwhile):
			// Read again the header another process wrote.
		case isBusy(err) && time.Now().Before(deadline):
			// A file initialised in place by several processes at once:
			// SQLite answers busy, without waiting, to a connection that
			// opens while another switches the file to WAL.
			time.Sleep(20 * time.Millisecond)
		default:
			return err
		}
	}
}

// isBusy tells SQLite's SQLITE_BUSY.
func isBusy(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 5
}

// errCreatedMeanwhile: another process made the file a cache between our
// reading its header and taking the write lock.
var errCreatedMeanwhile = errors.New("cache: created by another process meanwhile")

func (c *Cache) init1() error {
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
		if err := c.create(ctx); err != nil {
			return err
		}
	case ver < Format:
		if err := c.upgrade(ctx); err != nil {
			return err
		}
	}
	if err := c.ensureClaims(ctx); err != nil {
		return err
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

// create writes the schema in one transaction, in an empty file. The
// header is read again inside it, under the write lock: a file another
// process made a cache meanwhile is errCreatedMeanwhile (init judges it
// again, as any cache it opens), and a database with other tables and no
// header of ours is refused.
func (c *Cache) create(ctx context.Context) error {
	tx, err := c.db.BeginTx(ctx, nil) // immediate: the write lock is taken here
	if err != nil {
		return c.errorf(err, "creating it")
	}
	defer tx.Rollback()
	var app int64
	var tables int
	if err := tx.QueryRowContext(ctx, `PRAGMA application_id`).Scan(&app); err != nil {
		return c.errorf(err, "reading its header")
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table'`).Scan(&tables); err != nil {
		return c.errorf(err, "reading its schema")
	}
	switch {
	case app != 0:
		return errCreatedMeanwhile // init reads it again and judges it
	case tables > 0:
		return fmt.Errorf("cache %s: %w (an SQLite database with other tables)", c.path, ErrNotCache)
	}
	for _, s := range []string{schema, fmt.Sprintf("PRAGMA application_id = %d", applicationID), fmt.Sprintf("PRAGMA user_version = %d", Format)} {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return c.errorf(err, "creating it")
		}
	}
	return c.errorf(tx.Commit(), "creating it")
}

// ensureClaims creates the claims table (claim.go) in a file that has
// none: one written before claims, or by an apidispatch without them.
func (c *Cache) ensureClaims(ctx context.Context) error {
	var n int
	if err := c.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'claims'`).Scan(&n); err != nil {
		return c.errorf(err, "reading its schema")
	}
	if n > 0 {
		return nil
	}
	_, err := c.db.ExecContext(ctx, claimsSchema)
	return c.errorf(err, "adding its claims table")
}

// upgrade brings an older file to Format in one transaction; a process
// that raced us to it finds the new version inside its own (the write
// lock is taken at BEGIN) and does nothing.
func (c *Cache) upgrade(ctx context.Context) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return c.errorf(err, "upgrading it")
	}
	defer tx.Rollback()
	var ver int64
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&ver); err != nil {
		return c.errorf(err, "upgrading it")
	}
	if ver >= Format {
		return nil
	}
	if ver != 1 {
		return fmt.Errorf("cache %s: %w (format %d is not one this apidispatch upgrades)", c.path, ErrNotCache, ver)
	}
	for _, s := range []string{upgrade1, fmt.Sprintf("PRAGMA user_version = %d", Format)} {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return c.errorf(err, "upgrading it from format 1")
		}
	}
	return c.errorf(tx.Commit(), "upgrading it from format 1")
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

// Elsewhere is a key found only with another origin's answer: a miss for
// this run.
type Elsewhere struct {
	Key       Key
	Origin    string
	Simulated bool
}

// Get looks keys up for a run against origin (OriginOf its base URL): only
// entries that origin answered are hits. It returns the hits, the entries
// that were found but damaged (a miss each, for the caller to warn about),
// and the keys found only with other origins' answers (a miss each; the
// caller says why). An error means the file could not be read; nothing of
// the call should be used then.
func (c *Cache) Get(ctx context.Context, keys []Key, origin string) (map[Key]Entry, []Bad, []Elsewhere, error) {
	hits, bad, err := getIn(ctx, c.db, keys, origin)
	if err != nil {
		return nil, nil, nil, c.errorf(err, "lookup")
	}
	var missed []Key
	if len(hits) < len(keys) {
		for _, k := range keys {
			if _, hit := hits[k]; !hit {
				missed = append(missed, k)
			}
		}
	}
	elsewhere, err := c.elsewhere(ctx, missed, origin, bad)
	if err != nil {
		return nil, nil, nil, err
	}
	return hits, bad, elsewhere, nil
}

// querier is a database or a transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// getIn reads the entries origin answered of keys, through q: the hits,
// and the entries found but damaged.
func getIn(ctx context.Context, q querier, keys []Key, origin string) (map[Key]Entry, []Bad, error) {
	hits := make(map[Key]Entry, len(keys))
	var bad []Bad
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		chunk := keys[:n]
		keys = keys[n:]
		args := make([]any, 0, n+1)
		args = append(args, origin)
		for i := range chunk {
			args = append(args, chunk[i][:])
		}
		rows, err := q.QueryContext(ctx, `SELECT key, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms, simulated
			FROM entries WHERE origin = ? AND key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, nil, err
		}
		for rows.Next() {
			e := Entry{Origin: origin}
			var k, sum []byte
			var ms int64
			if err := rows.Scan(&k, &e.Model, &e.Body, &sum, &e.CostNanos, &e.InputTok, &e.OutputTok, &e.CacheRead, &e.CacheWrite, &e.Org, &e.RequestID, &ms, &e.Simulated); err != nil {
				rows.Close()
				return nil, nil, err
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
			return nil, nil, err
		}
	}
	return hits, bad, nil
}

// elsewhere returns, of keys this origin did not answer, those another
// origin did (one of them each), without reading their bodies. Damaged
// entries of this origin are left out: they are reported as such.
func (c *Cache) elsewhere(ctx context.Context, keys []Key, origin string, bad []Bad) ([]Elsewhere, error) {
	damaged := make(map[Key]bool, len(bad))
	for _, b := range bad {
		damaged[b.Key] = true
	}
	seen := map[Key]bool{}
	var out []Elsewhere
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		chunk := keys[:n]
		keys = keys[n:]
		args := make([]any, 0, n+1)
		args = append(args, origin)
		for i := range chunk {
			args = append(args, chunk[i][:])
		}
		rows, err := c.db.QueryContext(ctx, `SELECT key, origin, simulated FROM entries WHERE origin != ? AND key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, c.errorf(err, "lookup")
		}
		for rows.Next() {
			var e Elsewhere
			var k []byte
			if err := rows.Scan(&k, &e.Origin, &e.Simulated); err != nil {
				rows.Close()
				return nil, c.errorf(err, "lookup")
			}
			if copy(e.Key[:], k) != len(e.Key) || seen[e.Key] || damaged[e.Key] {
				continue
			}
			seen[e.Key] = true
			out = append(out, e)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, c.errorf(err, "lookup")
		}
	}
	return out, nil
}

// Put stores entries in one transaction: all of them or, on error, none. A
// key already present for the same origin keeps its first entry (so two
// processes filling one file never duplicate or overwrite); each origin
// keeps its own answer. It returns how many were new.
func (c *Cache) Put(ctx context.Context, entries []Entry) (added int64, err error) {
	if len(entries) == 0 {
		return 0, nil
	}
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, c.errorf(err, "write")
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO entries (key, origin, simulated, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return 0, c.errorf(err, "write")
	}
	defer st.Close()
	// A stored answer ends every claim on its key: the requests waiting
	// for it read it now.
	unclaim, err := tx.PrepareContext(ctx, `DELETE FROM claims WHERE key = ? AND origin = ?`)
	if err != nil {
		return 0, c.errorf(err, "write")
	}
	defer unclaim.Close()
	for _, e := range entries {
		if _, err := unclaim.ExecContext(ctx, e.Key[:], e.Origin); err != nil {
			return 0, c.errorf(err, "write")
		}
		sum := sha256.Sum256(e.Body)
		created := e.CreatedAt
		if created.IsZero() {
			created = time.Now()
		}
		r, err := st.ExecContext(ctx, e.Key[:], e.Origin, e.Simulated, e.Model, e.Body, sum[:], e.CostNanos, e.InputTok, e.OutputTok, e.CacheRead, e.CacheWrite, e.Org, e.RequestID, created.UnixMilli())
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

// Costs returns, for the keys present with origin's answer (as Get), what
// each stored request cost, without reading the bodies (for projections; a
// damaged entry counts as present here and is a miss when a run reads it
// with Get).
func (c *Cache) Costs(ctx context.Context, keys []Key, origin string) (map[Key]int64, error) {
	out := make(map[Key]int64, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), lookupChunk)
		chunk := keys[:n]
		keys = keys[n:]
		args := make([]any, 0, n+1)
		args = append(args, origin)
		for i := range chunk {
			args = append(args, chunk[i][:])
		}
		rows, err := c.db.QueryContext(ctx, `SELECT key, cost_nanos FROM entries WHERE origin = ? AND key IN (?`+strings.Repeat(",?", n-1)+`)`, args...)
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
