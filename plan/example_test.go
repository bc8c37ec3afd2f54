package plan_test

import (
	"fmt"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/workload"
)

// A projection of 10,000 judge-sized requests and the gates of a $25
// budget: 10,000 × (280 × $3/M + 100 × $15/M) = $23.40, under $25 × 1.5.
func ExampleGate() {
	ws := &workload.Summary{N: 10_000, Models: map[string]workload.ModelSummary{
		"claude-sonnet-4-5-20250929": {N: 10_000, MaxTokens: 10_000 * 256, EstInput: 10_000 * 280},
	}}
	p, err := plan.Project(plan.Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a", "b"}})
	if err != nil {
		panic(err)
	}
	g := plan.Gate(p, ws.N, plan.GateConfig{Budget: 25 * cost.NanosPerUSD, Tolerance: 0.5})
	fmt.Println(p.Models[0].Arithmetic)
	fmt.Println(g.Explain)
	// Output:
	// 10,000 × (280 input × $3.00/M + 100 output × $15.00/M) = $23.40
	// expected cost $23.40 (worst case $72.00)
	// budget: expected $23.40 ≤ $25.00 × (1 + 0.5) = $37.50 → within budget
	// confirm: expected $23.40 < $100.00 and N = 10,000 < 50,000 → not required
	// decision: pass
}

// BenchmarkJudgeSummary is what 'plan --phase6' spends summing the
// 141,600-item judge workload in memory.
func BenchmarkJudgeSummary(b *testing.B) {
	for b.Loop() {
		if _, err := plan.JudgeSummary(plan.Phase6N, 0, workload.GenOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// Routes side by side for 200,000 judge requests over two orgs, and the
// split --route auto sends to end within 50 API minutes (target 42 min 30 s):
// batch alone takes 55 min, so 150,000 items go by batch (42 min 30 s) and
// 50,000 by sync.
func ExampleProjectRoutes() {
	ws := &workload.Summary{N: 200_000, Models: map[string]workload.ModelSummary{
		"claude-sonnet-4-5-20250929": {N: 200_000, MaxTokens: 200_000 * 256, EstInput: 200_000 * 280},
	}}
	in := plan.Input{Workload: ws, Prices: cost.Default(), Orgs: []string{"a", "b"}}
	p, err := plan.Project(in)
	if err != nil {
		panic(err)
	}
	r, err := plan.ProjectRoutes(p, in, plan.DefaultBatchModel(), 3000)
	if err != nil {
		panic(err)
	}
	for _, rp := range []plan.RouteProjection{r.Sync, r.Batch, *r.Auto} {
		fmt.Printf("%-5s batch %7d sync %7d  $%.2f  %4.0f s\n", rp.Route, rp.BatchItems, rp.SyncItems, rp.ExpectedCost.USD(), rp.WallS)
	}
	b, s := r.Split()
	fmt.Println("split:", b, s, "meets:", r.Auto.Meets)
	// Output:
	// sync  batch       0 sync  200000  $468.00  2455 s
	// batch batch  200000 sync       0  $234.00  3300 s
	// auto  batch  106448 sync   93552  $343.46  1897 s
	// split: 106448 93552 meets: true
}
