package ab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
)

// smallConfig is a fast A/B on the embedded simulator: n items per arm at
// K=50, with a small storm self-test.
func smallConfig(t *testing.T, n int) (Config, *[]*sim.Running) {
	t.Helper()
	var sims []*sim.Running
	return Config{
		N: n, Sim: true, Speed: 50, Dir: filepath.Join(t.TempDir(), "ab"), ProgressEvery: -1,
		StormTest: StormTest{N: 300, Speed: 50},
		OnSim:     func(r *sim.Running) { sims = append(sims, r) },
	}, &sims
}

func readEvents(t *testing.T, path string) []rundir.Event {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []rundir.Event
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var e rundir.Event
		if err := json.Unmarshal(l, &e); err != nil {
			t.Fatalf("event %q: %v", l, err)
		}
		out = append(out, e)
	}
	return out
}

func kinds(evs []rundir.Event) map[string]int {
	m := map[string]int{}
	for _, e := range evs {
		m[e.Kind]++
	}
	return m
}

// lookup walks a decoded JSON object along a dotted path.
func lookup(v any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// resultKeys are the keys docs/design.md §9 and the issue ask of ab.json.
var resultKeys = []string{
	"speedup", "target_met", "simulated", "speed_factor", "projected_cost_usd.per_arm", "projected_cost_usd.total",
	"config.orgs", "config.model", "config.n", "config.simulated", "config.speed_factor", "config.order",
	"projected_vs_actual.projected_total_usd", "projected_vs_actual.actual_total_usd", "storm_self_test.passed", "rounds",
}

var armKeys = []string{
	"wall_s", "api_equivalent_wall_s", "cost_usd", "ledger_cost_usd", "requests_per_min", "succeeded", "errored",
	"errored_by_type", "unfinished", "rate_limited_429", "overloaded_529", "other_retries", "attempts",
	"tokens.input", "tokens.output", "latency_ms.p50", "latency_ms.p95", "latency_ms.p99", "by_org",
	"data_loss.inputs", "data_loss.outcomes", "data_loss.missing", "data_loss.duplicates",
	"data_loss.retryable_marked_terminal", "data_loss.passed",
}

func TestRunSimEndToEnd(t *testing.T) {
	t.Parallel()
	cfg, sims := smallConfig(t, 400)
	cfg.StatusFile = filepath.Join(t.TempDir(), "status.md")
	os.WriteFile(cfg.StatusFile, []byte("# Status\n\nkeep this line\n"), 0o644)
	cfg.Out = filepath.Join(t.TempDir(), "phase6_full.json")
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, d := res.Arms.Baseline, res.Arms.Dispatcher
	if !res.Complete || a == nil || d == nil || a.Succeeded != 400 || d.Succeeded != 400 || !a.DataLoss.Passed || !d.DataLoss.Passed {
		t.Fatalf("result %+v", res)
	}
	for _, arm := range []*ArmResult{a, d} {
		if arm.CostMatchesLedger == nil || !*arm.CostMatchesLedger || *arm.LedgerCostNanos != arm.CostNanos || *arm.LedgerRequests != 400 {
			t.Fatalf("%s: cost %d vs ledger %v", arm.Arm, arm.CostNanos, arm.LedgerCostNanos)
		}
	}
	if len(d.ByOrg) != 3 || len(a.ByOrg) != 1 || a.ByOrg["high_prio"].Succeeded != 400 {
		t.Fatalf("per-org split: baseline %+v dispatcher %+v", a.ByOrg, d.ByOrg)
	}
	if !res.Simulated || res.SpeedFactor != 50 || !strings.Contains(res.Headline, "SIMULATION") {
		t.Fatalf("not marked as a simulation: %+v", res.Headline)
	}
	if want := round3(a.WallS / d.WallS); res.Speedup != want {
		t.Fatalf("speedup %v, want wall A / wall B = %v", res.Speedup, want)
	}

	// Every key of the result JSON, in both copies.
	for _, path := range []string{filepath.Join(cfg.Dir, ResultFile), cfg.Out} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for _, k := range resultKeys {
			if _, ok := lookup(doc, k); !ok {
				t.Errorf("%s lacks %s", path, k)
			}
		}
		for _, arm := range []string{"baseline", "dispatcher"} {
			for _, k := range armKeys {
				if _, ok := lookup(doc, "arms."+arm+"."+k); !ok {
					t.Errorf("%s lacks arms.%s.%s", path, arm, k)
				}
			}
		}
	}
	// The arms' run directories and summaries.
	for _, arm := range []string{ArmBaseline, ArmDispatcher} {
		for _, f := range []string{rundir.ResultsFile, rundir.EventsFile, rundir.SummaryFile, ArmFile} {
			if _, err := os.Stat(filepath.Join(cfg.Dir, arm, f)); err != nil {
				t.Errorf("%s/%s: %v", arm, f, err)
			}
		}
	}
	// Events: started, progress, completed.
	k := kinds(readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile)))
	if k[rundir.EventStarted] != 1 || k[rundir.EventProgress] < 4 || k[rundir.EventCompleted] != 1 {
		t.Fatalf("events %v", k)
	}
	// The status section, with the rest of the file kept.
	st, _ := os.ReadFile(cfg.StatusFile)
	if !bytes.HasPrefix(st, []byte("# Status\n\nkeep this line\n\n"+StatusStart)) || !bytes.Contains(st, []byte("speed-up (wall A ÷ wall B)")) || !bytes.Contains(st, []byte("SIMULATION")) {
		t.Fatalf("status file:\n%s", st)
	}
	// No key text anywhere in the outputs.
	var secrets []string
	for _, s := range *sims {
		for _, ks := range s.Server.Keys() {
			secrets = append(secrets, ks...)
		}
	}
	if len(secrets) != 3 {
		t.Fatalf("keys %d", len(secrets))
	}
	grepTree(t, cfg.Dir, secrets)
	grepTree(t, filepath.Dir(cfg.StatusFile), secrets)
	grepTree(t, filepath.Dir(cfg.Out), secrets)

	// A rerun on the same directory reuses both complete arms and sends nothing.
	before := len(*sims)
	res2, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(*sims) != before+1 {
		t.Fatal("no simulator on the rerun")
	}
	if n := (*sims)[before].Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("rerun of a complete A/B sent %d requests", n)
	}
	if !res2.Arms.Baseline.Reused || !res2.Arms.Dispatcher.Reused || res2.Speedup != res.Speedup {
		t.Fatalf("rerun: %+v", res2.Rounds)
	}
	// An interrupted legacy arm (no arm.json, a partial results file) is run
	// again from the start; the complete dispatcher arm is kept.
	os.Remove(filepath.Join(cfg.Dir, ArmBaseline, ArmFile))
	os.WriteFile(filepath.Join(cfg.Dir, ArmBaseline, rundir.ResultsFile), []byte(`{"custom_id":"phase6_000000"}`+"\n"), 0o644)
	res3, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if b := res3.Arms.Baseline; b.Reused || b.Succeeded != 400 || !b.DataLoss.Passed || b.DataLoss.Outcomes != 400 || !res3.Arms.Dispatcher.Reused {
		t.Fatalf("after an interrupted baseline: %+v / %+v", b, res3.Arms.Dispatcher)
	}
	if n := (*sims)[len(*sims)-1].Server.LedgerTotals().Requests; n != 400 {
		t.Fatalf("the rerun of the baseline sent %d requests, want 400", n)
	}
	st2, _ := os.ReadFile(cfg.StatusFile)
	if bytes.Count(st2, []byte(StatusStart)) != 1 || !bytes.HasPrefix(st2, []byte("# Status\n\nkeep this line\n")) {
		t.Fatalf("status file after rerun:\n%s", st2)
	}
}

