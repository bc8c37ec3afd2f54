package ab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// legacyHarness is a request file and a legacy arm's output paths.
type legacyHarness struct {
	input, results, events string
}

func newLegacyHarness(t *testing.T, n int) legacyHarness {
	t.Helper()
	dir := t.TempDir()
	h := legacyHarness{input: filepath.Join(dir, "req.jsonl"), results: filepath.Join(dir, "results.jsonl"), events: filepath.Join(dir, "events.jsonl")}
	if err := writeJudge(h.input, n, 1); err != nil {
		t.Fatal(err)
	}
	return h
}

func startSim(t *testing.T, speed float64, mutate func(*sim.Config)) (*sim.Running, []org.Org) {
	t.Helper()
	r, cfg := simtest.Start(t, sim.PresetOrigin3Org, speed, mutate)
	return r, simOrgs(cfg, r.Server)
}

type resultLineJSON struct {
	CustomID string `json:"custom_id"`
	Result   struct {
		Type  string `json:"type"`
		Error struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		} `json:"error"`
	} `json:"result"`
	Dispatch struct {
		Org      string `json:"org"`
		Attempts int64  `json:"attempts"`
	} `json:"dispatch"`
}

func readResults(t *testing.T, path string) []resultLineJSON {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []resultLineJSON
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var r resultLineJSON
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("results line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestLegacyCompletesAndMatchesLedger(t *testing.T) {
	t.Parallel()
	srv, orgs := startSim(t, 50, nil)
	h := newLegacyHarness(t, 300)
	ev, err := rundir.OpenEventLog(h.events)
	if err != nil {
		t.Fatal(err)
	}
	leg, err := NewLegacy(LegacyConfig{Org: orgs[0], BaseURL: srv.URL, Speed: 50, Prices: cost.Default(), Events: ev, SampleEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := leg.Run(context.Background(), h.input, h.results, 300)
	ev.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s.Succeeded != 300 || s.Errored != 0 || s.Unfinished != 0 || !s.DataLoss.Passed || s.Attempts != 300 {
		t.Fatalf("summary %+v", s)
	}
	led := srv.Server.LedgerTotals()
	if led.CostNanos != s.Cost.TotalNanos || led.Requests != 300 {
		t.Fatalf("ledger %d nanos over %d requests, summary %d nanos", led.CostNanos, led.Requests, s.Cost.TotalNanos)
	}
	if led.ByOrg[orgs[0].Name].Requests != 300 {
		t.Fatalf("the legacy arm used orgs other than %s: %+v", orgs[0].Name, led.ByOrg)
	}
	if len(s.Lanes) != 1 || s.Lanes[0].Cap != LegacyConcurrency || s.Lanes[0].MaxInFlight > LegacyConcurrency || s.Lanes[0].Pool != string(anthropic.PoolSonnet4) {
		t.Fatalf("lanes %+v", s.Lanes)
	}
	if s.LatencyMs.P50 <= 0 || s.LatencyMs.P50 > s.LatencyMs.P95 || s.LatencyMs.P95 > s.LatencyMs.P99 {
		t.Fatalf("latency %+v", s.LatencyMs)
	}
	ids := map[string]bool{}
	for _, r := range readResults(t, h.results) {
		if r.Result.Type != "succeeded" || r.Dispatch.Org != orgs[0].Name || r.Dispatch.Attempts != 1 || ids[r.CustomID] {
			t.Fatalf("result %+v", r)
		}
		ids[r.CustomID] = true
	}
	// The events carry the dispatcher's sample shape.
	b, _ := os.ReadFile(h.events)
	for _, want := range []string{`"kind":"started"`, `"kind":"sample"`, `"completed_by_org":{"high_prio":`, `"lanes":[{"org":"high_prio","pool":"sonnet-4","cap":50,"limit":50`, `"kind":"completed"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("events lack %s", want)
		}
	}
}

// TestLegacyStormMarksRetryableTerminal pins the legacy behaviour the A/B
// exists to expose (docs/design.md §23): under a sustained 429 storm every item
// is tried six times and then written down as an error, which the
// data-loss check reports as retryable causes marked terminal — while no
// result is missing or duplicated.
func TestLegacyStormMarksRetryableTerminal(t *testing.T) {
	t.Parallel()
	srv, orgs := startSim(t, 50, func(c *sim.Config) {
		c.Faults = []sim.Fault{{Kind: sim.FaultRateLimitStorm, Org: "high_prio", RetryAfter: time.Second}}
	})
	h := newLegacyHarness(t, 100)
	leg, err := NewLegacy(LegacyConfig{Org: orgs[0], BaseURL: srv.URL, Speed: 50, Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := leg.Run(context.Background(), h.input, h.results, 100)
	if err != nil {
		t.Fatal(err)
	}
	if s.Succeeded != 0 || s.Errored != 100 || s.ErroredByType[anthropic.ErrRateLimit] != 100 {
		t.Fatalf("summary %+v", s)
	}
	if s.Attempts != 600 || s.RateLimited429 != 600 {
		t.Fatalf("attempts %d, 429s %d; want 6 attempts per item", s.Attempts, s.RateLimited429)
	}
	dl := s.DataLoss
	if dl.Passed || dl.RetryableMarkedTerminal != 100 || dl.Missing != 0 || dl.Duplicates != 0 {
		t.Fatalf("data loss %+v", dl)
	}
	for _, r := range readResults(t, h.results) {
		if r.Result.Type != "errored" || r.Result.Error.Error.Type != anthropic.ErrRateLimit || r.Dispatch.Attempts != 6 {
			t.Fatalf("result %+v", r)
		}
	}
	if led := srv.Server.LedgerTotals(); led.Requests != 0 || s.Cost.TotalNanos != 0 {
		t.Fatalf("429s were billed: %+v", led.Totals)
	}
}

// TestLegacyHoldsSlotWhileSleeping: the legacy client sleeps between
// retries inside its semaphore slot, so with concurrency 2 the first two
// items use up all their attempts before a third item is sent.
func TestLegacyHoldsSlotWhileSleeping(t *testing.T) {
	t.Parallel()
	itemRE := regexp.MustCompile(`Item (\d+)\.`)
	var mu sync.Mutex
	var order []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		buf.ReadFrom(r.Body)
		mu.Lock()
		order = append(order, string(itemRE.Find(buf.Bytes())))
		mu.Unlock()
		w.Header().Set("retry-after-ms", "5")
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`))
	}))
	defer ts.Close()
	h := newLegacyHarness(t, 4)
	leg, err := NewLegacy(LegacyConfig{Org: org.Org{Name: "solo", Key: org.NewKey("sk-test-solo")}, BaseURL: ts.URL, Concurrency: 2, Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := leg.Run(context.Background(), h.input, h.results, 4)
	if err != nil {
		t.Fatal(err)
	}
	if s.Errored != 4 || s.Attempts != 24 {
		t.Fatalf("summary %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	// At no point are more than two items between their first and their
	// last attempt.
	tries := map[string]int{}
	for i, it := range order {
		tries[it]++
		active := 0
		for _, n := range tries {
			if n < 6 {
				active++
			}
		}
		if active > 2 {
			t.Fatalf("after attempt %d, %d items are mid-retry (%v): slots were not held during retry sleeps", i+1, active, order[:i+1])
		}
	}
	if len(tries) != 4 {
		t.Fatalf("items seen: %v", tries)
	}
}

// TestLegacyRetriesTransientErrors: 500s and 529s are retried with the
// back-off, and the items then succeed.
func TestLegacyRetriesTransientErrors(t *testing.T) {
	t.Parallel()
	srv, orgs := startSim(t, 50, func(c *sim.Config) {
		c.Faults = []sim.Fault{
			{Kind: sim.FaultServerError, Org: "high_prio", Probability: 0.15},
			{Kind: sim.FaultOverloaded, Org: "high_prio", Probability: 0.15},
		}
	})
	h := newLegacyHarness(t, 200)
	leg, err := NewLegacy(LegacyConfig{Org: orgs[0], BaseURL: srv.URL, Speed: 50, Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := leg.Run(context.Background(), h.input, h.results, 200)
	if err != nil {
		t.Fatal(err)
	}
	if s.OtherRetries == 0 || s.Overloaded529 == 0 || s.Attempts <= 200 {
		t.Fatalf("no retries seen: %+v", s)
	}
	if s.Succeeded+s.Errored != 200 || s.DataLoss.Missing != 0 || s.DataLoss.Duplicates != 0 {
		t.Fatalf("summary %+v", s)
	}
	if led := srv.Server.LedgerTotals(); led.CostNanos != s.Cost.TotalNanos {
		t.Fatalf("ledger %d, usage %d", led.CostNanos, s.Cost.TotalNanos)
	}
}

// The legacy arm's result lines name their route as the dispatcher's do
// (docs/design.md §12; issue #19).
func TestLegacyResultLineCarriesItsRoute(t *testing.T) {
	line := resultLine("id_1", []byte(`{"type":"succeeded","message":{}}`), "a", 1, 10, 0, "req_1")
	var r struct {
		Dispatch struct {
			Route string `json:"route"`
		} `json:"dispatch"`
	}
	if err := json.Unmarshal(line, &r); err != nil || r.Dispatch.Route != "sync" {
		t.Fatalf("legacy result line: %v\n%s", err, line)
	}
}

// TestLegacyProgressWhileRunStarts: Progress, which the A/B's watcher
// calls every second from its own goroutine, may run while Run is starting
// (Run set the start time and the item count unguarded; the race detector
// caught it in TestKeysNeverLeak/ab on a loaded machine). Before Run it
// reports nothing done of nothing.
func TestLegacyProgressWhileRunStarts(t *testing.T) {
	t.Parallel()
	srv, orgs := startSim(t, 50, nil)
	h := newLegacyHarness(t, 20)
	leg, err := NewLegacy(LegacyConfig{Org: orgs[0], BaseURL: srv.URL, Speed: 50, Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if p := leg.Progress(); p.Total != 0 || p.Done != 0 || p.ElapsedS != 0 {
		t.Fatalf("before Run: %+v", p)
	}
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			leg.Progress()
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	s, err := leg.Run(context.Background(), h.input, h.results, 20)
	close(done)
	<-watched
	if err != nil || s.Succeeded != 20 {
		t.Fatalf("run: %v, %+v", err, s)
	}
	if p := leg.Progress(); p.Total != 20 || p.Done != 20 {
		t.Fatalf("after Run: %+v", p)
	}
}
