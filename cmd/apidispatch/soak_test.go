//go:build long

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
)

// Soak sizes and speed. CI runs soakN items (soakRaceN under -race, where
// every instruction of both the dispatcher and the simulator is several
// times slower); APIDISPATCH_SOAK_N overrides it, e.g. 1000000 for the 1M
// soak of docs/benchmarks.md, and APIDISPATCH_SOAK_K overrides the speed factor.
//
// The preset serves about 3,500 requests per API-minute once its buckets
// (one API-minute each) are spent. At K=12 that is ~700 a second of wall
// time, which leaves the 2-core reference machine room for the simulator
// and the dispatcher together: 50,000 items take about 70 s a run.
const (
	soakN     = 30_000
	soakRaceN = 20_000
	soakK     = 12
	soakSeed  = 20260627

	// build3OrgCeiling is what the preset's limits allow the judge
	// workload, in requests per API-minute (sim.PresetBuild3Org: ~1,000 +
	// ~1,000 + ~1,500). A fault-free run well below it was starved of CPU,
	// not bound by the limits.
	build3OrgCeiling = 3500
)

// soakRun is one 'apidispatch run' of the soak, measured.
type soakRun struct {
	Summary rundir.Summary
	Wall    time.Duration // the child process, start to exit
	// MaxRSS is the child's peak resident set, KiB: the last VmHWM read
	// from /proc before it exited (sampled every 100 ms; VmHWM only
	// grows). Not the child's rusage: on Linux a child started by a Go
	// program (vfork) inherits the parent's high-water mark at exec, so
	// its ru_maxrss is at least the test process's own peak, which holds
	// the simulator. (The 1M soak first reported 258 MiB "with faults"
	// that way: the parent's, after a million-request fault-free run.)
	MaxRSS int64
	// PeakAt is the share of the items the simulator had billed when the
	// child's resident set (VmRSS) was sampled at its highest.
	PeakAt float64
	Ledger sim.LedgerTotals
	Sim429 int64 // 429s the simulator answered
	Check  soak.Check
	Capped bool // the spend cap was added during the run
}

