package plan

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// TestDefaultBatchModelIsTheSimulators pins the defaults to the
// simulator's batch model, so the projection and the simulator agree.
func TestDefaultBatchModelIsTheSimulators(t *testing.T) {
	t.Parallel()
	m := DefaultBatchModel()
	if m.QueueWaitS != sim.DefaultBatchQueueWait.Seconds() || m.PerMinute != sim.DefaultBatchPerMinute ||
		m.Queue != sim.DefaultBatchQueue || m.MaxBatch != sim.MaxBatchRequests || m.PollS != 60 {
		t.Errorf("DefaultBatchModel = %+v", m)
	}
	if (BatchModel{}).WithDefaults() != m {
		t.Errorf("zero model with defaults = %+v", BatchModel{}.WithDefaults())
	}
	got := BatchModel{PerMinute: 10, MaxBatch: 5}.WithDefaults()
	if got.PerMinute != 10 || got.MaxBatch != 5 || got.QueueWaitS != 240 || got.Queue != 200_000 || got.PollS != 60 {
		t.Errorf("partial model with defaults = %+v", got)
	}
}

func TestBatchWallS(t *testing.T) {
	t.Parallel()
	def := DefaultBatchModel()
	for _, tc := range []struct {
		name string
		m    BatchModel
		n    int64
		orgs int
		want float64
	}{
		{"nothing", def, 0, 3, 0},
		// 240 + 1/2000 × 60 + 60.
		{"one item", def, 1, 1, 300.03},
		// ceil(100,000/3) = 33,334 per org: 240 + 33,334 × 0.03 + 60.
		{"uneven over three orgs", def, 100_000, 3, 240 + 1000.02 + 60},
		// 200,000 over 2 orgs: 240 + 3,000 + 60.
		{"two orgs", def, 200_000, 2, 3300},
		// 10 + 600/600 × 60 + 5 = 75 (1,200 over 2 orgs).
		{"own model", BatchModel{QueueWaitS: 10, PerMinute: 600, PollS: 5}, 1200, 2, 75},
		{"zero model is the defaults", BatchModel{}, 1, 1, 300.03},
		{"no org", def, 10, 0, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.BatchWallS(tc.n, tc.orgs); !near(got, tc.want, 1e-9) && got != tc.want {
				t.Errorf("BatchWallS(%d, %d) = %v, want %v", tc.n, tc.orgs, got, tc.want)
			}
		})
	}
}

// bigJudge is n Sonnet 4.5 judge items: 280 estimated input tokens,
// max_tokens 256, 100 expected output tokens.
func bigJudge(n int64) *workload.Summary {
	return summary(map[string]workload.ModelSummary{sonnet: {N: n, MaxTokens: 256 * n, EstInput: 280 * n}})
}

