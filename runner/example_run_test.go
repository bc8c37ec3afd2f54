package runner_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Run fifty judge requests by the sync route across the three orgs of the
// origin-3org simulator preset (at 100× speed), as 'apidispatch run' does,
// and read how the run stopped and what it cost.
func ExampleRun() {
	cfg, _ := sim.Preset(sim.PresetOrigin3Org)
	cfg.Speed = 100
	api, err := sim.Start(cfg)
	if err != nil {
		panic(err)
	}
	defer api.Close()

	dir, _ := os.MkdirTemp("", "apidispatch-example")
	defer os.RemoveAll(dir)
	input := filepath.Join(dir, "requests.jsonl")
	f, _ := os.Create(input)
	workload.GenerateJudge(f, 50, 1, workload.GenOptions{})
	f.Close()

	var orgs []org.Org
	for _, o := range cfg.Orgs {
		orgs = append(orgs, org.Org{Name: o.Name, Key: org.NewKey(api.Server.Keys()[o.Name][0])})
	}
	prices := cost.Default()
	out := runner.Run(context.Background(), runner.Config{
		Input:  input,
		RunDir: filepath.Join(dir, "run"),
		Prices: prices,
		Route:  runner.RouteSync,
		Sync:   dispatch.Config{Orgs: orgs, BaseURL: api.URL, Speed: cfg.Speed, Prices: prices},
	})
	if out.Err != nil {
		panic(out.Err)
	}
	s := out.Summary
	fmt.Println(out.Stop.Kind, "exit", out.Code())
	fmt.Printf("succeeded=%d errored=%d data-loss-check=%v\n", s.Succeeded, s.Errored, s.DataLoss.Passed)
	fmt.Println("results in the run directory:", filepath.Dir(out.ResultsPath) == out.Dir)
	fmt.Println("billed by the simulator = summary cost:", api.Server.LedgerTotals().CostNanos == s.Cost.TotalNanos)
	// Output:
	// complete exit 0
	// succeeded=50 errored=0 data-loss-check=true
	// results in the run directory: true
	// billed by the simulator = summary cost: true
}
