package plan

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/workload"
)

const sonnet = "claude-sonnet-4-5-20250929"
const haiku = "claude-haiku-4-5-20251001"

func summary(models map[string]workload.ModelSummary) *workload.Summary {
	s := &workload.Summary{Models: models}
	for _, m := range models {
		s.N += m.N
	}
	return s
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestProjectCosts(t *testing.T) {
	t.Parallel()
	// 1,000 Sonnet 4.5 items of 280 estimated input tokens, max_tokens 256.
	judge := summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000}})
	tests := []struct {
		name                   string
		in                     Input
		expected, allMax, wrst cost.Nanos
	}{
		// expected 1,000 × (280 × 3,000 + 100 × 15,000) = 2,340,000,000 n$
		// all max  1,000 × (280 × 3,000 + 256 × 15,000) = 4,680,000,000
		// worst    1,000 × (1,120 × 3,000 + 256 × 15,000) = 7,200,000,000
		{"default output", Input{Workload: judge}, 2_340_000_000, 4_680_000_000, 7_200_000_000},
		// 1,000 × (840,000 + 50 × 15,000) = 1,590,000,000
		{"expect output 50", Input{Workload: judge, ExpectOutput: 50}, 1_590_000_000, 4_680_000_000, 7_200_000_000},
		// Expected output is capped at max_tokens: 1,000 × (840,000 + 256 × 15,000).
		{"expect output above max_tokens", Input{Workload: judge, ExpectOutput: 1000}, 4_680_000_000, 4_680_000_000, 7_200_000_000},
		// Two arms double everything.
		{"two arms", Input{Workload: judge, Arms: 2}, 4_680_000_000, 9_360_000_000, 14_400_000_000},
		// max_tokens 64 < 100: 1,000 × (840,000 + 64 × 15,000) = 1,800,000,000;
		// worst 1,000 × (3,360,000 + 960,000) = 4,320,000,000.
		{"small max_tokens", Input{Workload: summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 64_000, EstInput: 280_000}})},
			1_800_000_000, 1_800_000_000, 4_320_000_000},
		// Sonnet + Haiku: Haiku 500 × (200 × 1,000 + 100 × 5,000) = 350,000,000,
		// all max 500 × (200,000 + 512 × 5,000) = 1,380,000,000,
		// worst 500 × (800 × 1,000 + 2,560,000) = 1,680,000,000.
		{"two models", Input{Workload: summary(map[string]workload.ModelSummary{
			sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000},
			haiku:  {N: 500, MaxTokens: 256_000, EstInput: 100_000}})},
			2_340_000_000 + 350_000_000, 4_680_000_000 + 1_380_000_000, 7_200_000_000 + 1_680_000_000},
		// count_tokens said 300 for every 280 estimated: input 300/request.
		// 1,000 × (900,000 + 1,500,000) = 2,400,000,000; all max 1,000 ×
		// (900,000 + 3,840,000); every item counted, so the worst case's
		// input is 300 × 1.1 = 330: 1,000 × (990,000 + 3,840,000).
		{"counted, all", Input{Workload: judge, Counts: &TokenCounts{Models: map[string]ModelCount{sonnet: {Items: 1000, Counted: 300_000, Est: 280_000, All: true}}}},
			2_400_000_000, 4_740_000_000, 4_830_000_000},
		// The worst case is the one cost.Table.WorstCase, with the
		// multipliers the items' params ask for. Half ask for
		// inference_geo "us": 500 × 7,200,000 + 500 × 7,920,000.
		{"inference_geo us", Input{Workload: summary(map[string]workload.ModelSummary{"claude-sonnet-4-6": {N: 1000, MaxTokens: 256_000, EstInput: 280_000, GeoUS: 500}})},
			2_340_000_000, 4_680_000_000, 7_560_000_000},
		// All write the 5-minute cache: 1,000 × (1,120 × 3,750 + 3,840,000).
		{"5-minute cache writes", Input{Workload: summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000, CacheWrite5m: 1000}})},
			2_340_000_000, 4_680_000_000, 8_040_000_000},
		// All write the 1-hour cache: 1,000 × (1,120 × 6,000 + 3,840,000).
		{"1-hour cache writes", Input{Workload: summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000, CacheWrite1h: 1000}})},
			2_340_000_000, 4_680_000_000, 10_560_000_000},
		// A sample scales the estimate but leaves the bound at 4 × estimate.
		{"counted, sample", Input{Workload: judge, Counts: &TokenCounts{Models: map[string]ModelCount{sonnet: {Items: 10, Counted: 3000, Est: 2800}}}},
			2_400_000_000, 4_740_000_000, 7_200_000_000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Prices = cost.Default()
			p, err := Project(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if p.ExpectedCost != tc.expected || p.AllMaxTokens != tc.allMax || p.WorstCase != tc.wrst {
				t.Errorf("expected %d, all max %d, worst %d; want %d, %d, %d", p.ExpectedCost, p.AllMaxTokens, p.WorstCase, tc.expected, tc.allMax, tc.wrst)
			}
			if p.WorstCase < p.AllMaxTokens || p.AllMaxTokens < p.ExpectedCost {
				t.Errorf("costs out of order: %d %d %d", p.ExpectedCost, p.AllMaxTokens, p.WorstCase)
			}
		})
	}
}

