package cache

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchBody is about the size of a judge answer from the simulator (~800 B).
var benchBody = `{"model":"claude-sonnet-4-5-20250929","id":"msg_%024d","type":"message","role":"assistant","content":[{"type":"text","text":"` +
	strings.Repeat("The response is coherent and on topic. ", 11) +
	`"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":314,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":103,"service_tier":"standard"}}`

// benchOrigin is the origin the benchmarks' entries come from.
const benchOrigin = "https://api.anthropic.com"

func benchEntries(b *testing.B, n int) []Entry {
	es := make([]Entry, n)
	for i := range es {
		es[i] = Entry{Key: mustKey(b, fmt.Sprintf(`{"model":"m","max_tokens":256,"temperature":0,"messages":[{"role":"user","content":"Item %d."}]}`, i)),
			Model: "claude-sonnet-4-5-20250929", Body: []byte(fmt.Sprintf(benchBody, i)), CostNanos: 2487000,
			InputTok: 314, OutputTok: 103, Org: "high_prio", RequestID: fmt.Sprintf("req_%024d", i), Origin: benchOrigin}
	}
	return es
}

func filled(b *testing.B, n int) (*Cache, []Entry, string) {
	path := filepath.Join(b.TempDir(), "c.db")
	c, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	es := benchEntries(b, n)
	for i := 0; i < n; i += 512 {
		if _, err := c.Put(context.Background(), es[i:min(i+512, n)]); err != nil {
			b.Fatal(err)
		}
	}
	return c, es, path
}

// BenchmarkGetHits looks up batches of 1024 keys, all hits, as the feeder
// does; it reports hit lookups per second and the file's bytes per entry.
func BenchmarkGetHits(b *testing.B) {
	const n = 20000
	c, es, path := filled(b, n)
	if _, err := c.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]Key, len(es))
	for i, e := range es {
		keys[i] = e.Key
	}
	ctx := context.Background()
	b.ResetTimer()
	looked := 0
	for i := 0; b.Loop(); i++ {
		off := (i * 1024) % (n - 1024)
		hits, _, _, err := c.Get(ctx, keys[off:off+1024], benchOrigin)
		if err != nil || len(hits) != 1024 {
			b.Fatalf("%d hits, %v", len(hits), err)
		}
		looked += 1024
	}
	b.ReportMetric(float64(looked)/b.Elapsed().Seconds(), "hits/s")
	b.ReportMetric(float64(fi.Size())/n, "file-bytes/entry")
	b.ReportMetric(float64(len(es[0].Body)), "body-bytes/entry")
}

// BenchmarkPut stores batches of 512 entries, as the committer does.
func BenchmarkPut(b *testing.B) {
	c, err := Open(filepath.Join(b.TempDir(), "c.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	es := benchEntries(b, 512*64)
	ctx := context.Background()
	put := 0
	for i := 0; b.Loop(); i++ {
		off := (i % 64) * 512
		if i > 0 && i%64 == 0 {
			for j := range es { // fresh keys once they have all been stored
				es[j].Key[0]++
			}
		}
		if _, err := c.Put(ctx, es[off:off+512]); err != nil {
			b.Fatal(err)
		}
		put += 512
	}
	b.ReportMetric(float64(put)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkKeyOf is the canonical key of one judge request.
func BenchmarkKeyOf(b *testing.B) {
	p := []byte(`{"model":"claude-sonnet-4-5-20250929","max_tokens":256,"temperature":0,"system":[{"type":"text","text":"` + strings.Repeat("Grade the response. ", 36) + `","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"` + strings.Repeat("Question asked to the AI. ", 14) + `"}]}`)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := KeyOf(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpgradeFormat1 opens a format 1 file of 20,000 entries, which
// rebuilds its table as format 2; it reports entries upgraded per second.
func BenchmarkUpgradeFormat1(b *testing.B) {
	const n = 20000
	es := benchEntries(b, n)
	var upgraded int
	for b.Loop() {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "old.db")
		db, err := sql.Open("sqlite", path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := db.Exec(format1); err != nil {
			b.Fatal(err)
		}
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		for i, e := range es {
			sum := sha256.Sum256(e.Body)
			if _, err := tx.Exec(`INSERT INTO entries (key, model, body, body_sum, cost_nanos, input_tok, output_tok, cache_read, cache_write, org, request_id, created_ms)
				VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?)`, e.Key[:], e.Model, e.Body, sum[:], e.CostNanos, e.InputTok, e.OutputTok, e.Org, e.RequestID, int64(1e12+i)); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		db.Close()
		b.StartTimer()
		c, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
		upgraded += n
	}
	b.ReportMetric(float64(upgraded)/b.Elapsed().Seconds(), "entries/s")
}