// TestSoak pushes N items through the build-3org (limit-bound) preset at
// speed K twice, as a child 'apidispatch run' each time so that its peak
// RSS is its own: once without faults, then with soak.DefaultMix's faults
// drawn for a run as long as the first (529s, 500s with JSON and HTML
// bodies, resets and truncated bodies after billing, short 429 storms on
// random orgs, one org's spend cap hit once 95% of the items are billed).
// Both runs: every custom_id exactly once in results.jsonl, nothing
// errored, the data-loss check passed, exit 0. With faults: every fault
// struck, requests billed twice (the ledger) are no more than the attempts
// the summary says may have been billed twice, and throughput in
// completions per API-minute is within 10% of the fault-free run's — when
// the fault-free run was bound by the limits; under -race, or on a machine
// too busy for it, both runs are CPU-bound and the ratio is only logged.
// The figures are logged (go test -v) for docs/benchmarks.md.
//
// The 1M soak of docs/benchmarks.md:
//
//	APIDISPATCH_SOAK_N=1000000 go test ./cmd/apidispatch -run '^TestSoak$' -v -timeout 3h
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: long-running")
	}
	t.Parallel()
	n := soakN
	if raceBuild {
		n = soakRaceN
	}
	k := float64(soakK)
	if v := os.Getenv("APIDISPATCH_SOAK_N"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 1 {
			t.Fatalf("APIDISPATCH_SOAK_N=%q: want a positive number of items", v)
		}
		n = i
	}
	if v := os.Getenv("APIDISPATCH_SOAK_K"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) {
			t.Fatalf("APIDISPATCH_SOAK_K=%q: want a positive speed factor", v)
		}
		k = f
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "soak.jsonl")
	writeJudge(t, input, n)

	free := runSoak(t, input, filepath.Join(dir, "free"), n, k, soak.Plan{})
	logSoak(t, "fault-free", n, k, free)
	checkSoak(t, "fault-free", n, free)
	if free.Ledger.Duplicates != 0 || free.Summary.PossibleDuplicateBilling != 0 {
		t.Errorf("fault-free: %d requests billed twice, %d possibly", free.Ledger.Duplicates, free.Summary.PossibleDuplicateBilling)
	}

	cfg, _ := sim.Preset(sim.PresetBuild3Org)
	orgs := make([]string, len(cfg.Orgs))
	for i, o := range cfg.Orgs {
		orgs[i] = o.Name
	}
	span := time.Duration(free.Summary.APIEquivalentWallS * float64(time.Second))
	plan, err := soak.DefaultMix().Schedule(soakSeed, orgs, span)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("faults: soak.DefaultMix over the fault-free run's %.0f API-s: %d 429 storms; org %s's spend cap hit once %.0f%% of the items are billed",
		span.Seconds(), len(plan.Storms), plan.CapOrg, 100*plan.CapAfter)

	hit := runSoak(t, input, filepath.Join(dir, "faults"), n, k, plan)
	logSoak(t, "with faults", n, k, hit)
	checkSoak(t, "with faults", n, hit)
	s := hit.Summary
	if s.RateLimited429 == 0 || s.Overloaded529 == 0 || s.OtherRetries == 0 || s.PossibleDuplicateBilling == 0 {
		t.Errorf("with faults: a fault never struck: 429s %d, 529s %d, other retries %d, possibly billed twice %d",
			s.RateLimited429, s.Overloaded529, s.OtherRetries, s.PossibleDuplicateBilling)
	}
	capped := false
	for _, l := range s.Lanes {
		capped = capped || (l.Org == plan.CapOrg && l.Disabled != "")
	}
	switch {
	case !hit.Capped:
		t.Errorf("with faults: org %s's spend cap was never added", plan.CapOrg)
	case !capped:
		t.Errorf("with faults: org %s's spend cap never stopped its lanes: %+v", plan.CapOrg, s.Lanes)
	}
	if hit.Ledger.Duplicates > s.PossibleDuplicateBilling {
		t.Errorf("with faults: the ledger billed %d requests twice, the summary counts only %d that may have been",
			hit.Ledger.Duplicates, s.PossibleDuplicateBilling)
	}
	ratio := s.APIRequestsPerMin / free.Summary.APIRequestsPerMin
	t.Logf("throughput with faults / fault-free: %.0f / %.0f completions per API-minute = %.3f; peak RSS %.1f / %.1f MiB",
		s.APIRequestsPerMin, free.Summary.APIRequestsPerMin, ratio, float64(hit.MaxRSS)/1024, float64(free.MaxRSS)/1024)
	switch {
	case raceBuild:
		// Under -race the simulator and the dispatcher are CPU-bound well
		// below the preset's limits: the ratio measures the machine, not
		// the dispatcher. Everything else above still holds.
		t.Logf("-race: throughput ratio not asserted (CPU-bound, not limit-bound)")
	case free.Summary.APIRequestsPerMin < 0.85*build3OrgCeiling:
		// The same on a machine too busy to reach the limits.
		t.Logf("NOT ASSERTED: the fault-free run reached only %.0f of the preset's ~%d completions per API-minute: CPU-bound here, so the ratio measures the machine",
			free.Summary.APIRequestsPerMin, build3OrgCeiling)
	case ratio < 0.9:
		t.Errorf("throughput with faults is %.1f%% of the fault-free run's, want at least 90%%", 100*ratio)
	}
}

