package batch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Send sixty judge requests as Message Batches of at most twenty requests
// each across the three orgs of the origin-3org simulator preset (at 100×
// speed, its batches starting 5 API seconds after their create), harvest
// them into the run directory, and compare with what the simulator billed.
func Example() {
	cfg, _ := sim.Preset(sim.PresetOrigin3Org)
	cfg.Speed = 100
	for i := range cfg.Orgs {
		cfg.Orgs[i].Batch.QueueWaitS, cfg.Orgs[i].Batch.PerMinute = 5, 30000
	}
	api, err := sim.Start(cfg)
	if err != nil {
		panic(err)
	}
	defer api.Close()

	dir, _ := os.MkdirTemp("", "apidispatch-example")
	defer os.RemoveAll(dir)
	input := filepath.Join(dir, "requests.jsonl")
	f, _ := os.Create(input)
	workload.GenerateJudge(f, 60, 1, workload.GenOptions{})
	f.Close()

	ctx := context.Background()
	prices := cost.Default()
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: filepath.Join(dir, "run"), Prices: prices}, nil)
	if err != nil {
		panic(err)
	}
	defer job.Close()
	sink, err := rundir.OpenSink(ctx, job.ResultsPath, job.Store)
	if err != nil {
		panic(err)
	}
	defer sink.Close()

	rt, err := batch.New(batch.Config{
		Orgs: api.Server.Orgs(), BaseURL: api.URL, Speed: cfg.Speed,
		Store: job.Store, Sink: sink, Body: job.Body, Prices: prices, Events: job.Events,
		Size: 20,
	})
	if err != nil {
		panic(err)
	}
	res, err := rt.Run(ctx)
	if err != nil {
		panic(err)
	}
	agg, err := job.Store.Aggregate(ctx)
	if err != nil {
		panic(err)
	}
	billed, _, twice := sim.BatchBilling(api.Server.Ledger())
	fmt.Printf("batches created=%d harvested=%d open=%d requests=%d\n", res.Created, res.Harvested, res.Open, res.Requests)
	fmt.Printf("succeeded=%d errored=%d pending=%d\n", agg.Succeeded, agg.Errored, agg.Pending)
	fmt.Println("billed by the simulator = harvested cost:", billed == res.CostNanos, "billed twice:", twice)
	// Output:
	// batches created=3 harvested=3 open=0 requests=60
	// succeeded=60 errored=0 pending=0
	// billed by the simulator = harvested cost: true billed twice: 0
}
