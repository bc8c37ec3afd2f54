package plan_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

func judgeSummary(t *testing.T, n int) *workload.Summary {
	t.Helper()
	ws, err := plan.JudgeSummary(n, 1, workload.GenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// writeJudge writes n judge items to a file and validates it.
func writeJudge(t *testing.T, n int, seed int64) (string, *workload.Summary) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "judge.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateJudge(f, n, seed, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	ws, err := rundir.Validate(path, cost.Default())
	if err != nil {
		t.Fatal(err)
	}
	return path, ws
}

// TestCountTokens asks the simulator's count_tokens for a sample of the
// judge workload; the counted input per request must match what the
// simulator then bills.
func TestCountTokens(t *testing.T) {
	t.Parallel()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 100
	r, orgs := startSim(t, cfg)
	input, ws := writeJudge(t, 500, 3)
	ctx := context.Background()
	counts, err := plan.CountTokens(ctx, input, ws, plan.CountConfig{BaseURL: r.URL, Key: orgs[0].Key, Sample: 50})
	if err != nil {
		t.Fatal(err)
	}
	mc := counts.Models[workload.DefaultModel]
	if mc.Items != 50 || mc.All || mc.Counted <= 0 {
		t.Fatalf("counts %+v", mc)
	}
	if led := r.Server.LedgerTotals(); led.Requests != 0 || led.CostNanos != 0 {
		t.Fatalf("count_tokens was billed: %+v", led)
	}
	all, err := plan.CountTokens(ctx, input, ws, plan.CountConfig{BaseURL: r.URL, Key: orgs[0].Key, Sample: 0, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	if m := all.Models[workload.DefaultModel]; m.Items != 500 || !m.All {
		t.Fatalf("counting every item: %+v", m)
	}
	p, err := plan.Project(plan.Input{Workload: ws, Prices: cost.Default(), Counts: counts})
	if err != nil {
		t.Fatal(err)
	}
	pAll, err := plan.Project(plan.Input{Workload: ws, Prices: cost.Default(), Counts: all})
	if err != nil {
		t.Fatal(err)
	}

	// Bill the same items: send them all.
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default()}, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: orgs, BaseURL: r.URL, Speed: 100, Prices: cost.Default(), SampleEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// Every billed request of the same items (a retry is billed again, with
	// the same input).
	led := r.Server.LedgerTotals()
	billedIn := float64(led.InputTokens) / float64(led.Requests)
	est := float64(ws.Models[workload.DefaultModel].EstInput) / 500
	t.Logf("input a request: local estimate %.1f, count_tokens sample %.1f, all %.1f, billed %.1f",
		est, p.Models[0].InputPerReq, pAll.Models[0].InputPerReq, billedIn)
	if math.Abs(p.Models[0].InputPerReq-billedIn)/billedIn > 0.02 {
		t.Errorf("sampled count %.1f a request vs billed %.1f", p.Models[0].InputPerReq, billedIn)
	}
	// Retried items weigh twice in the ledger's mean: allow 0.5%.
	if math.Abs(pAll.Models[0].InputPerReq-billedIn)/billedIn > 0.005 {
		t.Errorf("full count %.2f a request vs billed %.2f", pAll.Models[0].InputPerReq, billedIn)
	}
	if perItem := led.CostNanos * 500 / led.Requests; pAll.WorstCase < cost.Nanos(perItem) {
		t.Errorf("worst case with counts %s below billed %d", pAll.WorstCase, perItem)
	}
}