func TestProjectArithmeticText(t *testing.T) {
	t.Parallel()
	p, err := Project(Input{Workload: summary(map[string]workload.ModelSummary{sonnet: {N: 141_600, MaxTokens: 141_600 * 256, EstInput: 141_600 * 280}}), Prices: cost.Default()})
	if err != nil {
		t.Fatal(err)
	}
	// 141,600 × (840,000 + 1,500,000) n$ = $331.344.
	want := "141,600 × (280 input × $3.00/M + 100 output × $15.00/M) = $331.34"
	if got := p.Models[0].Arithmetic; got != want {
		t.Errorf("arithmetic\n got %s\nwant %s", got, want)
	}
}

func TestProjectLanes(t *testing.T) {
	t.Parallel()
	ws := summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000}})
	lim := func(rpm, itpm, otpm int64, status int, id string) map[string]ModelLimits {
		return map[string]ModelLimits{sonnet: {Status: status, RPM: rpm, ITPM: itpm, OTPM: otpm, OrgID: id}}
	}
	limits := &Limits{
		Orgs: map[string]map[string]ModelLimits{
			"capped": lim(1_000_000, 1e9, 1e9, 200, "o1"),
			"rpm":    lim(50, 1e9, 1e9, 200, "o2"),
			"itpm":   lim(1_000_000, 100_000, 1e9, 200, "o3"),
			"otpm":   lim(1_000_000, 1e9, 10_000, 429, "o4"),
			"gone":   lim(0, 0, 0, 404, "o5"),
			"twin":   lim(1_000_000, 1e9, 1e9, 200, "o1"),
		},
		OrgIDs: map[string]string{"capped": "o1", "rpm": "o2", "itpm": "o3", "otpm": "o4", "gone": "o5", "twin": "o1"},
	}
	orgs := []string{"capped", "rpm", "itpm", "otpm", "gone", "twin", "unprobed"}
	p, err := Project(Input{Workload: ws, Prices: cost.Default(), Orgs: orgs, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	// Latency 1.05 + 0.014 × 100 = 2.45 s; 100 / 2.45 × 60 = 2,448.98 req/min.
	capRPM := 100 / 2.45 * 60
	want := map[string]struct {
		ceiling float64
		binding string
	}{
		"capped":   {capRPM, BindCap},
		"rpm":      {50, BindRPM},
		"itpm":     {100_000.0 / 280, BindITPM}, // 357.1
		"otpm":     {10_000.0 / 100, BindOTPM},  // 100
		"gone":     {0, BindUnavailable},
		"twin":     {0, BindSameOrg},
		"unprobed": {capRPM, BindCap},
	}
	if len(p.Lanes) != len(orgs) {
		t.Fatalf("%d lanes", len(p.Lanes))
	}
	sum := 0.0
	for _, l := range p.Lanes {
		w := want[l.Org]
		if !near(l.CeilingRPM, w.ceiling, 0.01) || l.BindingLimit != w.binding || l.Pool != "sonnet-4" || l.Cap != 100 {
			t.Errorf("lane %s: ceiling %.2f %s cap %d; want %.2f %s", l.Org, l.CeilingRPM, l.BindingLimit, l.Cap, w.ceiling, w.binding)
		}
		sum += l.CeilingRPM
	}
	if !strings.Contains(lanesByOrg(p.Lanes)["otpm"].Note, "429") || !strings.Contains(lanesByOrg(p.Lanes)["gone"].Note, "404") {
		t.Errorf("notes: %+v", p.Lanes)
	}
	// Wall: 1,000 / sum × 60 + 2.25 s warm-up (a lane is cap-bound) + 2.45 s.
	wantWall := 1000/sum*60 + rampS + 2.45
	if len(p.Pools) != 1 || !near(p.Pools[0].CeilingRPM, sum, 1e-9) || !near(p.WallS, wantWall, 1e-9) {
		t.Errorf("pools %+v wall %.3f; want ceiling %.2f wall %.3f", p.Pools, p.WallS, sum, wantWall)
	}
	if !hasAssumption(p, "reach the same organisation") {
		t.Errorf("no same-org assumption: %v", p.Assumptions)
	}
}

func lanesByOrg(ls []LaneProjection) map[string]LaneProjection {
	m := map[string]LaneProjection{}
	for _, l := range ls {
		m[l.Org] = l
	}
	return m
}

func hasAssumption(p *Projection, s string) bool {
	for _, a := range p.Assumptions {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

func TestProjectCapsLatencySpeedAndBaseline(t *testing.T) {
	t.Parallel()
	ws := summary(map[string]workload.ModelSummary{sonnet: {N: 6000, MaxTokens: 6000 * 256, EstInput: 6000 * 280}})
	p, err := Project(Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a", "b"}, Caps: map[string]int{"sonnet": 20},
		LatencyS: 2, Speed: 10, Arms: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Each lane: 20 / 2 s × 60 = 600 req/min; two lanes 1,200; 6,000 items
	// in 300 s + 2.25 + 2 = 304.25 s; at K=10, 30.425 s.
	if !near(p.WallS, 304.25, 1e-9) || !near(p.WallAtSpeedS, 30.425, 1e-9) || p.Speed != 10 {
		t.Errorf("wall %.3f at K %.3f", p.WallS, p.WallAtSpeedS)
	}
	// Baseline: org a at 50: 50 / 2 × 60 = 1,500 req/min; 6,000 in 240 s + 2 s.
	if len(p.Baseline) != 1 || p.Baseline[0].Org != "a" || p.Baseline[0].Cap != 50 || !near(p.BaselineWallS, 242, 1e-9) {
		t.Errorf("baseline %+v wall %.3f", p.Baseline, p.BaselineWallS)
	}
	if !hasAssumption(p, "no limits file") {
		t.Errorf("a projection without limits must say so: %v", p.Assumptions)
	}
}

func TestProjectPilot(t *testing.T) {
	t.Parallel()
	// 1,000 items estimated 280 input, max_tokens 256; 100 done.
	ws := summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000}})
	// The pilot: 100 items (99 succeeded), billed 29,700 input (300 each) and
	// 8,415 output (85 each), mean latency 0.1 s at K=20 (2 s of API time).
	spent := cost.Nanos(29_700*3000 + 8_415*15000)
	ps := &PilotStats{Size: 100, Items: 100, Succeeded: 99, Errored: 1, Spent: spent,
		InputTokens: 29_700, OutputTokens: 8_415, LatencyMeanS: 0.1,
		Pending: map[string]workload.ModelSummary{sonnet: {N: 900, MaxTokens: 900 * 256, EstInput: 900 * 280}}}
	p, err := Project(Input{Workload: ws, Prices: cost.Default(), Pilot: ps, Speed: 20, ExpectOutput: 10})
	if err != nil {
		t.Fatal(err)
	}
	// Done est 28,000 → 27,720 for the 99 succeeded; ratio 29,700 / 27,720.
	ratio := 29_700.0 / 27_720
	in := 280 * ratio // 300
	rest := 900 * (in*3000 + 85*15000)
	if p.Done != 100 || p.Spent != spent || !near(float64(p.ExpectedCost), float64(spent)+rest, 1) {
		t.Errorf("done %d spent %d expected %d; want %d + %.0f", p.Done, p.Spent, p.ExpectedCost, spent, rest)
	}
	m := p.Models[0]
	if m.Remaining != 900 || !near(m.InputPerReq, in, 1e-9) || m.OutputPerReq != 85 || !strings.Contains(m.OutputSource, "pilot") {
		t.Errorf("model %+v", m)
	}
	// Worst: spent + 900 × (1,120 × 3,000 + 256 × 15,000).
	if want := spent + 900*(1120*3000+256*15000); p.WorstCase != want {
		t.Errorf("worst %d, want %d", p.WorstCase, want)
	}
	// Latency: the pilot's 0.1 s × K 20 = 2 s.
	if l := p.Lanes[0]; !near(l.LatencyS, 2, 1e-9) {
		t.Errorf("lane latency %.3f", l.LatencyS)
	}
	if !hasAssumption(p, "pilot: 100 items done") {
		t.Errorf("assumptions %v", p.Assumptions)
	}

	// A pilot where nothing succeeded measures nothing: defaults are used,
	// and the spend (0) is still counted.
	none := &PilotStats{Items: 10, Errored: 10, Pending: map[string]workload.ModelSummary{sonnet: {N: 990, MaxTokens: 990 * 256, EstInput: 990 * 280}}}
	p, err = Project(Input{Workload: ws, Prices: cost.Default(), Pilot: none})
	if err != nil {
		t.Fatal(err)
	}
	if want := cost.Nanos(990 * (280*3000 + 100*15000)); p.ExpectedCost != want || p.Done != 10 {
		t.Errorf("expected %d done %d, want %d", p.ExpectedCost, p.Done, want)
	}
}

func TestProjectErrors(t *testing.T) {
	t.Parallel()
	ws := summary(map[string]workload.ModelSummary{"claude-fable-5": {N: 1, MaxTokens: 1, EstInput: 1}})
	if _, err := Project(Input{Workload: ws, Prices: cost.Default()}); !errors.Is(err, cost.ErrNoPrice) {
		t.Errorf("unpriced model: err = %v", err)
	}
	if _, err := Project(Input{Prices: cost.Default()}); err == nil {
		t.Error("no workload: no error")
	}
	if _, err := Project(Input{Workload: summary(map[string]workload.ModelSummary{sonnet: {N: 1}})}); err == nil {
		t.Error("no prices: no error")
	}
}

// TestProjectionJSON pins the keys docs/design.md §7 promises for 'plan --json'.
func TestProjectionJSON(t *testing.T) {
	t.Parallel()
	ws := summary(map[string]workload.ModelSummary{sonnet: {N: 1000, MaxTokens: 256_000, EstInput: 280_000}})
	p, err := Project(Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a", "b"}, Arms: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.JSON(Gate(p, ws.N, GateConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		N                int64 `json:"n"`
		ProjectedCostUSD struct {
			Expected  *float64 `json:"expected"`
			WorstCase *float64 `json:"worst_case"`
			PerArm    *float64 `json:"per_arm"`
			Total     *float64 `json:"total"`
		} `json:"projected_cost_usd"`
		ProjectedWallS *float64 `json:"projected_wall_s"`
		Gate           string   `json:"gate"`
		Lanes          []struct {
			Org          string   `json:"org"`
			Pool         string   `json:"pool"`
			CeilingRPM   *float64 `json:"ceiling_rpm"`
			BindingLimit string   `json:"binding_limit"`
		} `json:"lanes"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	c := v.ProjectedCostUSD
	if v.N != 1000 || c.Expected == nil || *c.Expected != 4.68 || c.WorstCase == nil || *c.WorstCase != 14.4 ||
		c.PerArm == nil || *c.PerArm != 2.34 || c.Total == nil || *c.Total != 4.68 || v.ProjectedWallS == nil || v.Gate != Pass {
		t.Errorf("json %s", b)
	}
	if len(v.Lanes) != 2 || v.Lanes[0].Org != "a" || v.Lanes[0].Pool != "sonnet-4" || v.Lanes[0].CeilingRPM == nil || v.Lanes[0].BindingLimit != BindCap {
		t.Errorf("lanes %+v", v.Lanes)
	}
	var sb strings.Builder
	if err := p.WriteText(&sb, Gate(p, ws.N, GateConfig{})); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"total (2 arms)", "$4.68", "binding", "gate: pass", "assumptions:", "baseline arm"} {
		if !strings.Contains(sb.String(), s) {
			t.Errorf("text lacks %q:\n%s", s, sb.String())
		}
	}
}

// TestJudgeSummaryMatchesValidate: the in-memory summary of the judge
// workload is the one Validate computes from the written file.
func TestJudgeSummaryMatchesValidate(t *testing.T) {
	t.Parallel()
	for _, opts := range []workload.GenOptions{{}, {Model: "claude-haiku-4-5", MaxTokens: 64}} {
		path := filepath.Join(t.TempDir(), "j.jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := workload.GenerateJudge(f, 1001, 7, opts); err != nil {
			t.Fatal(err)
		}
		f.Close()
		want, err := workload.Validate(path, workload.ValidateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := JudgeSummary(1001, 7, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("JudgeSummary = %+v\nValidate     = %+v", got, want)
		}
	}
}
