package cache

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const base = `{"model":"claude-sonnet-4-5-20250929","max_tokens":256,"temperature":0,"system":"Be fair.","messages":[{"role":"user","content":"Item 1."}]}`

func mustKey(t testing.TB, p string) Key {
	t.Helper()
	k, err := KeyOf([]byte(p))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyIgnoresOrderSpaceAndMetadata(t *testing.T) {
	t.Parallel()
	k := mustKey(t, base)
	for _, same := range []string{
		`{ "messages" : [ {"content":"Item 1.","role":"user"} ], "system":"Be fair.", "temperature":0.0, "max_tokens":256, "model":"claude-sonnet-4-5-20250929" }`,
		`{"model":"claude-sonnet-4-5-20250929","max_tokens":2.56e2,"temperature":0,"system":"Be fair.","messages":[{"role":"user","content":"Item 1."}],"metadata":{"user_id":"u1"}}`,
	} {
		if got := mustKey(t, same); got != k {
			t.Errorf("%s: key %s, want %s", same, got, k)
		}
	}
}

// A test per field that changes the answer: each must miss.
func TestKeyChangesWithEveryAnsweringField(t *testing.T) {
	t.Parallel()
	k := mustKey(t, base)
	for name, p := range map[string]string{
		"model":       strings.Replace(base, "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", 1),
		"max_tokens":  strings.Replace(base, `"max_tokens":256`, `"max_tokens":257`, 1),
		"system":      strings.Replace(base, "Be fair.", "Be harsh.", 1),
		"temperature": strings.Replace(base, `"temperature":0`, `"temperature":0.5`, 1),
		"messages":    strings.Replace(base, "Item 1.", "Item 2.", 1),
		"top_k":       strings.Replace(base, `"temperature":0`, `"temperature":0,"top_k":5`, 1),
		"stop":        strings.Replace(base, `"temperature":0`, `"temperature":0,"stop_sequences":["x"]`, 1),
		"tools":       strings.Replace(base, `"temperature":0`, `"temperature":0,"tools":[{"name":"f","input_schema":{"type":"object"}}]`, 1),
		"role order":  strings.Replace(base, `[{"role":"user","content":"Item 1."}]`, `[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]`, 1),
	} {
		if p == base {
			t.Fatalf("%s: replacement did nothing", name)
		}
		if mustKey(t, p) == k {
			t.Errorf("changing %s kept the key", name)
		}
	}
}

func TestSampled(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]bool{
		`{"temperature":0}`:   false,
		`{"temperature":0.0}`: false,
		`{"temperature":0.7}`: true,
		`{"model":"m"}`:       true, // the API's default is 1.0
		`not json`:            true,
	} {
		if got := Sampled([]byte(p)); got != want {
			t.Errorf("Sampled(%s) = %v, want %v", p, got, want)
		}
	}
}

func entry(t testing.TB, i int) Entry {
	p := strings.Replace(base, "Item 1.", fmt.Sprintf("Item %d.", i), 1)
	return Entry{Key: mustKey(t, p), Model: "claude-sonnet-4-5-20250929",
		Body:      []byte(fmt.Sprintf(`{"id":"msg_%d","type":"message","role":"assistant","content":[{"type":"text","text":"ok %d"}],"usage":{"input_tokens":10,"output_tokens":5}}`, i, i)),
		CostNanos: 105000, InputTok: 10, OutputTok: 5, Org: "a", RequestID: fmt.Sprintf("req_%d", i)}
}

func TestPutGetRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	e1, e2 := entry(t, 1), entry(t, 2)
	if n, err := c.Put(ctx, []Entry{e1, e2}); err != nil || n != 2 {
		t.Fatalf("Put = %d, %v", n, err)
	}
	// The first writer of a key wins.
	dup := e1
	dup.Body = []byte(`{"other":true}`)
	if n, err := c.Put(ctx, []Entry{dup}); err != nil || n != 0 {
		t.Fatalf("second Put of a key = %d, %v; want 0, nil", n, err)
	}
	c.Close()
	if c, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	miss := entry(t, 3).Key
	hits, bad, _, err := c.Get(ctx, []Key{e1.Key, e2.Key, miss}, "")
	if err != nil || len(bad) != 0 || len(hits) != 2 {
		t.Fatalf("Get = %d hits, %v bad, %v", len(hits), bad, err)
	}
	if got := hits[e1.Key]; !bytes.Equal(got.Body, e1.Body) || got.RequestID != "req_1" || got.CostNanos != 105000 || got.Org != "a" {
		t.Errorf("hit = %+v", got)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.Entries != 2 || st.ByModel["claude-sonnet-4-5-20250929"] != 2 {
		t.Errorf("Stats = %+v, %v", st, err)
	}
	var buf bytes.Buffer
	if n, err := c.Export(ctx, &buf); err != nil || n != 2 || strings.Count(buf.String(), "\n") != 2 || !strings.Contains(buf.String(), `"response":{"id":"msg_1"`) {
		t.Errorf("Export = %d, %v:\n%s", n, err, buf.String())
	}
	if n, err := c.Prune(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
		t.Errorf("Prune = %d, %v", n, err)
	}
}

