package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// resultLine is what the cache tests read of a result line.
type resultLine struct {
	CustomID string `json:"custom_id"`
	Result   struct {
		Type    string          `json:"type"`
		Message json.RawMessage `json:"message"`
	} `json:"result"`
	Dispatch struct {
		Org        string   `json:"org"`
		CostUSD    float64  `json:"cost_usd"`
		RequestID  string   `json:"request_id"`
		Cached     bool     `json:"cached"`
		ChargedUSD *float64 `json:"charged_usd"`
	} `json:"dispatch"`
}

func readResults(t testing.TB, dir string) map[string]resultLine {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.ResultsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]resultLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r resultLine
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[r.CustomID]; dup {
			t.Fatalf("%s has two result lines", r.CustomID)
		}
		out[r.CustomID] = r
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func openCache(t testing.TB, path string) *cache.Cache {
	t.Helper()
	c, err := cache.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// writeLines writes an input file of the given request lines.
func writeLines(t testing.TB, path string, lines []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func judgeLines(t testing.TB, n int, opts workload.GenOptions) []string {
	t.Helper()
	var b bytes.Buffer
	if err := workload.GenerateJudge(&b, n, 1, opts); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

// runInto runs h's simulator on input into a fresh run directory with c.
func (h *harness) runInto(input, name string, c *cache.Cache, mod func(*dispatch.Config)) *rundir.Summary {
	h.t.Helper()
	h.input, h.dir = input, filepath.Join(filepath.Dir(h.dir), name)
	res, err := h.run(context.Background(), func(cfg *dispatch.Config) {
		cfg.Cache = c
		if mod != nil {
			mod(cfg)
		}
	})
	if err != nil || !res.Complete || !res.Summary.DataLoss.Passed {
		h.t.Fatalf("run %s: %v; %+v", name, err, res)
	}
	return res.Summary
}

func TestCacheSecondRunSendsNothing(t *testing.T) {
	t.Parallel()
	const n = 600
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	first := h.runInto(h.input, "one", c, nil)
	firstDir := h.dir
	sent := h.sim.Server.LedgerTotals().Requests
	if first.Cache == nil || first.Cache.Hits != 0 || first.Cache.Misses != n {
		t.Fatalf("first run cache summary %+v", first.Cache)
	}
	second := h.runInto(h.input, "two", c, nil)
	if d := h.sim.Server.LedgerTotals().Requests - sent; d != 0 {
		t.Fatalf("second run sent %d requests, want 0", d)
	}
	if second.Cost.TotalNanos != 0 || second.Attempts != 0 || second.Succeeded != n {
		t.Fatalf("second run: cost %d nanos, %d attempts, %d succeeded", second.Cost.TotalNanos, second.Attempts, second.Succeeded)
	}
	if second.Cache.Hits != n || second.Cache.Misses != 0 || second.Cache.SavedUSD != first.Cost.Total {
		t.Fatalf("second run cache summary %+v; first cost %v", second.Cache, first.Cost.Total)
	}
	a, b := readResults(t, firstDir), readResults(t, h.dir)
	if len(a) != n || len(b) != n {
		t.Fatalf("%d and %d results, want %d", len(a), len(b), n)
	}
	for id, ra := range a {
		rb := b[id]
		if !bytes.Equal(ra.Result.Message, rb.Result.Message) {
			t.Fatalf("%s: response body differs:\n%s\n%s", id, ra.Result.Message, rb.Result.Message)
		}
		if ra.Dispatch.Cached || ra.Dispatch.ChargedUSD != nil {
			t.Fatalf("%s: first run's line claims a hit: %+v", id, ra.Dispatch)
		}
		if !rb.Dispatch.Cached || rb.Dispatch.ChargedUSD == nil || *rb.Dispatch.ChargedUSD != 0 ||
			rb.Dispatch.RequestID != ra.Dispatch.RequestID || rb.Dispatch.CostUSD != ra.Dispatch.CostUSD || rb.Dispatch.Org != ra.Dispatch.Org {
			t.Fatalf("%s: hit's dispatch %+v, original %+v", id, rb.Dispatch, ra.Dispatch)
		}
	}
}

// Changing what answers the request misses: one case per field.
func TestCacheMissesWhenTheRequestChanges(t *testing.T) {
	t.Parallel()
	const n = 30
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	dir := filepath.Dir(h.dir)
	base := judgeLines(t, n, workload.GenOptions{})
	writeLines(t, filepath.Join(dir, "base.jsonl"), base)
	h.runInto(filepath.Join(dir, "base.jsonl"), "base", c, nil)
	variants := map[string][]string{
		"model":      judgeLines(t, n, workload.GenOptions{Model: "claude-haiku-4-5-20251001"}),
		"max_tokens": judgeLines(t, n, workload.GenOptions{MaxTokens: 300}),
		"system":     nil,
	}
	for _, l := range base {
		variants["system"] = append(variants["system"], strings.Replace(l, "You are an impartial evaluator", "You are a strict evaluator", 1))
	}
	for field, lines := range variants {
		if lines[0] == base[0] {
			t.Fatalf("%s: the variant is the base", field)
		}
		in := filepath.Join(dir, field+".jsonl")
		writeLines(t, in, lines)
		sent := h.sim.Server.LedgerTotals().Requests
		s := h.runInto(in, field, c, nil)
		if d := h.sim.Server.LedgerTotals().Requests - sent; d != n || s.Cache.Hits != 0 {
			t.Errorf("changing %s: %d sent, %d hits; want %d sent, 0 hits", field, d, s.Cache.Hits, n)
		}
	}
}

func TestCacheDuplicatesInOneInputAreSentOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	var lines []string
	for i, l := range judgeLines(t, n, workload.GenOptions{}) {
		lines = append(lines, l, strings.Replace(l, fmt.Sprintf(`"phase6_%06d"`, i), fmt.Sprintf(`"copy_%06d"`, i), 1))
	}
	in := filepath.Join(filepath.Dir(h.dir), "dups.jsonl")
	writeLines(t, in, lines)
	ws, err := rundir.Validate(in, cost.Default())
	if err != nil {
		t.Fatal(err)
	}
	if ph, err := plan.ProjectCache(context.Background(), in, ws, c, cache.ModeReadWrite, false, mustOrigin(t, h.sim.URL)); err != nil || ph.Misses.N != n || ph.InputDuplicates != n {
		t.Fatalf("ProjectCache of the duplicates: %+v, %v", ph, err)
	}
	s := h.runInto(in, "dups", c, nil)
	if got := h.sim.Server.LedgerTotals().Requests; got != n {
		t.Fatalf("%d requests for %d distinct requests", got, n)
	}
	if s.Succeeded != 2*n || s.Cache.Hits != n || s.Cache.InputDuplicates != n {
		t.Fatalf("%d succeeded, cache %+v", s.Succeeded, s.Cache)
	}
	rs := readResults(t, h.dir)
	for i := range n {
		orig, cp := rs[fmt.Sprintf("phase6_%06d", i)], rs[fmt.Sprintf("copy_%06d", i)]
		if !bytes.Equal(orig.Result.Message, cp.Result.Message) || orig.Dispatch.Cached == cp.Dispatch.Cached {
			t.Fatalf("item %d: original %+v, copy %+v", i, orig.Dispatch, cp.Dispatch)
		}
	}
}

// A sampled request (no temperature: the API's default is 1.0) is sent
// every time unless the run opts in.
func TestCacheSampledOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	const n = 40
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	var lines []string
	for _, l := range judgeLines(t, n, workload.GenOptions{}) {
		lines = append(lines, strings.Replace(l, `"temperature":0,`, "", 1))
	}
	in := filepath.Join(filepath.Dir(h.dir), "sampled.jsonl")
	writeLines(t, in, lines)
	h.runInto(in, "s1", c, nil)
	h.runInto(in, "s2", c, nil)
	if got := h.sim.Server.LedgerTotals().Requests; got != 2*n {
		t.Fatalf("sampled requests: %d sent over two runs, want %d (never cached by default)", got, 2*n)
	}
	sampled := func(cfg *dispatch.Config) { cfg.CacheSampled = true }
	h.runInto(in, "s3", c, sampled)
	s := h.runInto(in, "s4", c, sampled)
	if got := h.sim.Server.LedgerTotals().Requests; got != 3*n || s.Cache.Hits != n {
		t.Fatalf("with CacheSampled: %d sent in all, %d hits; want %d and %d", got, s.Cache.Hits, 3*n, n)
	}
}

func TestCacheModes(t *testing.T) {
	t.Parallel()
	const n = 40
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	mode := func(m cache.Mode) func(*dispatch.Config) { return func(cfg *dispatch.Config) { cfg.CacheMode = m } }
	h.runInto(h.input, "read-empty", c, mode(cache.ModeRead)) // reads, stores nothing
	h.runInto(h.input, "write", c, mode(cache.ModeWrite))     // stores, reads nothing
	if got := h.sim.Server.LedgerTotals().Requests; got != 2*n {
		t.Fatalf("read on an empty cache then write: %d sent, want %d", got, 2*n)
	}
	if s := h.runInto(h.input, "off", c, mode(cache.ModeOff)); s.Cache != nil {
		t.Fatalf("mode off has a cache summary: %+v", s.Cache)
	}
	if s := h.runInto(h.input, "read", c, mode(cache.ModeRead)); s.Cache.Hits != n {
		t.Fatalf("read after write: %d hits", s.Cache.Hits)
	}
	if got := h.sim.Server.LedgerTotals().Requests; got != 3*n {
		t.Fatalf("%d sent in all, want %d", got, 3*n)
	}
}

// One damaged entry is a miss with a warning: that item is sent again, the
// rest are answered, and no result comes from the damaged body.
func TestCacheDamagedEntryIsSentAgain(t *testing.T) {
	t.Parallel()
	const n = 50
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	path := filepath.Join(t.TempDir(), "cache.db")
	c := openCache(t, path)
	h.runInto(h.input, "one", c, nil)
	sent := h.sim.Server.LedgerTotals().Requests
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE entries SET body = CAST('{"id":"msg_forged","type":"message"}' AS BLOB) WHERE id = 7`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := h.runInto(h.input, "two", c, nil)
	if d := h.sim.Server.LedgerTotals().Requests - sent; d != 1 || s.Cache.Hits != n-1 || s.Cache.Damaged != 1 {
		t.Fatalf("after damaging one entry: %d sent, cache %+v; want 1 sent, %d hits, 1 damaged", d, s.Cache, n-1)
	}
	for id, r := range readResults(t, h.dir) {
		if bytes.Contains(r.Result.Message, []byte("msg_forged")) {
			t.Fatalf("%s was answered from the damaged entry", id)
		}
	}
	ev, err := os.ReadFile(filepath.Join(h.dir, rundir.EventsFile))
	if err != nil || !bytes.Contains(ev, []byte("is damaged")) {
		t.Fatalf("no warning in the events: %v", err)
	}
}

// mustOrigin is the cache's origin of a run against baseURL.
func mustOrigin(t testing.TB, baseURL string) string {
	t.Helper()
	o, err := plan.CacheOrigin(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
