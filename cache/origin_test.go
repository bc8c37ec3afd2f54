package cache

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
)

// format1 is the schema apidispatch wrote before origins were recorded.
const format1 = `
CREATE TABLE entries (
	id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE, model TEXT NOT NULL, body BLOB NOT NULL, body_sum BLOB NOT NULL,
	cost_nanos INTEGER NOT NULL, input_tok INTEGER NOT NULL, output_tok INTEGER NOT NULL, cache_read INTEGER NOT NULL,
	cache_write INTEGER NOT NULL, org TEXT NOT NULL, request_id TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE INDEX entries_created ON entries(created_ms);
PRAGMA application_id = 1634755683;
PRAGMA user_version = 1;`

// writeFormat1 writes a format 1 file holding entries 1..n.
func writeFormat1(t testing.TB, path string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(format1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		e := entry(t, i)
		sum := sha256.Sum256(e.Body)
		if _, err := db.Exec(`INSERT INTO entries (key, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms)
			VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?)`, e.Key[:], e.Model, e.Body, sum[:], e.CostNanos, e.InputTok, e.OutputTok, e.Org, e.RequestID, int64(1e12+i)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCacheOfUnknownOriginIsAMiss: a format 1 file (no origins) opens,
// from several processes at once, upgraded to format 2 with every entry
// kept, of unknown origin; such an entry answers no run (it is reported
// as elsewhere), and the run's own answer is stored beside it.
func TestCacheOfUnknownOriginIsAMiss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	const n = 50
	writeFormat1(t, path, n)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			c, err := Open(path)
			if err == nil {
				c.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("opening a format 1 file from 4 goroutines: %v", err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(ctx)
	if err != nil || st.Format != Format || st.Entries != n || st.ByOrigin["unknown"] != n {
		t.Fatalf("stats of the upgraded file: %+v, %v", st, err)
	}
	origin := OriginOf(&url.URL{Scheme: "https", Host: "api.anthropic.com"})
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = entry(t, i+1).Key
	}
	hits, bad, other, err := c.Get(ctx, keys, origin)
	if err != nil || len(hits) != 0 || len(bad) != 0 || len(other) != n || other[0].Origin != OriginUnknown {
		t.Fatalf("Get of unknown-origin entries: %d hits, %d bad, %d elsewhere (%+v), %v", len(hits), len(bad), len(other), other, err)
	}
	if costs, err := c.Costs(ctx, keys, origin); err != nil || len(costs) != 0 {
		t.Fatalf("Costs of unknown-origin entries: %d, %v", len(costs), err)
	}
	e := entry(t, 1)
	e.Origin = origin
	if added, err := c.Put(ctx, []Entry{e}); err != nil || added != 1 {
		t.Fatalf("Put beside an unknown-origin entry: %d, %v", added, err)
	}
	hits, _, other, err = c.Get(ctx, keys, origin)
	if err != nil || len(hits) != 1 || hits[e.Key].Origin != origin || len(other) != n-1 {
		t.Fatalf("after the Put: %d hits, %d elsewhere, %v", len(hits), len(other), err)
	}
}

func TestOriginOf(t *testing.T) {
	for raw, want := range map[string]string{
		"https://api.anthropic.com":         "https://api.anthropic.com",
		"https://API.anthropic.com:443/v1/": "https://api.anthropic.com",
		"http://127.0.0.1:8080":             "http://127.0.0.1:8080",
		"http://localhost:80/x":             "http://localhost",
		"https://[::1]:443":                 "https://[::1]",
		"https://[::1]:8443":                "https://[::1]:8443",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := OriginOf(u); got != want {
			t.Errorf("OriginOf(%s) = %s, want %s", raw, got, want)
		}
	}
}