func TestDamagedEntryIsAMiss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e1, e2 := entry(t, 1), entry(t, 2)
	if _, err := c.Put(ctx, []Entry{e1, e2}); err != nil {
		t.Fatal(err)
	}
	// Flip the body of one entry behind the checksum's back.
	if _, err := c.db.Exec(`UPDATE entries SET body = CAST('{"id":"msg_x"}' AS BLOB) WHERE key = ?`, e1.Key[:]); err != nil {
		t.Fatal(err)
	}
	hits, bad, _, err := c.Get(ctx, []Key{e1.Key, e2.Key}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hits[e1.Key]; ok || len(bad) != 1 || bad[0].Key != e1.Key {
		t.Errorf("damaged entry: hits %v, bad %v; want a miss reported as bad", len(hits), bad)
	}
	if _, ok := hits[e2.Key]; !ok {
		t.Error("the sound entry was lost")
	}
}

func TestOpenRefusesBadFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	c, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	var many []Entry
	for i := range 2000 {
		many = append(many, entry(t, i))
	}
	if _, err := c.Put(context.Background(), many); err != nil {
		t.Fatal(err)
	}
	if _, err := c.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	c.Close()
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}

	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newer := filepath.Join(dir, "newer.db")
	if c, err := Open(newer); err != nil {
		t.Fatal(err)
	} else {
		c.db.Exec(`PRAGMA user_version = 99`)
		c.Close()
	}
	other := filepath.Join(dir, "other.db")
	if db, err := sql.Open("sqlite", other); err != nil {
		t.Fatal(err)
	} else {
		db.Exec(`CREATE TABLE t(x)`)
		db.Close()
	}
	damaged := bytes.Clone(raw)
	for i := 4096 * 3; i < 4096*5 && i < len(damaged); i++ {
		damaged[i] = 0xA5
	}
	for name, tc := range map[string]struct {
		path string
		want error
	}{
		"newer format": {newer, ErrNewerFormat},
		"other db":     {other, ErrNotCache},
		"not sqlite":   {write("text.db", []byte(strings.Repeat("hello\n", 100))), ErrNotCache},
		"truncated":    {write("trunc.db", raw[:len(raw)/2]), ErrCorrupt},
		"tiny":         {write("tiny.db", raw[:40]), ErrCorrupt},
		"damaged page": {write("damaged.db", damaged), ErrCorrupt},
	} {
		c, err := Open(tc.path)
		if err == nil {
			c.Close()
			t.Errorf("%s: Open succeeded", name)
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("%s: err = %v; want %v naming the file", name, err, tc.want)
		}
	}
}

// Two writers filling one file at once: no lost or duplicated entry, no error.
func TestTwoWritersOneFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	const n = 3000
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() {
			c, err := Open(path)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			// Each writer writes every entry (overlapping), in batches, in its own order.
			for start := 0; start < n; start += 100 {
				var b []Entry
				for i := start; i < start+100; i++ {
					j := i
					if w == 1 {
						j = n - 1 - i
					}
					b = append(b, entry(t, j))
				}
				if _, err := c.Put(ctx, b); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(ctx)
	if err != nil || st.Entries != n {
		t.Fatalf("entries = %d (%v), want %d", st.Entries, err, n)
	}
}

// Campaign seed 245: several processes given one new cache file open it at
// once; each must see either no cache or a whole one, and join it. Before,
// an opener could read the header of the file before another committed its
// schema and its table count after (application id 0 and tables present:
// "not an apidispatch cache"), or find an empty file mid-creation.
func TestOpenOneNewFileAtOnce(t *testing.T) {
	t.Parallel()
	const tries, openers = 150, 6
	dir := t.TempDir()
	for try := range tries {
		path := filepath.Join(dir, fmt.Sprintf("c%d.db", try))
		if try%2 == 1 {
			// An empty file (left by an older apidispatch, or touched):
			// initialised in place.
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		start := make(chan struct{})
		errs := make(chan error, openers)
		var wg sync.WaitGroup
		for range openers {
			wg.Go(func() {
				<-start
				c, err := Open(path)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				// The file is usable: a write and its read back.
				e := entry(t, try)
				if _, err := c.Put(context.Background(), []Entry{e}); err != nil {
					errs <- err
					return
				}
				hits, _, _, err := c.Get(context.Background(), []Key{e.Key}, e.Origin)
				if err != nil {
					errs <- err
				} else if _, ok := hits[e.Key]; !ok {
					errs <- fmt.Errorf("entry %d not found after its Put", try)
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("try %d of %d, %d openers of one new file: %v", try+1, tries, openers, err)
		}
		// Each opener that lost the race removed its temporary file.
		if left, _ := filepath.Glob(path + ".new-*"); len(left) > 0 {
			t.Fatalf("try %d: temporary files left: %v", try+1, left)
		}
	}
}