// grepTree fails if any file under dir contains one of secrets.
func grepTree(t *testing.T, dir string, secrets []string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Error(err)
			return nil
		}
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s contains a key", p)
			}
		}
		return nil
	})
}

func TestRunPausedSendsNothing(t *testing.T) {
	t.Parallel()
	cfg, sims := smallConfig(t, 400)
	cfg.Budget = cost.NanosPerUSD / 10 // $0.10 against a projected ~$1.90
	res, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrPaused) || res != nil {
		t.Fatalf("err %v, result %v", err, res)
	}
	if n := (*sims)[0].Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("a paused A/B sent %d requests", n)
	}
	evs := readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile))
	if last := evs[len(evs)-1]; last.Kind != rundir.EventBlocked || !strings.Contains(last.Note, "paused") {
		t.Fatalf("last event %+v", last)
	}
	for _, p := range []string{ResultFile, SelfTestDir, ArmBaseline, ArmDispatcher} {
		if _, err := os.Stat(filepath.Join(cfg.Dir, p)); err == nil {
			t.Errorf("%s exists after a pause", p)
		}
	}
}

func TestRunConfirmRequired(t *testing.T) {
	t.Parallel()
	// 25,000 items per arm are 50,000 requests in all: --confirm is required.
	cfg, sims := smallConfig(t, 25000)
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrConfirmRequired) || !errors.Is(err, ErrRefused) {
		t.Fatalf("err %v", err)
	}
	if n := (*sims)[0].Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("a refused A/B sent %d requests", n)
	}
	if k := kinds(readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile))); k[rundir.EventBlocked] != 1 {
		t.Fatalf("events %v", k)
	}
}

