package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/syncbuf"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// harness is a simulator plus a request file and a run directory.
type harness struct {
	t     testing.TB
	sim   *sim.Running
	input string
	dir   string
	orgs  []org.Org
	speed float64
	// faults are switched on just before the run starts, timed from then,
	// so slow set-up (a race build) cannot let their window pass unseen.
	faults []sim.Fault
}

func newHarness(t testing.TB, preset string, speed float64, n int, mutate func(*sim.Config)) *harness {
	t.Helper()
	r, _ := simtest.Start(t, preset, speed, mutate)
	dir := t.TempDir()
	input := simtest.Judge(t, dir, n, 1)
	return &harness{t: t, sim: r, input: input, dir: filepath.Join(dir, "run"), orgs: r.Server.Orgs(), speed: speed}
}

func (h *harness) run(ctx context.Context, mod func(*dispatch.Config)) (*dispatch.Result, error) {
	h.t.Helper()
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: h.input, RunDir: h.dir, Prices: cost.Default()}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defer job.Close()
	cfg := dispatch.Config{Orgs: h.orgs, BaseURL: h.sim.URL, Speed: h.speed, Prices: cost.Default(), SampleEvery: -1}
	if mod != nil {
		mod(&cfg)
	}
	eng, err := dispatch.NewForJob(job, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.startFaults()
	return eng.Run(ctx)
}

func (h *harness) startFaults() {
	h.t.Helper()
	if len(h.faults) == 0 {
		return
	}
	fs := make([]sim.Fault, len(h.faults))
	for i, f := range h.faults {
		f.FromNow = true
		fs[i] = f
	}
	if err := h.sim.Server.SetFaults(fs...); err != nil {
		h.t.Fatal(err)
	}
}

