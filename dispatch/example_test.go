package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Example runs fifty judge requests across the three orgs of the
// origin-3org simulator preset (at 100× speed) and prints the outcome.
func Example() {
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
	ctx := context.Background()
	prices := cost.Default()
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: filepath.Join(dir, "run"), Prices: prices}, nil)
	if err != nil {
		panic(err)
	}
	defer job.Close()
	eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: orgs, BaseURL: api.URL, Speed: cfg.Speed, Prices: prices})
	if err != nil {
		panic(err)
	}
	res, err := eng.Run(ctx)
	if err != nil {
		panic(err)
	}
	s := res.Summary
	fmt.Printf("complete=%v succeeded=%d errored=%d data-loss-check=%v\n", res.Complete, s.Succeeded, s.Errored, s.DataLoss.Passed)
	fmt.Printf("billed by the simulator = summary cost: %v\n", api.Server.LedgerTotals().CostNanos == s.Cost.TotalNanos)
	// Output:
	// complete=true succeeded=50 errored=0 data-loss-check=true
	// billed by the simulator = summary cost: true
}
