package ab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// StormTest configures the storm self-test: before anything is spent, the
// dispatcher is run on its own embedded simulator (origin-3org) under a
// sustained 429 storm on every org, and must end every item succeeded
// exactly once. Zero fields take the defaults noted.
type StormTest struct {
	// N items of the judge workload (default 2,000).
	N int
	// Speed is the simulator's K (default 50).
	Speed float64
	// Timeout bounds the whole test in real time (default 3 minutes); a
	// dispatcher that cannot finish in it fails the test.
	Timeout time.Duration
	// Sim adjusts the simulator (for tests); the storm is added when the
	// dispatcher starts.
	Sim func(*sim.Config)
	// Dispatch adjusts the dispatcher's configuration (for tests).
	Dispatch func(*dispatch.Config)
}

// A storm phase: a fault held for at least MinAPI of API time and until
// the simulator has refused at least MinHits requests during it, so that a
// slow machine cannot let the storm pass before the dispatcher meets it.
type stormPhase struct {
	fault   sim.Fault
	minAPI  time.Duration
	minHits int64
}

// StormFaults are the self-test's storm phases, in order: every request
// of every org refused with a 429 (retry-after 3 s), then half of them
// without retry-after, so both the lanes' holds and the back-off are
// exercised. Each lasts at least 30 s of API time and 100 (then 50)
// refusals.
func StormFaults() []sim.Fault {
	var out []sim.Fault
	for _, p := range stormPhases() {
		out = append(out, p.fault)
	}
	return out
}

func stormPhases() []stormPhase {
	return []stormPhase{
		{sim.Fault{ID: "selftest-storm", Kind: sim.FaultRateLimitStorm, RetryAfter: 3 * time.Second}, 30 * time.Second, 100},
		{sim.Fault{ID: "selftest-storm-half", Kind: sim.FaultRateLimitStorm, Probability: 0.5}, 30 * time.Second, 50},
	}
}