func TestRunTooFewOrgs(t *testing.T) {
	t.Parallel()
	cfg, _ := smallConfig(t, 100)
	cfg.SimConfig = func(c *sim.Config) { c.Orgs = c.Orgs[:1] }
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrTooFewOrgs) || !errors.Is(err, ErrRefused) {
		t.Fatalf("err %v", err)
	}
	if k := kinds(readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile))); k[rundir.EventBlocked] != 1 {
		t.Fatalf("events %v", k)
	}
}

// TestRunStormTestFailureBlocks: a self-test whose items cannot complete
// (every key revoked), or a broken dispatcher configuration, blocks the
// A/B before either arm sends anything.
func TestRunStormTestFailureBlocks(t *testing.T) {
	t.Parallel()
	for name, st := range map[string]StormTest{
		"items cannot complete": {N: 200, Speed: 50, Sim: func(c *sim.Config) {
			c.Faults = append(c.Faults, sim.Fault{Kind: sim.FaultKeyRevoked})
		}},
		"broken dispatcher": {N: 200, Speed: 50, Dispatch: func(c *dispatch.Config) { c.Deadline = time.Now() }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, sims := smallConfig(t, 200)
			cfg.StormTest = st
			res, err := Run(context.Background(), cfg)
			if !errors.Is(err, ErrStormTest) || !errors.Is(err, ErrRefused) || res != nil {
				t.Fatalf("err %v", err)
			}
			if n := (*sims)[0].Server.LedgerTotals().Requests; n != 0 {
				t.Fatalf("arms sent %d requests after a failed self-test", n)
			}
			evs := readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile))
			last := evs[len(evs)-1]
			if last.Kind != rundir.EventBlocked || !strings.Contains(last.Note, "storm self-test failed") {
				t.Fatalf("last event %+v", last)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, ArmBaseline)); err == nil {
				t.Error("the baseline arm ran")
			}
		})
	}
}

func TestRunOrderBA(t *testing.T) {
	t.Parallel()
	cfg, _ := smallConfig(t, 200)
	cfg.Order = OrderBA
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 1 || res.Rounds[0].Order != OrderBA || !res.Complete {
		t.Fatalf("rounds %+v", res.Rounds)
	}
	evs := readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile))
	var started []string
	for _, e := range evs {
		if strings.HasSuffix(e.Note, "arm (round 1) started") {
			started = append(started, strings.Fields(e.Note)[0])
		}
	}
	if strings.Join(started, ",") != "dispatcher,baseline" {
		t.Fatalf("arms started in order %v", started)
	}
}

