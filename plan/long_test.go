//go:build long

package plan_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// TestProjectionAccuracy is the measured check of the "done means":
// the judge workload is dispatched by the real engine against the
// simulator, first a pilot of 200 items (as 'run --pilot 200' does), then
// the rest, and the projections are compared with the billed total of the
// simulator's ledger:
//
//   - without a pilot (local input estimate, default output): within ±25%;
//   - re-projected after the 200-item pilot: within ±5%;
//   - the worst case is never below the billed total.
func TestProjectionAccuracy(t *testing.T) {
	t.Parallel()
	const n, pilot, speed = 2000, 200, 20
	prices := cost.Default()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = speed
	r, orgs := startSim(t, cfg)
	input, ws := writeJudge(t, n, 42)
	names := []string{}
	for _, o := range orgs {
		names = append(names, o.Name)
	}

	before, err := plan.Project(plan.Input{Workload: ws, Prices: prices, Orgs: names, Speed: speed})
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: prices}, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	run := func(maxSeq int64) *dispatch.Result {
		eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: orgs, BaseURL: r.URL, Speed: speed, Prices: prices, MaxSeq: maxSeq, SampleEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := eng.Run(ctx)
		if err != nil && maxSeq == 0 {
			t.Fatal(err)
		}
		return res
	}
	run(pilot)
	ps, err := plan.PilotFromStore(ctx, job.Store, pilot)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Succeeded != pilot || ps.Pending[workload.DefaultModel].N != n-pilot {
		t.Fatalf("pilot stats %+v", ps)
	}
	after, err := plan.Project(plan.Input{Workload: ws, Prices: prices, Orgs: names, Speed: speed, Pilot: ps})
	if err != nil {
		t.Fatal(err)
	}
	res := run(0)
	if !res.Complete || res.Summary.Succeeded != n {
		t.Fatalf("run incomplete: %+v", res.Summary)
	}

	led := r.Server.LedgerTotals()
	billed := cost.Nanos(led.CostNanos)
	if led.Requests != n || int64(billed) != res.Summary.Cost.TotalNanos {
		t.Fatalf("ledger %d requests %d n$, summary %d n$", led.Requests, billed, res.Summary.Cost.TotalNanos)
	}
	dev := func(p cost.Nanos) float64 { return float64(p-billed) / float64(billed) }
	t.Logf("billed (ledger) %s for %d items: %.1f input, %.1f output tokens a request", billed, n,
		float64(led.InputTokens)/n, float64(led.OutputTokens)/n)
	t.Logf("no pilot:  expected %s (%+.2f%%), worst case %s", before.ExpectedCost, 100*dev(before.ExpectedCost), before.WorstCase)
	t.Logf("pilot 200: expected %s (%+.2f%%), worst case %s", after.ExpectedCost, 100*dev(after.ExpectedCost), after.WorstCase)
	t.Logf("wall: projected %.1f s API (%.2f s at K=%d) before, %.1f s API after the pilot for the rest; measured %.2f s for everything (%.1f s API)",
		before.WallS, before.WallAtSpeedS, speed, after.WallS, res.Summary.WallS, res.Summary.APIEquivalentWallS)
	if d := dev(before.ExpectedCost); math.Abs(d) > 0.25 {
		t.Errorf("projection without a pilot is off by %+.1f%% (limit ±25%%)", 100*d)
	}
	if d := dev(after.ExpectedCost); math.Abs(d) > 0.05 {
		t.Errorf("projection after the pilot is off by %+.1f%% (limit ±5%%)", 100*d)
	}
	for _, p := range []*plan.Projection{before, after} {
		if p.WorstCase < billed || p.AllMaxTokens < billed {
			t.Errorf("worst case %s / all max_tokens %s below the billed %s", p.WorstCase, p.AllMaxTokens, billed)
		}
	}
}