// driveStorm applies the storm phases to srv one after the other and
// clears the last one, or stops early when done closes.
func driveStorm(srv *sim.Server, done <-chan struct{}) error {
	refused := func() int64 {
		var n int64
		for _, o := range srv.Stats().Orgs {
			n += o.RateLimited429
		}
		return n
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, p := range stormPhases() {
		if _, err := srv.AddFault(p.fault); err != nil {
			return err
		}
		_, from := srv.Elapsed()
		base := refused()
		for {
			if _, now := srv.Elapsed(); now-from >= p.minAPI && refused()-base >= p.minHits {
				break
			}
			select {
			case <-done:
				srv.ClearFaults(p.fault.ID)
				return nil
			case <-tick.C:
			}
		}
		srv.ClearFaults(p.fault.ID)
	}
	return nil
}

// SelfTestResult is what the storm self-test saw.
type SelfTestResult struct {
	Passed         bool            `json:"passed"`
	Reason         string          `json:"reason"`
	N              int64           `json:"n"`
	Succeeded      int64           `json:"succeeded"`
	Errored        int64           `json:"errored"`
	Unfinished     int64           `json:"unfinished"`
	RateLimited429 int64           `json:"rate_limited_429"`
	Billed         int64           `json:"billed_requests"`
	DataLoss       rundir.DataLoss `json:"data_loss"`
	WallS          float64         `json:"wall_s"`
	SpeedFactor    float64         `json:"speed_factor"`
	Dir            string          `json:"dir"`
}

// RunStormTest runs the storm self-test in dir (emptied first) with the
// dispatcher configured like base (caps, prices, lane tuning); base's orgs,
// URL and speed are replaced by the test simulator's. It returns an error
// only when the test could not be run at all; a dispatcher that loses,
// duplicates or errors an item, or leaves one unfinished, gives a result
// with Passed false and the reason.
func RunStormTest(ctx context.Context, st StormTest, base dispatch.Config, dir string) (SelfTestResult, error) {
	if st.N <= 0 {
		st.N = 2000
	}
	if st.Speed <= 0 {
		st.Speed = 50
	}
	if st.Timeout <= 0 {
		st.Timeout = 3 * time.Minute
	}
	res := SelfTestResult{N: int64(st.N), SpeedFactor: st.Speed, Dir: dir}
	scfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		return res, err
	}
	scfg.Speed = st.Speed
	scfg.LedgerRetain = -1
	if st.Sim != nil {
		st.Sim(&scfg)
	}
	if err := os.RemoveAll(dir); err != nil {
		return res, err
	}
	if err := os.MkdirAll(dir, rundir.DirPerm); err != nil {
		return res, err
	}
	input := filepath.Join(dir, "requests.jsonl")
	if err := writeJudge(input, st.N, 0); err != nil {
		return res, err
	}
	srv, err := sim.Start(scfg)
	if err != nil {
		return res, err
	}
	defer srv.Close()

	prices := base.Prices
	if prices == nil {
		prices = cost.Default()
	}
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: filepath.Join(dir, "run"), Prices: prices}, nil)
	if err != nil {
		return res, err
	}
	defer job.Close()
	cfg := base
	cfg.Orgs = simOrgs(scfg, srv.Server)
	cfg.BaseURL, cfg.Speed, cfg.Prices = srv.URL, st.Speed, prices
	tr := apihttp.NewTransport(1024)
	defer tr.CloseIdleConnections()
	cfg.MaxCost, cfg.MaxSeq, cfg.Client = 0, 0, apihttp.NewClient(tr, 0, 0)
	cfg.Deadline = time.Now().Add(st.Timeout)
	cfg.SampleEvery = -1
	if st.Dispatch != nil {
		st.Dispatch(&cfg)
	}
	eng, err := dispatch.NewForJob(job, cfg)
	if err != nil {
		res.Reason = "the dispatcher refused its configuration: " + err.Error()
		return res, nil
	}
	tctx, cancel := context.WithTimeout(ctx, st.Timeout+30*time.Second)
	defer cancel()
	// The storm starts with the run, whatever the set-up took.
	stormDone := make(chan struct{})
	stormErr := make(chan error, 1)
	go func() { stormErr <- driveStorm(srv.Server, stormDone) }()
	t0 := time.Now()
	out, runErr := eng.Run(tctx)
	res.WallS = time.Since(t0).Seconds()
	close(stormDone)
	if err := <-stormErr; err != nil {
		return res, err
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.Billed = srv.Server.LedgerTotals().Requests
	if out != nil && out.Summary != nil {
		s := out.Summary
		res.Succeeded, res.Errored, res.Unfinished = s.Succeeded, s.Errored, s.Unfinished
		res.RateLimited429, res.DataLoss = s.RateLimited429, s.DataLoss
		job.WriteSummary(s)
	}
	var why []string
	switch {
	case out == nil || out.Summary == nil:
		why = append(why, fmt.Sprintf("the dispatcher failed: %v", runErr))
	default:
		if runErr != nil {
			why = append(why, fmt.Sprintf("the run did not complete: %v", runErr))
		}
		if res.Succeeded != res.N {
			why = append(why, fmt.Sprintf("%d of %d items succeeded (%d errored, %d unfinished)", res.Succeeded, res.N, res.Errored, res.Unfinished))
		}
		if !res.DataLoss.Passed {
			why = append(why, fmt.Sprintf("data-loss check failed: %d missing, %d duplicates, %d retryable marked terminal",
				res.DataLoss.Missing, res.DataLoss.Duplicates, res.DataLoss.RetryableMarkedTerminal))
		}
		if res.RateLimited429 == 0 {
			why = append(why, "the storm never hit (no 429 seen): the test proves nothing")
		}
		if res.Billed != res.N && len(why) == 0 {
			why = append(why, fmt.Sprintf("the simulator billed %d requests for %d items", res.Billed, res.N))
		}
	}
	if len(why) > 0 {
		res.Reason = strings.Join(why, "; ")
		return res, nil
	}
	res.Passed = true
	res.Reason = fmt.Sprintf("%d of %d items succeeded exactly once through %d 429s; data-loss check passed", res.Succeeded, res.N, res.RateLimited429)
	return res, nil
}

// simOrgs returns one org per simulated org, with its first key.
func simOrgs(cfg sim.Config, srv *sim.Server) []org.Org {
	orgs := srv.Orgs()
	for i := range orgs {
		orgs[i].Source = "embedded simulator"
	}
	return orgs
}

// writeJudge writes n judge requests (seed) to path atomically.
func writeJudge(path string, n int, seed int64) error {
	return rundir.WriteAtomic(path, 0o644, func(w io.Writer) error {
		return workload.GenerateJudge(w, n, seed, workload.GenOptions{})
	})
}