// TestRunBatchArm: with the batch arm, the A/B also sends every item as
// Message Batches over every org; it completes each custom_id once, costs
// what the simulator billed, and exactly half the dispatcher's cost for
// the same items (the simulator bills both arms the same tokens).
func TestRunBatchArm(t *testing.T) {
	t.Parallel()
	const n = 600
	cfg, sims := smallConfig(t, n)
	cfg.Speed = 400 // the batch model's 4 min queue wait is 0.6 s here
	cfg.Arms = []string{"legacy", ArmDispatcher, ArmBatch}
	cfg.StatusFile = filepath.Join(t.TempDir(), "status.md")
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, c := res.Arms.Dispatcher, res.Arms.Batch
	if !res.Complete || c == nil || !c.Complete || c.Succeeded != n || c.Unfinished != 0 || !c.DataLoss.Passed || c.Dir != ArmBatch {
		t.Fatalf("batch arm %+v", c)
	}
	if c.CostMatchesLedger == nil || !*c.CostMatchesLedger || *c.LedgerCostNanos != c.CostNanos || *c.LedgerRequests != n || *c.LedgerDuplicates != 0 {
		t.Fatalf("batch arm cost %d nanos, ledger %v (%v requests)", c.CostNanos, c.LedgerCostNanos, c.LedgerRequests)
	}
	if d.Succeeded != n || d.Errored != 0 || c.CostNanos == 0 || 2*c.CostNanos != d.CostNanos {
		t.Fatalf("batch arm %d nanos, dispatcher %d nanos (%d succeeded): want exactly half", c.CostNanos, d.CostNanos, d.Succeeded)
	}
	if res.BatchCostRatio != 0.5 || res.Rounds[0].BatchCostRatio != 0.5 || res.Rounds[0].Batch != c {
		t.Fatalf("batch_cost_ratio %v (round %v)", res.BatchCostRatio, res.Rounds[0].BatchCostRatio)
	}
	if want := round3(c.WallS / d.WallS); res.BatchVsDispatcherWall != want {
		t.Fatalf("batch_vs_dispatcher_wall %v, want %v", res.BatchVsDispatcherWall, want)
	}
	if len(c.ByOrg) != 3 {
		t.Fatalf("batch arm over orgs %v, want all 3", c.ByOrg)
	}
	// Every custom_id once in the batch arm's results, and only batch-tier
	// billing in its ledger window.
	chk, err := soak.CheckResults(filepath.Join(cfg.Dir, RequestsFile), filepath.Join(cfg.Dir, ArmBatch, rundir.ResultsFile))
	if err != nil || chk.Lost() {
		t.Fatalf("batch arm results: %+v, %v", chk, err)
	}
	var batchTier int
	for _, e := range (*sims)[0].Server.Ledger() {
		if e.ServiceTier == "batch" {
			batchTier++
		}
	}
	if batchTier != n {
		t.Fatalf("the simulator billed %d batch requests, want %d", batchTier, n)
	}
	// The projection counts the batch arm at batch prices.
	pc := res.ProjectedCostUSD
	if pc.Arms != 3 || pc.BatchArmNanos <= 0 || pc.TotalNanos != 2*pc.PerArmNanos+pc.BatchArmNanos || !strings.Contains(pc.Arithmetic, "batch arm") {
		t.Fatalf("projection %+v", pc)
	}
	// ab.json carries arms.batch and the ratios.
	b, _ := os.ReadFile(filepath.Join(cfg.Dir, ResultFile))
	var doc any
	json.Unmarshal(b, &doc)
	for _, k := range append([]string{"batch_cost_ratio", "batch_vs_dispatcher_wall", "rounds"}, prefixed("arms.batch.", armKeys)...) {
		if _, ok := lookup(doc, k); !ok {
			t.Errorf("ab.json lacks %s", k)
		}
	}
	st, _ := os.ReadFile(cfg.StatusFile)
	if !bytes.Contains(st, []byte("| batch (Message Batches, 3 orgs) |")) || !strings.Contains(res.Headline, "Batch arm") {
		t.Fatalf("status:\n%s\nheadline %s", st, res.Headline)
	}
	t.Logf("%s\n%s", res.Headline, HeadlineTable(res))

	// A rerun reuses the complete batch arm and sends nothing.
	res2, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := (*sims)[len(*sims)-1].Server.LedgerTotals().Requests; n != 0 || !res2.Arms.Batch.Reused {
		t.Fatalf("rerun sent %d requests; batch arm reused %v", n, res2.Arms.Batch.Reused)
	}
}

func prefixed(p string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = p + k
	}
	return out
}