func projectRoutes(t *testing.T, in Input, m BatchModel, deadlineS float64) (*Projection, *Routes) {
	t.Helper()
	if in.Prices == nil {
		in.Prices = cost.Default()
	}
	if in.Orgs == nil {
		in.Orgs = []string{"a", "b"}
	}
	p, err := Project(in)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ProjectRoutes(p, in, m, deadlineS)
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

func TestRoutesBatchCostAtBatchRates(t *testing.T) {
	t.Parallel()
	p, r := projectRoutes(t, Input{Workload: bigJudge(1000)}, DefaultBatchModel(), 0)
	// One item at the table's batch rates, priced by cost.Table.Cost.
	one, err := cost.Default().Cost(sonnet, anthropic.Usage{InputTokens: 280, OutputTokens: 100}, true)
	if err != nil {
		t.Fatal(err)
	}
	worstOne, err := cost.Default().Cost(sonnet, anthropic.Usage{InputTokens: 280 * InputBoundFactor, OutputTokens: 256}, true)
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 × (280 × 1,500 + 100 × 7,500) = 1,170,000,000 n$; worst
	// 1,000 × (1,120 × 1,500 + 256 × 7,500) = 3,600,000,000.
	if r.Batch.ExpectedCost != 1000*one || r.Batch.ExpectedCost != 1_170_000_000 {
		t.Errorf("batch expected %d, want 1000 × %d = 1,170,000,000", r.Batch.ExpectedCost, one)
	}
	if r.Batch.WorstCase != 1000*worstOne || r.Batch.WorstCase != 3_600_000_000 {
		t.Errorf("batch worst case %d, want 1000 × %d = 3,600,000,000", r.Batch.WorstCase, worstOne)
	}
	if r.Sync.ExpectedCost != p.ExpectedCost || r.Sync.ExpectedCost != 2_340_000_000 || r.Sync.WorstCase != p.WorstCase {
		t.Errorf("sync %d/%d, want the projection's %d/%d", r.Sync.ExpectedCost, r.Sync.WorstCase, p.ExpectedCost, p.WorstCase)
	}
	if r.Sync.WallS != p.WallS || r.Sync.BoundS != p.WallS || r.Sync.Binding != BindCap {
		t.Errorf("sync route %+v (projection wall %v)", r.Sync, p.WallS)
	}
	// 500 per org over 2 orgs: 240 + 15 + 60.
	if r.Batch.WallS != 315 || r.Batch.BoundS != BatchExpiryS || r.Batch.Binding != BindBatchThroughput || r.Auto != nil {
		t.Errorf("batch route %+v", r.Batch)
	}
	if p.Routes != r {
		t.Error("ProjectRoutes did not record the routes in the projection")
	}
	if !strings.Contains(r.Batch.Explain, "$1.50/M") || !strings.Contains(r.Batch.Explain, "$7.50/M") || !strings.Contains(r.Batch.Explain, "$1.17") {
		t.Errorf("batch explain: %s", r.Batch.Explain)
	}
	if !strings.Contains(strings.Join(p.Assumptions, "\n"), "no batch timing was ever measured") {
		t.Errorf("assumptions lack the batch model: %q", p.Assumptions)
	}
}

// TestRoutesBatchRatesFromTheTable prices a model whose batch multiplier
// is 0.25: the batch route's cost follows the table, not a fixed half.
func TestRoutesBatchRatesFromTheTable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "prices.toml")
	body := "[models.\"claude-sonnet-4-5\"]\naliases = [\"claude-sonnet-4-5-20250929\"]\ninput = 4\noutput = 20\nbatch_multiplier = 0.25\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	prices, err := cost.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	_, r := projectRoutes(t, Input{Workload: bigJudge(1000), Prices: prices}, BatchModel{}, 0)
	// 1,000 × (280 × 1,000 + 100 × 5,000) = 780,000,000 n$.
	if r.Batch.ExpectedCost != 780_000_000 || r.Sync.ExpectedCost != 3_120_000_000 {
		t.Errorf("batch %d, sync %d; want 780,000,000 and 3,120,000,000", r.Batch.ExpectedCost, r.Sync.ExpectedCost)
	}
}

