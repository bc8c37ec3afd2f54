package plan

import (
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/workload"
)

const usd1 = cost.NanosPerUSD

func TestGate(t *testing.T) {
	t.Parallel()
	proj := func(exp cost.Nanos, n int64) *Projection {
		return &Projection{N: n, Arms: 1, ExpectedCost: exp, PerArmExpected: exp, WorstCase: 2 * exp}
	}
	tests := []struct {
		name    string
		exp     cost.Nanos
		n       int64
		g       GateConfig
		want    string
		explain []string // substrings of Explain
	}{
		{"no budget, small", 5 * usd1, 1000, GateConfig{}, Pass,
			[]string{"no --budget given", "expected $5.00 < $100.00 and N = 1,000 < 50,000 → not required"}},
		// $600 = $400 × 1.5 exactly: not over, so no pause.
		{"at the budget threshold", 600 * usd1, 1000, GateConfig{Budget: 400 * usd1, Tolerance: 0.5, Confirm: true}, Pass,
			[]string{"expected $600.00 ≤ $400.00 × (1 + 0.5) = $600.00 → within budget"}},
		{"one nano-dollar over", 600*usd1 + 1, 1000, GateConfig{Budget: 400 * usd1, Tolerance: 0.5, Confirm: true}, Pause,
			[]string{"expected $600.000000001 > $400.00 × (1 + 0.5) = $600.000000 → pause"}},
		{"tolerance 0", 10*usd1 + 1, 10, GateConfig{Budget: 10 * usd1}, Pause,
			[]string{"> $10.00 × (1 + 0) = $10.000000"}},
		{"negative tolerance is 0", 10 * usd1, 10, GateConfig{Budget: 10 * usd1, Tolerance: -1}, Pass, nil},
		{"tolerance 0.1 rounds exactly", 440 * usd1, 10, GateConfig{Budget: 400 * usd1, Tolerance: 0.1, Confirm: true}, Pass,
			[]string{"= $440.00"}},
		{"just under $100", 100*usd1 - 1, 49_999, GateConfig{}, Pass, nil},
		{"$100 needs confirm", 100 * usd1, 10, GateConfig{}, ConfirmRequired,
			[]string{"expected $100.00 ≥ $100.00 → --confirm required"}},
		{"N 50,000 needs confirm", 1 * usd1, 50_000, GateConfig{}, ConfirmRequired,
			[]string{"N = 50,000 ≥ 50,000 → --confirm required"}},
		{"confirm given", 150 * usd1, 60_000, GateConfig{Confirm: true}, Pass,
			[]string{"expected $150.00 ≥ $100.00 and N = 60,000 ≥ 50,000 → --confirm given"}},
		{"pause wins over confirm", 900 * usd1, 60_000, GateConfig{Budget: 400 * usd1, Tolerance: 0.5}, Pause,
			[]string{"→ pause", "→ --confirm required", "decision: pause"}},
		{"pause even with confirm", 900 * usd1, 60_000, GateConfig{Budget: 400 * usd1, Tolerance: 0.5, Confirm: true}, Pause, nil},
		{"small cost under budget", 0, 1, GateConfig{Budget: usd1}, Pass, []string{"expected $0.000000 ≤ $1.00"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := Gate(proj(tc.exp, tc.n), tc.n, tc.g)
			if g.Decision != tc.want {
				t.Errorf("decision %s, want %s\n%s", g.Decision, tc.want, g.Explain)
			}
			for _, s := range tc.explain {
				if !strings.Contains(g.Explain, s) {
					t.Errorf("explain lacks %q:\n%s", s, g.Explain)
				}
			}
			if !strings.HasSuffix(g.Explain, "decision: "+tc.want) {
				t.Errorf("explain does not end with the decision:\n%s", g.Explain)
			}
		})
	}
	// n ≤ 0 takes the projection's N.
	if g := Gate(proj(usd1, 50_000), 0, GateConfig{}); g.Decision != ConfirmRequired {
		t.Errorf("n=0 did not use p.N: %s", g.Decision)
	}
}

// TestGatePhase6 is the Phase 6 shape (docs/design.md §25): N = 141,600 judge
// items of claude-sonnet-4-5-20250929 at max_tokens 256, sent by both arms,
// gated with --budget 400 and the default tolerance 0.5 ($600).
func TestGatePhase6(t *testing.T) {
	t.Parallel()
	ws := phase6Summary(t)
	estPer := float64(ws.Models[workload.DefaultModel].EstInput) / Phase6N
	budget := GateConfig{Budget: 400 * usd1, Tolerance: 0.5}
	for _, tc := range []struct {
		name      string
		expectOut int64
		confirm   bool
		want      string
	}{
		// Default 100 output tokens: ≈ $332 an arm, ≈ $664 in total > $600.
		{"default output", 0, true, Pause},
		// 80 output tokens: ≈ $290 an arm, ≈ $580 in total ≤ $600, but
		// N ≥ 50,000 needs --confirm.
		{"80 output, no confirm", 80, false, ConfirmRequired},
		{"80 output, confirm", 80, true, Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Project(Input{Workload: ws, Prices: cost.Default(), Arms: Phase6Arms, ExpectOutput: tc.expectOut,
				Orgs: []string{"high_prio", "batch", "low_prio"}})
			if err != nil {
				t.Fatal(err)
			}
			out := 100.0
			if tc.expectOut > 0 {
				out = float64(tc.expectOut)
			}
			// The arithmetic by hand: N × (input × $3/M + output × $15/M), two arms.
			perArm := Phase6N * (estPer*3000 + out*15000)
			if d := float64(p.PerArmExpected) - perArm; d < -1 || d > 1 {
				t.Errorf("per arm %d n$, by hand %.0f", p.PerArmExpected, perArm)
			}
			if p.ExpectedCost != 2*p.PerArmExpected {
				t.Errorf("total %d is not 2 × per arm %d", p.ExpectedCost, p.PerArmExpected)
			}
			g := Gate(p, ws.N, GateConfig{Budget: budget.Budget, Tolerance: budget.Tolerance, Confirm: tc.confirm})
			if g.Decision != tc.want {
				t.Errorf("decision %s, want %s:\n%s", g.Decision, tc.want, g.Explain)
			}
			for _, s := range []string{"2 arms × " + usd(p.PerArmExpected), "$400.00 × (1 + 0.5) = $600.00", "N = 141,600 ≥ 50,000"} {
				if !strings.Contains(g.Explain, s) {
					t.Errorf("explain lacks %q:\n%s", s, g.Explain)
				}
			}
			t.Logf("expected/arm %s total %s → %s", usd(p.PerArmExpected), usd(p.ExpectedCost), g.Decision)
		})
	}
}

// phase6Summary is the Phase 6 workload's summary: 141,600 judge items of
// claude-sonnet-4-5-20250929 at max_tokens 256, their input estimate
// scaled from the first 2,000 (summing all 141,600 takes half a minute
// under the race detector; 'plan --phase6' sums them all in about a second).
func phase6Summary(t *testing.T) *workload.Summary {
	t.Helper()
	const sample = 2000
	ws, err := JudgeSummary(sample, 0, workload.GenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := ws.Models[workload.DefaultModel]
	if m.N != sample || m.MaxTokens != sample*256 {
		t.Fatalf("judge summary %+v", ws.Models)
	}
	ws.N = Phase6N
	ws.Models[workload.DefaultModel] = workload.ModelSummary{N: Phase6N, MaxTokens: Phase6N * 256, EstInput: m.EstInput * Phase6N / sample}
	return ws
}