// resultIDs reads results.jsonl and returns custom_id → count.
func (h *harness) resultIDs() map[string]int {
	h.t.Helper()
	f, err := os.Open(filepath.Join(h.dir, rundir.ResultsFile))
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	ids := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type string `json:"type"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			h.t.Fatalf("results line %q: %v", sc.Text(), err)
		}
		ids[v.CustomID]++
	}
	return ids
}

// requireEachOnce fails the test unless results.jsonl holds n distinct
// custom_ids, each on one line.
func (h *harness) requireEachOnce(n int) {
	h.t.Helper()
	ids := h.resultIDs()
	for id, k := range ids {
		if k != 1 {
			h.t.Fatalf("%s appears %d times", id, k)
		}
	}
	if len(ids) != n {
		h.t.Fatalf("%d distinct ids in results, want %d", len(ids), n)
	}
}

func TestRunCompletesAndMatchesLedger(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1500, nil)
	res, err := h.run(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	if !res.Complete || s.Succeeded != 1500 || s.Errored != 0 || !s.DataLoss.Passed {
		t.Fatalf("summary: %+v", s)
	}
	h.requireEachOnce(1500)
	led := h.sim.Server.LedgerTotals()
	if led.CostNanos != s.Cost.TotalNanos {
		t.Fatalf("ledger cost %d nanos, summary %d", led.CostNanos, s.Cost.TotalNanos)
	}
	if len(s.ByOrg) != 3 {
		t.Fatalf("work did not fan out to every org: %+v", s.ByOrg)
	}
	// A second run of the same command sends nothing.
	before := led.Requests
	res, err = h.run(context.Background(), nil)
	if err != nil || !res.Complete {
		t.Fatalf("resume of a complete run: %v", err)
	}
	if after := h.sim.Server.LedgerTotals().Requests; after != before {
		t.Fatalf("resume of a complete run sent %d requests", after-before)
	}
}

func TestInvalidInputLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(in, []byte(`{"custom_id":"a","params":{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`+"\n{not json\n"), 0o644)
	_, err := rundir.OpenJob(context.Background(), rundir.JobConfig{InputPath: in, RunDir: filepath.Join(dir, "run"), Prices: cost.Default()}, nil)
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("want an error naming line 2, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); !os.IsNotExist(err) {
		t.Fatal("run directory created for an invalid input")
	}
}

func costDefault() *cost.Table { return cost.Default() }

// TestTwoKeysOneOrg: two keys of one organisation add no capacity; the
// second org's lanes stop with a warning naming the first, and the run
// completes through the first.
func TestTwoKeysOneOrg(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 100, 400, func(c *sim.Config) {
		c.Orgs[0].Keys = append(c.Orgs[0].Keys, "sk-ant-sim-second-key-of-high-prio")
	})
	h.orgs = append(h.orgs, org.Org{Name: "alias", Key: org.NewKey("sk-ant-sim-second-key-of-high-prio")})
	res, err := h.run(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var aliasLane gate.LaneSnapshot
	for _, l := range res.Summary.Lanes {
		if l.Org == "alias" {
			aliasLane = l
		}
	}
	if !strings.Contains(aliasLane.Disabled, "same organisation as org high_prio") {
		t.Fatalf("alias lane: %+v", aliasLane)
	}
	if res.Summary.Succeeded != 400 || !res.Summary.DataLoss.Passed {
		t.Fatalf("summary %+v", res.Summary.DataLoss)
	}
	ev, _ := os.ReadFile(filepath.Join(h.dir, rundir.EventsFile))
	if !bytes.Contains(ev, []byte(`"kind":"warning"`)) || !bytes.Contains(ev, []byte("same organisation")) {
		t.Fatal("no warning event about the shared organisation")
	}
}

// closedURL returns the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

// TestUnreachableGivesUp: when no request can reach the API (nothing
// listens at the base URL), the run retries, warns, and after GiveUpAfter
// stops incomplete with every item still pending; the same run pointed at
// the API then completes every item exactly once.
func TestUnreachableGivesUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 50, 200, nil)
	down := closedURL(t)
	var logBuf bytes.Buffer
	start := time.Now()
	// Bounded, so that a run that never gives up fails here instead of
	// hanging until the test binary's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.run(ctx, func(c *dispatch.Config) {
		c.BaseURL = down
		c.GiveUpAfter = 500 * time.Millisecond
		c.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	})
	if !errors.Is(err, dispatch.ErrIncomplete) {
		t.Fatalf("run against a closed port: err %v, want ErrIncomplete", err)
	}
	s := res.Summary
	if !strings.Contains(res.StopReason, "no request reached "+down+" for 500ms") || !strings.Contains(res.StopReason, "connect") {
		t.Fatalf("stop reason %q", res.StopReason)
	}
	// No key's organisation is known without an answer, so each lane
	// sends one request at a time (upstream.Orgs): it keeps retrying, but
	// not with every item at once. More attempts than the three lanes is a
	// retry; how many fit in the 500 ms depends on the machine's load (4
	// on a loaded one, where 10 were asked before).
	if s.Succeeded != 0 || s.Errored != 0 || s.Unfinished != 200 || s.Attempts <= 3 || s.PossibleDuplicateBilling != 0 {
		t.Fatalf("after giving up: succeeded %d errored %d unfinished %d attempts %d possible duplicates %d",
			s.Succeeded, s.Errored, s.Unfinished, s.Attempts, s.PossibleDuplicateBilling)
	}
	t.Logf("gave up after %s and %d attempts: %s", time.Since(start).Round(time.Millisecond), s.Attempts, res.StopReason)
	if n := strings.Count(logBuf.String(), "cannot reach the API"); n != 1 {
		t.Fatalf("%d \"cannot reach the API\" warnings, want 1:\n%s", n, logBuf.String())
	}

	res, err = h.run(context.Background(), func(c *dispatch.Config) { c.GiveUpAfter = 500 * time.Millisecond })
	if err != nil || !res.Complete || res.Summary.Succeeded != 200 {
		t.Fatalf("resume against the API: %v %+v", err, res.Summary)
	}
	h.requireEachOnce(200)
}

// TestWaitsForAPIThatComesBack: with GiveUpAfter negative a run waits out
// an API that is not there yet, and once it answers completes every item
// exactly once, the same as a run that never saw the outage.
func TestWaitsForAPIThatComesBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 50, 200, nil)
	down := closedURL(t)
	var logBuf syncbuf.Buffer
	// The API comes back once the run has said it cannot reach it (and
	// 300 ms more of outage), however slowly this machine starts the run.
	go func() {
		for !strings.Contains(logBuf.String(), "cannot reach the API") {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		r, err := sim.StartOn(strings.TrimPrefix(down, "http://"), h.sim.Server.Config())
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { r.Close() })
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := h.run(ctx, func(c *dispatch.Config) {
		c.BaseURL = down
		c.GiveUpAfter = -1
		c.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	})
	if err != nil || !res.Complete || res.Summary.Succeeded != 200 {
		t.Fatalf("run through an outage: %v %+v", err, res.Summary)
	}
	if !strings.Contains(logBuf.String(), "cannot reach the API") || !strings.Contains(logBuf.String(), "the API answers again") {
		t.Fatalf("log of a run through an outage:\n%s", logBuf.String())
	}
	h.requireEachOnce(200)
}