func TestRoutesAuto(t *testing.T) {
	t.Parallel()
	// 200,000 items over 2 cap-bound orgs: sync about 2,455 s, batch
	// 240 + 100,000 × 0.03 + 60 = 3,300 s.
	const n = 200_000
	p, _ := projectRoutes(t, Input{Workload: bigJudge(n)}, BatchModel{}, 0)
	if p.WallS < 2400 || p.WallS > 2500 {
		t.Fatalf("sync wall %v s; the cases below assume about 2,455 s", p.WallS)
	}
	m := DefaultBatchModel()

	t.Run("long deadline: all batch", func(t *testing.T) {
		_, r := projectRoutes(t, Input{Workload: bigJudge(n)}, m, 10*3600)
		a := r.Auto
		if a == nil || a.BatchItems != n || a.SyncItems != 0 || !a.Meets || a.ExpectedCost != r.Batch.ExpectedCost || a.WallS != 3300 {
			t.Fatalf("auto %+v", a)
		}
		if b, s := r.Split(); b != n || s != 0 {
			t.Errorf("Split = %d, %d", b, s)
		}
	})
	t.Run("too short: the fastest split, missed", func(t *testing.T) {
		_, r := projectRoutes(t, Input{Workload: bigJudge(n)}, m, 60)
		a := r.Auto
		// Nothing meets a minute: both routes at once finish soonest, at
		// the b where the batch share takes as long as the sync rest.
		if a == nil || a.Meets || a.BatchItems+a.SyncItems != n || a.BatchItems == 0 {
			t.Fatalf("auto %+v", a)
		}
		bw, sw := m.BatchWallS(a.BatchItems, 2), r.Sync.WallS*float64(a.SyncItems)/n
		if bw < sw || m.BatchWallS(a.BatchItems-1, 2) >= r.Sync.WallS*float64(a.SyncItems+1)/n {
			t.Errorf("b = %d is not the fastest split: batch %v, sync %v", a.BatchItems, bw, sw)
		}
		if a.WallS >= r.Sync.WallS || !(a.ExpectedCost < r.Sync.ExpectedCost) {
			t.Errorf("the fastest split (%v s, %v) is not faster and cheaper than all sync (%v s, %v)", a.WallS, a.ExpectedCost, r.Sync.WallS, r.Sync.ExpectedCost)
		}
		if !strings.Contains(a.Explain, "over the target") || !strings.Contains(a.Explain, "deadline missed by least") {
			t.Errorf("explain: %s", a.Explain)
		}
	})
	t.Run("between: the largest batch share", func(t *testing.T) {
		const deadline = 3000.0 // target 2,550 s
		_, r := projectRoutes(t, Input{Workload: bigJudge(n)}, m, deadline)
		a := r.Auto
		if a == nil || !a.Meets || a.BatchItems+a.SyncItems != n || a.BatchItems == 0 || a.SyncItems == 0 {
			t.Fatalf("auto %+v", a)
		}
		// The batch share ends, with one org's share sent again by sync,
		// by the target: 240 + 60 + (b/2) × (0.03 + sync s per item) ≤ 2,550,
		// so b/2 ≤ 2,250 / (0.03 + 2,455/200,000): b = 106,448.
		target := 0.85 * deadline
		fits := func(b int64) bool {
			return m.BatchWallS(b, 2)+r.Sync.WallS*float64((b+1)/2)/n <= target
		}
		if a.BatchItems != 106_448 || !fits(a.BatchItems) || fits(a.BatchItems+1) {
			t.Errorf("batch items %d: want 106,448, the largest share that fits (fits %v, +1 fits %v)", a.BatchItems, fits(a.BatchItems), fits(a.BatchItems+1))
		}
		if sw := r.Sync.WallS * float64(a.SyncItems) / n; sw > target || near(sw, 0, 1e-9) {
			t.Errorf("SyncWallS(%d) = %v, target %v", a.SyncItems, sw, target)
		}
		if !(r.Batch.ExpectedCost < a.ExpectedCost && a.ExpectedCost < r.Sync.ExpectedCost) ||
			!(r.Batch.WorstCase < a.WorstCase && a.WorstCase < r.Sync.WorstCase) {
			t.Errorf("auto cost %d (worst %d) not between batch %d (%d) and sync %d (%d)",
				a.ExpectedCost, a.WorstCase, r.Batch.ExpectedCost, r.Batch.WorstCase, r.Sync.ExpectedCost, r.Sync.WorstCase)
		}
		// Pro rata: the batch share at batch rates, the rest at sync rates.
		want := cost.Nanos((float64(a.BatchItems)*float64(r.Batch.ExpectedCost) + float64(a.SyncItems)*float64(r.Sync.ExpectedCost)) / n)
		if a.ExpectedCost < want-1000 || a.ExpectedCost > want+1000 {
			t.Errorf("auto cost %d, want about %d", a.ExpectedCost, want)
		}
		if a.WallS > target || a.BoundS != BatchExpiryS || !strings.Contains(a.Binding, "batch: ") {
			t.Errorf("auto %+v", a)
		}
		if b, s := r.Split(); b != a.BatchItems || s != a.SyncItems {
			t.Errorf("Split = %d, %d", b, s)
		}
	})
	t.Run("batch share too small to help: the fastest split, missed", func(t *testing.T) {
		// target 850 s: a batch share of 36,666 ends in time, but the
		// other 163,334 by sync take about 2,000 s.
		_, r := projectRoutes(t, Input{Workload: bigJudge(n)}, m, 1000)
		a := r.Auto
		if a.BatchItems == 0 || a.Meets || !strings.Contains(a.Explain, "even the largest batch share") || !strings.Contains(a.Explain, "the fastest split") {
			t.Errorf("auto %+v", a)
		}
	})
	t.Run("small job, short deadline: all sync in time", func(t *testing.T) {
		// 1,000 items: sync about 17 s; batch at least 300 s > 85 s.
		_, r := projectRoutes(t, Input{Workload: bigJudge(1000)}, m, 100)
		a := r.Auto
		if a.BatchItems != 0 || a.SyncItems != 1000 || !a.Meets {
			t.Errorf("auto %+v", a)
		}
	})
}