// runSoak runs 'apidispatch run' on input in runDir against a fresh
// build-3org simulator at speed k with plan's faults, and measures it.
func runSoak(t *testing.T, input, runDir string, n int, k float64, plan soak.Plan) soakRun {
	t.Helper()
	cfg, err := sim.Preset(sim.PresetBuild3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = k
	cfg.Seed = soakSeed
	cfg.LedgerRetain = -1 // totals and duplicate counts only: flat memory at 1M
	cfg.Faults = plan.Faults
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	c := exec.CommandContext(ctx, os.Args[0], "-test.run=^$", "--", "run", input, "--run-dir", runDir,
		"--base-url", r.URL, "--speed", strconv.FormatFloat(k, 'g', -1, 64), "--quiet", "--json", "--confirm")
	c.Env = cliEnv(r)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	peakAt := make(chan float64, 1)
	hwm := make(chan int64, 1)
	go func() {
		var peak, high int64
		at := 0.0
		defer func() { peakAt <- at; hwm <- high }()
		for {
			rss, hw, ok := procRSS(c.Process.Pid)
			if !ok {
				return
			}
			high = max(high, hw)
			if rss > peak {
				peak, at = rss, float64(r.Server.LedgerTotals().Requests)/float64(n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// The storms are timed from the run's first billed request (however
	// long the child takes to validate its input), and the spend cap comes
	// once CapAfter of the items are billed, whenever that is.
	capped := make(chan bool, 1)
	watch, stopWatch := context.WithCancel(ctx)
	go func() {
		added, err := soak.AddWhenBilled(watch, r.Server, 1, 5*time.Millisecond, plan.Storms...)
		if added && err == nil && plan.CapOrg != "" {
			added, err = soak.AddWhenBilled(watch, r.Server, int64(plan.CapAfter*float64(n)), 20*time.Millisecond, plan.CapFault())
		}
		if err != nil {
			t.Error(err)
		}
		capped <- added && plan.CapOrg != ""
	}()
	err = c.Wait()
	run := soakRun{Wall: time.Since(start), PeakAt: <-peakAt, MaxRSS: <-hwm}
	stopWatch()
	run.Capped = <-capped
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("run: exit %d\nstdout: %s\nstderr: %s", ee.ExitCode(), tail(out.String()), tail(errb.String()))
		}
		t.Fatal(err)
	}
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &run.Summary); err != nil {
		t.Fatalf("summary: %v\n%s", err, tail(out.String()))
	}
	run.Ledger = r.Server.LedgerTotals()
	for _, o := range r.Server.Stats().Orgs {
		run.Sim429 += o.RateLimited429
	}
	if run.Check, err = soak.CheckResults(input, filepath.Join(runDir, rundir.ResultsFile)); err != nil {
		t.Fatal(err)
	}
	return run
}

// checkSoak asserts that nothing was lost, repeated or errored.
func checkSoak(t *testing.T, name string, n int, r soakRun) {
	t.Helper()
	c, s := r.Check, r.Summary
	if c.Lost() || c.Inputs != int64(n) || c.Succeeded != int64(n) {
		t.Errorf("%s: results of %d inputs: %d lines, %d succeeded, %d missing, %d repeated, %d unknown (e.g. %v)",
			name, c.Inputs, c.Lines, c.Succeeded, c.Missing, c.Repeated, c.Unknown, c.Examples)
	}
	if c.Errored != 0 || s.Errored != 0 {
		t.Errorf("%s: %d errored in results.jsonl (%v), %d in the summary (%v); no fault of the soak is terminal",
			name, c.Errored, c.ErroredByType, s.Errored, s.ErroredByType)
	}
	if !s.DataLoss.Passed || s.Succeeded != int64(n) || s.Unfinished != 0 {
		t.Errorf("%s: summary: %d succeeded, %d unfinished, data loss %+v", name, s.Succeeded, s.Unfinished, s.DataLoss)
	}
}

func logSoak(t *testing.T, name string, n int, k float64, r soakRun) {
	t.Helper()
	s := r.Summary
	t.Logf("%s: N=%d K=%g: wall %.1f s (engine %.1f s), API-equivalent %.1f s = %.1f API-min; %.0f completions per API-minute (%.0f per wall second); peak RSS %.1f MiB (sampled highest at %.0f%% billed); "+
		"attempts %d, 429s %d (simulator %d), 529s %d, other retries %d; billed twice %d (ledger) vs possible_duplicate_billing %d; cost $%.2f",
		name, n, k, r.Wall.Seconds(), s.WallS, s.APIEquivalentWallS, s.APIEquivalentWallS/60, s.APIRequestsPerMin, s.RequestsPerMin/60,
		float64(r.MaxRSS)/1024, 100*r.PeakAt, s.Attempts, s.RateLimited429, r.Sim429, s.Overloaded529, s.OtherRetries,
		r.Ledger.Duplicates, s.PossibleDuplicateBilling, s.Cost.Total)
}

// procRSS reads a live process's resident set and its high-water mark
// (VmRSS and VmHWM, KiB) from /proc; false once the process is gone (or
// where there is no /proc).
func procRSS(pid int) (rss, hwm int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, _ := strings.Cut(line, ":")
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &hwm
		default:
			continue
		}
		if f := strings.Fields(rest); len(f) > 0 {
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				*dst, ok = v, true
			}
		}
	}
	return rss, hwm, ok
}