func TestParseArms(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"legacy,dispatcher":          "baseline,dispatcher",
		"dispatcher, Baseline":       "baseline,dispatcher",
		"legacy,dispatcher,batch":    "baseline,dispatcher,batch",
		"batch,dispatcher,legacy":    "baseline,dispatcher,batch",
		"legacy,batch":               "",
		"dispatcher,batch":           "",
		"legacy,dispatcher,legacy":   "",
		"legacy,baseline,dispatcher": "",
		"legacy,dispatcher,auto":     "",
		"legacy,,dispatcher":         "",
	} {
		got, err := ParseArms(in)
		if want == "" {
			if !errors.Is(err, ErrArms) || !errors.Is(err, ErrConfig) {
				t.Errorf("ParseArms(%q) = %v, %v; want an ErrArms error", in, got, err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("ParseArms(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
}

// TestArmDataLossBatchIsABug: a failed data-loss check of the batch arm is
// a bug, as the dispatcher's is (exit 5), even for retryable causes the
// legacy arm is allowed to mark terminal.
func TestArmDataLossBatchIsABug(t *testing.T) {
	t.Parallel()
	bad := rundir.DataLoss{Passed: false, RetryableMarkedTerminal: 1}
	for arm, want := range map[string]bool{ArmBaseline: false, ArmDispatcher: true, ArmBatch: true} {
		if got := armDataLoss(&ArmResult{Arm: arm, Round: 1, DataLoss: bad}) != ""; got != want {
			t.Errorf("%s arm with %+v: a bug %v, want %v", arm, bad, got, want)
		}
	}
	if p := armDataLoss(&ArmResult{Arm: ArmBatch, Round: 2, DataLoss: rundir.DataLoss{Missing: 3}}); !strings.HasPrefix(p, "batch arm (round 2)") {
		t.Errorf("problem %q does not name the batch arm", p)
	}
}

// cancelOnceBatchesOpen cancels once the simulator the A/B starts (passed
// through OnSim) has a Message Batch created: the batch arm's batches are
// then open, whatever the time the arms before it took on a loaded machine.
func cancelOnceBatchesOpen(ctx context.Context, cfg *Config, cancel context.CancelFunc) {
	started := make(chan *sim.Running, 1)
	onSim := cfg.OnSim
	cfg.OnSim = func(r *sim.Running) {
		onSim(r)
		started <- r
	}
	go func() {
		var r *sim.Running
		select {
		case r = <-started:
		case <-ctx.Done():
			return
		}
		for ctx.Err() == nil {
			for _, st := range r.Server.BatchStats() {
				if st.Created > 0 {
					cancel()
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// TestRunBatchArmResumes: an A/B stopped while the batch arm's batches are
// open is incomplete (resumable); the same command reuses the complete arms
// and completes the batch arm, every custom_id exactly once. (Under the
// embedded simulator the open batches died with the first run's simulator,
// so the batch arm runs again from the start: regression test of a rerun
// that polled its vanished batches forever.) The stop comes once a batch is
// created, not a fixed second after the arm starts, which a loaded machine
// outran (the arm had no result yet).
func TestRunBatchArmResumes(t *testing.T) {
	t.Parallel()
	cfg, sims := smallConfig(t, 300)
	cfg.Speed = 400
	cfg.Arms = []string{ArmBaseline, ArmDispatcher, ArmBatch}
	cfg.SimConfig = func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 3600 // 9 s here: the batches are still open at the stop
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	onSim := cfg.OnSim
	cancelOnceBatchesOpen(ctx, &cfg, cancel)
	res, err := Run(ctx, cfg)
	if !errors.Is(err, dispatch.ErrIncomplete) || res == nil || res.Complete {
		t.Fatalf("stopped A/B: err %v, result %+v", err, res)
	}
	if c := res.Arms.Batch; c == nil || c.Complete || c.Unfinished == 0 {
		t.Fatalf("stopped batch arm %+v", c)
	}
	cfg.SimConfig, cfg.OnSim = nil, onSim
	res2, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := res2.Arms.Batch
	if !res2.Complete || !res2.Arms.Baseline.Reused || !res2.Arms.Dispatcher.Reused || c.Reused || !c.Complete || c.Succeeded != 300 || !c.DataLoss.Passed {
		t.Fatalf("resumed: %+v", res2.Arms)
	}
	chk, err := soak.CheckResults(filepath.Join(cfg.Dir, RequestsFile), filepath.Join(cfg.Dir, ArmBatch, rundir.ResultsFile))
	if err != nil || chk.Lost() {
		t.Fatalf("batch arm results after the resume: %+v, %v", chk, err)
	}
	if n := (*sims)[len(*sims)-1].Server.LedgerTotals().Requests; n != 300 || !strings.Contains(c.Note, "from the start") {
		t.Fatalf("the rerun billed %d requests, want 300 (the batch arm alone, once); note %q", n, c.Note)
	}
}