func TestRoutesSplitWithoutDeadline(t *testing.T) {
	t.Parallel()
	_, r := projectRoutes(t, Input{Workload: bigJudge(1000)}, BatchModel{}, 0)
	if b, s := r.Split(); b != 1000 || s != 0 {
		t.Errorf("Split = %d, %d; want all batch", b, s)
	}
	_, r = projectRoutes(t, Input{Workload: bigJudge(99)}, BatchModel{}, 0)
	if b, s := r.Split(); b != 0 || s != 99 {
		t.Errorf("Split of 99 = %d, %d; want all sync", b, s)
	}
}

func TestRoutesQueueCapAndSameOrg(t *testing.T) {
	t.Parallel()
	// 300,000 items on one org: over the 200,000 queue cap.
	_, r := projectRoutes(t, Input{Workload: bigJudge(300_000), Orgs: []string{"a"}}, BatchModel{}, 0)
	if r.Batch.Binding != BindQueueCap || r.Batch.WallS != 240+9000+60 || !strings.Contains(r.Batch.Explain, "queue cap") {
		t.Errorf("batch %+v", r.Batch)
	}
	// Two org names reaching one organisation count once.
	lim := &Limits{Orgs: map[string]map[string]ModelLimits{
		"a": {sonnet: {Status: 200, RPM: 1000}}, "b": {sonnet: {Status: 200, RPM: 1000}},
	}, OrgIDs: map[string]string{"a": "org-1", "b": "org-1"}}
	_, r = projectRoutes(t, Input{Workload: bigJudge(1000), Limits: lim}, BatchModel{}, 0)
	if r.orgs != 1 || r.Batch.WallS != 240+30+60 {
		t.Errorf("orgs %d, batch wall %v", r.orgs, r.Batch.WallS)
	}
}

func TestProjectRoutesRefusesBadInput(t *testing.T) {
	t.Parallel()
	p, err := Project(Input{Workload: bigJudge(10), Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []BatchModel{{MaxBatch: MaxBatchRequests + 1}, {PerMinute: -1}, {QueueWaitS: math.NaN()}, {Queue: -5}} {
		if _, err := ProjectRoutes(p, Input{}, m, 0); !errors.Is(err, ErrBatchModel) {
			t.Errorf("model %+v: err %v", m, err)
		}
	}
	if _, err := ProjectRoutes(p, Input{}, BatchModel{}, -1); err == nil {
		t.Error("a negative deadline was accepted")
	}
	if _, err := ProjectRoutes(nil, Input{}, BatchModel{}, 0); err == nil {
		t.Error("a nil projection was accepted")
	}
}

func TestRoutesJSONAndText(t *testing.T) {
	t.Parallel()
	p, _ := projectRoutes(t, Input{Workload: bigJudge(1000), Speed: 10}, BatchModel{}, 0)
	b, err := p.JSON(GateResult{Decision: Pass})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	routes, ok := doc["routes"].(map[string]any)
	if !ok {
		t.Fatalf("no routes in %s", b)
	}
	if a, ok := routes["auto"]; !ok || a != nil {
		t.Errorf("auto = %v (present %v), want null", a, ok)
	}
	batch := routes["batch"].(map[string]any)
	if batch["expected_usd"] != 1.17 || batch["wall_s"] != 315.0 || batch["wall_at_speed_s"] != 31.5 || batch["bound_s"] != 86400.0 {
		t.Errorf("batch = %v", batch)
	}
	if _, ok := routes["sync"].(map[string]any)["meets"]; ok {
		t.Error("sync carries meets")
	}

	p, _ = projectRoutes(t, Input{Workload: bigJudge(200_000)}, BatchModel{}, 3000)
	var d ProjectionJSON
	if b, err = p.JSON(GateResult{Decision: Pass}); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.Routes == nil || d.Routes.Auto == nil || d.Routes.Auto.Meets == nil || !*d.Routes.Auto.Meets ||
		d.Routes.Auto.BatchItems != 106_448 || d.Routes.DeadlineS != 3000 || d.Routes.BatchOrgs != 2 {
		t.Errorf("routes %s", b)
	}
	var text strings.Builder
	if err := p.WriteText(&text, GateResult{Decision: Pass}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"routes (one arm", "deadline 50 min 00 s", "106,448 batch + 93,552 sync", "24 h 00 min", "--route auto would send 106,448 items by batch and 93,552 by sync: meets the deadline"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("text lacks %q:\n%s", s, text.String())
		}
	}
}

func TestLimitsBatchModel(t *testing.T) {
	t.Parallel()
	l, err := ParseLimits([]byte(`{"orgs":{"a":{"claude-sonnet-4-5":{"status":200,"rpm":100}}},"batch":{"queue_wait_s":30,"per_minute":500}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultBatchModel()
	want.QueueWaitS, want.PerMinute = 30, 500
	if got := l.BatchModel(); got != want {
		t.Errorf("BatchModel = %+v, want %+v", got, want)
	}
	// It survives a write and a read.
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if l2, err := ParseLimits(b); err != nil || l2.BatchModel() != want {
		t.Errorf("round trip: %v %+v", err, l2)
	}
	for _, l := range []*Limits{nil, {}} {
		if l.BatchModel() != DefaultBatchModel() {
			t.Errorf("%v: BatchModel = %+v", l, l.BatchModel())
		}
	}
	old, err := LoadLimits("testdata/phase0_limits.json")
	if err != nil || old.BatchModel() != DefaultBatchModel() {
		t.Errorf("phase0 file: %v %+v", err, old)
	}
	if _, err := ParseLimits([]byte(`{"orgs":{"a":{"m":{"status":200}}},"batch":{"per_minute":-1}}`)); !errors.Is(err, ErrLimitsFile) || !errors.Is(err, ErrBatchModel) {
		t.Errorf("negative per_minute: %v", err)
	}
}

// TestRoutesAfterAPilot: the routes carry the pending items only, and the
// pilot's exact spend is in every route's cost.
func TestRoutesAfterAPilot(t *testing.T) {
	t.Parallel()
	spent := cost.Nanos(100 * (280*3000 + 100*15000))
	ps := &PilotStats{Items: 100, Succeeded: 100, Spent: spent, InputTokens: 28_000, OutputTokens: 10_000, LatencyMeanS: 2.45,
		Pending: map[string]workload.ModelSummary{sonnet: {N: 900, MaxTokens: 900 * 256, EstInput: 900 * 280}}}
	p, r := projectRoutes(t, Input{Workload: bigJudge(1000), Pilot: ps}, BatchModel{}, 3600)
	// 900 × (280 × 1,500 + 100 × 7,500) at batch rates.
	if r.Sync.Items != 900 || r.Batch.ExpectedCost != spent+900*1_170_000 || r.Sync.ExpectedCost != p.ExpectedCost {
		t.Errorf("sync %+v batch %+v (spent %d)", r.Sync, r.Batch, spent)
	}
	if b, s := r.Split(); b != 900 || s != 0 || !r.Auto.Meets {
		t.Errorf("Split = %d, %d (auto %+v)", b, s, r.Auto)
	}
}
