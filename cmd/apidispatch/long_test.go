//go:build long

// The long tests of the command: several processes on one Redis, kill -9
// and full disks of batch runs, signals, two cache writers, the A/B batch
// arm. They build only with -tags long (the full test command and CI);
// soak_test.go, shared_test.go and diskfull_linux_test.go are long as a
// whole.

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/apidispatch/apidispatch/ab"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// twoShared starts two 'apidispatch run' processes of n items each on the
// same simulator keys, sharing Redis: process 0 at url0, process 1 at url1
// (the same server, one of them maybe through a proxy).
func twoShared(t *testing.T, r *sim.Running, n int, url0, url1 string) *sharedFleet {
	t.Helper()
	f := &sharedFleet{r: r, n: n}
	base := t.TempDir()
	for i := range 2 {
		in := filepath.Join(base, fmt.Sprintf("req%d.jsonl", i))
		writeJudge(t, in, n)
		f.ins = append(f.ins, in)
		f.dirs = append(f.dirs, filepath.Join(base, fmt.Sprintf("run%d", i)))
	}
	for i, u := range []string{url0, url1} {
		f.redis = u
		f.cmds = append(f.cmds, f.start(t, i))
	}
	return f
}

// maxInFlightPerKey is the simulator's own highest count of requests in
// flight at once, per key.
func maxInFlightPerKey(r *sim.Running) []int64 {
	var m []int64
	for _, o := range r.Server.Stats().Orgs {
		m = append(m, o.MaxInFlight)
	}
	return m
}

// TestSharedPausedProcessStaysUnderTheCap is issue 20's case 1 from
// outside: two shared processes on the same three keys; one is stopped
// (SIGSTOP) in the middle of its run until the other has taken its slots
// (the simulator counts more than one process's share in flight on a key,
// which Redis grants only once the paused one's lease and grace are over),
// then continued (SIGCONT). The simulator's own maximum in flight per key
// stays at or under the cap of 100, and both runs write every custom_id
// once. Before the fence, the continued process admitted on its old grant
// on top of the other's whole cap; before the grace covered the longest
// request, the paused process's last requests were still running on the
// server when the other took their slots; before the send-time check, a
// request admitted just before the pause went out after it.
func TestSharedPausedProcessStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	n := envInt("APIDISPATCH_FENCE_N", 6000)
	r, _, _ := simWith(t, 4, 1, func(*sim.Config) {})
	u := ownRedis(t)
	f := twoShared(t, r, n, u, u)
	waitBilled(t, r, n/2)
	if err := f.cmds[0].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	before := r.Server.LedgerTotals().Requests
	// Wait until the other process has reclaimed the paused one's slots
	// on every lane (one live lease left in Redis), then a second more for
	// it to fill them.
	took := waitReclaimed(t, u, paused, 40*time.Second, func() { f.cmds[0].Process.Signal(syscall.SIGCONT) })
	time.Sleep(time.Second)
	pausedFor := time.Since(paused)
	during := r.Server.LedgerTotals().Requests - before
	if err := f.cmds[0].Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.wait(t)
	maxIn := maxInFlightPerKey(r)
	t.Logf("paused %v mid-run (the other took its slots after %v); %d requests billed meanwhile (by the other); max in flight per key %v (cap 100)",
		pausedFor.Round(time.Millisecond), took.Round(time.Millisecond), during, maxIn)
	for i, m := range maxIn {
		if m > 100 {
			t.Errorf("key %d: %d in flight at once, cap 100", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, n)
	}
}

// waitReclaimed waits until every shared lane in Redis at redisURL has
// one lease left (another process reclaimed the silent one's slots) and
// reports how long after since that was; past limit it calls undo and
// fails.
func waitReclaimed(t *testing.T, redisURL string, since time.Time, limit time.Duration, undo func()) time.Duration {
	t.Helper()
	o, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	for {
		if time.Since(since) > limit {
			undo()
			t.Fatalf("%v and the other process never reclaimed the silent one's slots", limit)
		}
		time.Sleep(50 * time.Millisecond)
		keys, err := c.Keys(t.Context(), "apidispatch:v1:lane:*:exp").Result()
		if err != nil {
			undo()
			t.Fatal(err)
		}
		left := 0
		for _, k := range keys {
			left = max(left, int(c.ZCard(t.Context(), k).Val()))
		}
		if len(keys) > 0 && left <= 1 {
			return time.Since(since)
		}
	}
}

// TestSharedCutOffProcessStaysUnderTheCap is issue 20's case 2 from
// outside: two shared processes on the same three keys; process 0 reaches
// Redis through a proxy that goes dark for 10 s in the middle of its run,
// while process 1 keeps Redis (and both keep the API). The simulator's
// own maximum in flight per key stays at or under the cap of 100, and both
// runs write every custom_id once. Before the fence, the cut-off process
// went on on a local share of its own while Redis gave its slots away.
func TestSharedCutOffProcessStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	n := envInt("APIDISPATCH_FENCE_N", 6000)
	r, _, _ := simWith(t, 4, 1, func(*sim.Config) {})
	u := ownRedis(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	px := netproxy.Start(t, pu.Host)
	viaProxy := *pu
	viaProxy.Host = px.Addr
	f := twoShared(t, r, n, viaProxy.String(), u)
	waitBilled(t, r, n/2)
	px.BlackHole(true)
	before := r.Server.LedgerTotals().Requests
	time.Sleep(10 * time.Second)
	during := r.Server.LedgerTotals().Requests - before
	px.BlackHole(false)
	f.wait(t)
	maxIn := maxInFlightPerKey(r)
	t.Logf("process 0 cut off from Redis for 10 s mid-run; %d requests billed meanwhile; max in flight per key %v (cap 100)", during, maxIn)
	for i, m := range maxIn {
		if m > 100 {
			t.Errorf("key %d: %d in flight at once, cap 100", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, n)
	}
	ev, _ := os.ReadFile(filepath.Join(f.dirs[0], rundir.EventsFile))
	if !strings.Contains(string(ev), "stopped answering") || !strings.Contains(string(ev), "rejoined") {
		t.Errorf("process 0's events lack the outage and the rejoin")
	}
}

// TestSharedBatchRoutePilotStaysUnderTheCap pins campaign seed 142: with
// --route batch, --shared was dropped (the batch route holds no request
// slots), but --pilot sends its first items by sync, so every process's
// pilot took the whole cap of each key on its own (10 in flight on a cap
// of 6 with three processes). The pilot now shares the key's budget.
func TestSharedBatchRoutePilotStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	r, _, _ := simWith(t, 10, 1, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.CancelS = 20, 2
		}
	})
	f := startFleet(t, r, 2, 200, ownRedis(t), "--route", "batch", "--pilot", "150", "--cap", "sonnet=3,haiku=3,opus=3,other=3")
	f.wait(t)
	for i, m := range maxInFlightPerKey(r) {
		if m > 3 {
			t.Errorf("key %d: %d in flight at once during the pilots, cap 3", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, 200)
	}
}

// queued is the number of batch requests the simulator has yet to process.
func queued(r *sim.Running) (q int64) {
	for _, st := range r.Server.BatchStats() {
		q += st.Queued
	}
	return q
}

// TestBatchKillNineThenResume kills 'apidispatch run --route batch' with
// SIGKILL twenty times at random moments (some creates lose their answer
// too), restarting it after each, then runs the same command to the end.
// Every custom_id is written once; the simulator's batches hold each
// request once (nothing created twice); no request is billed twice; the
// lost creates were adopted; and the summary's cost is the ledger's.
func TestBatchKillNineThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const n, size, k = 5000, 250, 100
	kills := 20
	if s := os.Getenv("APIDISPATCH_KILLS"); s != "" {
		kills, _ = strconv.Atoi(s)
	}
	// Each org's processing queue holds two batches, so batches are
	// created all along the run, as earlier ones end, and a kill can
	// strike a create as well as a poll or a harvest; creates beyond the
	// queue are refused with 429, as the API does.
	r, input, runDir := simWith(t, k, n, func(c *sim.Config) {
		c.Faults = []sim.Fault{{Kind: sim.FaultBatchCreateLost500, Probability: 0.3}}
		for i := range c.Orgs {
			c.Orgs[i].Batch.Queue = 2 * size
		}
	})
	args := []string{"run", input, "--route", "batch", "--batch-size", strconv.Itoa(size), "--run-dir", runDir,
		"--base-url", r.URL, "--speed", strconv.Itoa(k), "--quiet"}
	rng := rand.New(rand.NewPCG(3, 4))
	phases := map[string]int{}
	for i := range kills {
		c, out, exited := startCLI(t, r, args...)
		select {
		case <-exited:
			t.Fatalf("run %d ended before its kill:\n%s", i+1, tail(out.String()))
		case <-time.After(time.Duration(50+rng.IntN(550)) * time.Millisecond):
		}
		if err := c.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-exited
		phases[phaseOf(t, runDir)]++
	}
	c := cliCmd(r, append(args, "--json")...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		t.Fatalf("final run: %v\n%s", err, tail(errb.String()))
	}
	requireEachOnce(t, runDir, n)
	var s rundir.Summary
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, out.String())
	}
	nanos, billed, twice := batchLedger(r)
	requests, created := simBatchRequests(r)
	t.Logf("%d kills by phase %v; the simulator created %d batches holding %d requests, billed %d (%d twice); %d adopted after a lost create, %d abandoned",
		kills, phases, created, requests, billed, twice, s.Batches.Adopted, s.Batches.Abandoned)
	if !s.DataLoss.Passed || s.Succeeded != n {
		t.Fatalf("summary: %d succeeded, data loss %+v", s.Succeeded, s.DataLoss)
	}
	if requests != n || billed != n || twice != 0 {
		t.Fatalf("the simulator's batches hold %d requests and it billed %d (%d twice): want %d, each once", requests, billed, twice, n)
	}
	if s.Cost.TotalNanos != nanos {
		t.Fatalf("summary cost %d nanos, ledger %d", s.Cost.TotalNanos, nanos)
	}
	if s.Batches.Adopted == 0 {
		t.Fatal("no lost create was adopted: the fault never struck")
	}
}

// TestBatchCancelKeepsPartialResults: --cancel cancels the run's open
// batches mid-processing, harvests what they finished and leaves the rest
// pending (exit 4); the same command without --cancel then completes it.
// The batches stall after 30 % of their requests (sim.FaultBatchStall), so
// they are mid-processing when --cancel comes however long a loaded machine
// takes to start it (a fixed two seconds into 7.5 s of processing was
// outrun: the batches had ended, exit 0).
func TestBatchCancelKeepsPartialResults(t *testing.T) {
	t.Parallel()
	const n, stallAt = 1500, 0.3
	r, input, runDir := slowBatches(t, n)
	if _, err := r.Server.AddFault(sim.Fault{ID: "stall", Kind: sim.FaultBatchStall, Fraction: stallAt}); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", input, "--route", "batch", "--run-dir", runDir, "--base-url", r.URL, "--speed", "20", "--quiet"}
	c, _, exited := startUntilBatches(t, r, 3, args...)
	// The batches created, the next ones (after --cancel) run to their end.
	r.Server.ClearFaults("stall")
	for queued(r) > int64(n*(1-stallAt)) {
		select {
		case <-exited:
			t.Fatal("the run ended before its batches stalled")
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.Process.Signal(os.Interrupt)
	<-exited
	code, stdout, stderr := runCmdOut(t, r, append(args, "--cancel", "--json")...)
	if code != exitIncomplete {
		t.Fatalf("--cancel: exit %d; want 4\n%s", code, tail(stderr))
	}
	var s rundir.Summary
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), &s); err != nil {
		t.Fatal(err)
	}
	if s.Succeeded == 0 || s.Unfinished == 0 || s.Succeeded+s.Unfinished != n || s.Batches.Open != 0 || s.Batches.Harvested != 3 {
		t.Fatalf("after --cancel: %d succeeded, %d unfinished, batches %+v; want partial results, the rest pending, none open", s.Succeeded, s.Unfinished, s.Batches)
	}
	partial := s.Succeeded
	if code, _, stderr := runCmdOut(t, r, args...); code != exitOK {
		t.Fatalf("the run after --cancel: exit %d\n%s", code, tail(stderr))
	}
	requireEachOnce(t, runDir, n)
	_, billed, twice := batchLedger(r)
	if billed != n || twice != 0 {
		t.Fatalf("billed %d batch requests (%d twice); want %d once each", billed, twice, n)
	}
	t.Logf("--cancel kept %d of %d results; the next run sent the other %d", partial, n, n-int(partial))
}

// Two processes filling one cache at once: no error, no lost or duplicated
// entry.
func TestTwoProcessesFillOneCache(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const n = 1500
	r, input, runDir := simAndInput(t, 50, n)
	cachePath := filepath.Join(t.TempDir(), "cache.db")
	var wg sync.WaitGroup
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			// The write mode: both send every item and store every success.
			c := cliCmd(r, "run", input, "--run-dir", runDir+string(rune('a'+i)), "--base-url", r.URL, "--speed", "50", "--quiet", "--cache", cachePath, "--cache-mode", "write")
			outs[i], errs[i] = c.CombinedOutput()
		})
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("process %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	// Each process sent every item once; on a loaded machine an attempt
	// may time out after the API billed it and be sent again, which its
	// summary counts as possible duplicate billing.
	var maybeTwice int64
	for i := range 2 {
		maybeTwice += readSummary(t, runDir+string(rune('a'+i))).PossibleDuplicateBilling
	}
	if got := r.Server.LedgerTotals().Requests; got < 2*n || got > 2*n+maybeTwice {
		t.Fatalf("%d requests, want %d (and up to %d more the summaries count as possibly billed twice)", got, 2*n, maybeTwice)
	}
	code, out, errOut := runCLI("cache", "stats", "--json", "--cache", cachePath)
	var st struct {
		Entries int64 `json:"entries"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Entries != n {
		t.Fatalf("cache stats after two writers: exit %d, %s %s; want %d entries", code, out, errOut, n)
	}
}

// TestBatchSecondSignalExitsAtOnce: a second signal on the batch route
// exits at once (exit 4, saying so); the run directory stays consistent:
// the same command then completes every item once, none billed twice.
func TestBatchSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	const n = 1500
	r, input, runDir := slowBatches(t, n)
	args := []string{"run", input, "--route", "batch", "--run-dir", runDir, "--base-url", r.URL, "--speed", "20", "--quiet"}
	c, out, exited := startUntilBatches(t, r, 3, args...)
	time.Sleep(100 * time.Millisecond)
	// Two signals of one kind may merge while pending: the second is a
	// SIGTERM, which the run treats alike.
	c.Process.Signal(os.Interrupt)
	c.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not exit within 10 s of the second SIGINT")
	}
	if code := c.ProcessState.ExitCode(); code != exitIncomplete || !strings.Contains(out.String(), "abandoning: exiting now") {
		t.Fatalf("exit %d; want 4, saying it exits at once:\n%s", code, tail(out.String()))
	}
	if code, _, stderr := runCmdOut(t, r, args...); code != exitOK {
		t.Fatalf("the resumed run: exit %d\n%s", code, tail(stderr))
	}
	requireEachOnce(t, runDir, n)
	if _, billed, twice := batchLedger(r); billed != n || twice != 0 {
		t.Fatalf("billed %d (%d twice); want %d, none twice", billed, twice, n)
	}
}

// TestMaxCostThenResume: --max-cost at 30% of the workload's cost stops the
// run with exit 4 before the simulator has billed more than the cap;
// resuming without a cap completes the rest with no custom_id twice, and the
// summary's cost equals the ledger's to the nano-dollar.
func TestMaxCostThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const n = 2000
	r, input, runDir := simAndInput(t, 50, n)
	cfg := r.Server.Config()
	dir := filepath.Dir(input)
	base := []string{"run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet", "--json"}

	// What the whole workload costs, measured on a second simulator.
	full := func() int64 {
		r2, err := sim.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r2.Close()
		c := cliCmd(r2, "run", input, "--run-dir", filepath.Join(dir, "full"), "--base-url", r2.URL, "--speed", "50", "--quiet")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("full run: %v\n%s", err, out)
		}
		return r2.Server.LedgerTotals().CostNanos
	}()
	capNanos := full * 3 / 10
	capUSD := fmt.Sprintf("%.6f", float64(capNanos)/1e9)

	c := cliCmd(r, append(base, "--max-cost", capUSD)...)
	out, err := c.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitIncomplete {
		t.Fatalf("capped run: want exit 4, got %v\n%s", err, out)
	}
	billed := r.Server.LedgerTotals().CostNanos
	if billed > capNanos {
		t.Fatalf("billed %d nanos, over the cap %d", billed, capNanos)
	}
	if billed < capNanos/2 {
		t.Fatalf("billed only %d of a %d cap: the cap stopped far too early", billed, capNanos)
	}

	// A cap stops admission; it never abandons a request, so nothing is
	// billed twice and the ledger's whole bill is the summary's.
	if _, dups := resumeAndAudit(t, r, base, runDir, n); dups != 0 {
		t.Fatalf("%d requests billed twice", dups)
	}
	t.Logf("full workload $%.6f; cap $%s; billed before stopping $%.6f", float64(full)/1e9, capUSD, float64(billed)/1e9)
}

// TestSignals: the first SIGINT stops admission and lets requests in flight
// finish (exit 4, resumable); a second abandons them at once. Either way the
// run resumes to completion with every custom_id once.
func TestSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	for _, twice := range []bool{false, true} {
		t.Run(fmt.Sprintf("twice=%v", twice), func(t *testing.T) {
			t.Parallel()
			var faults []sim.Fault
			if twice {
				// Requests that take ten minutes: only a second signal ends the run soon.
				faults = []sim.Fault{{Kind: sim.FaultSlow, ExtraLatency: 50 * time.Minute}}
			}
			const n = 3000
			r, input, runDir := simAndInput(t, 5, n, faults...)
			args := []string{"run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "5", "--quiet", "--grace", "30s"}
			c := cliCmd(r, args...)
			var out bytes.Buffer
			c.Stdout, c.Stderr = &out, &out
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			// Signal only once the run is sending (its results file or first
			// request exists): before that the child may not be listening yet.
			deadline := time.Now().Add(60 * time.Second)
			for r.Server.Stats().Billed.Requests == 0 && r.Server.Stats().Orgs[0].InFlight == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond)
			c.Process.Signal(os.Interrupt)
			if twice {
				time.Sleep(200 * time.Millisecond)
				c.Process.Signal(os.Interrupt)
			}
			t0 := time.Now()
			err := c.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitIncomplete {
				t.Fatalf("want exit 4, got %v\n%s", err, out.String())
			}
			if twice && time.Since(t0) > 10*time.Second {
				t.Fatalf("a second signal took %v to end the run", time.Since(t0))
			}
			// Resume, without the slow fault.
			r.Server.ClearFaults()
			c = cliCmd(r, args...)
			if b, err := c.CombinedOutput(); err != nil {
				t.Fatalf("resume: %v\n%s", err, b)
			}
			requireEachOnce(t, runDir, n)
		})
	}
}

// TestABBatchArm: 'ab --sim --arms legacy,dispatcher,batch' runs the batch
// arm too: complete, each custom_id once, its cost from usage equal to the
// simulator's ledger and exactly half the dispatcher's.
func TestABBatchArm(t *testing.T) {
	t.Parallel()
	const n = 600
	dir := filepath.Join(t.TempDir(), "ab")
	var srv *sim.Running
	tune := func(c *ab.Config) {
		smallStorm(c)
		c.OnSim = func(r *sim.Running) { srv = r }
	}
	var out, errb bytes.Buffer
	args := []string{"--sim", "--n", fmt.Sprint(n), "--speed", "400", "--dir", dir, "--arms", "legacy,dispatcher,batch", "--json", "--quiet"}
	if code := runAB(context.Background(), args, &out, &errb, tune); code != exitOK {
		t.Fatalf("exit %d; stderr %s", code, errb.String())
	}
	var res ab.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("stdout is not the result JSON: %v\n%s", err, out.String())
	}
	d, c := res.Arms.Dispatcher, res.Arms.Batch
	if !res.Complete || c == nil || !c.Complete || c.Succeeded != n || !c.DataLoss.Passed || c.DataLoss.Duplicates != 0 || c.DataLoss.Missing != 0 {
		t.Fatalf("batch arm %+v", c)
	}
	var ledger, billed int64
	for _, e := range srv.Server.Ledger() {
		if e.ServiceTier == "batch" {
			ledger += e.CostNanos
			billed++
		}
	}
	if billed != n || ledger != c.CostNanos || c.LedgerCostNanos == nil || *c.LedgerCostNanos != c.CostNanos {
		t.Fatalf("batch arm %d nanos; the simulator billed %d batch requests for %d nanos", c.CostNanos, billed, ledger)
	}
	if d.Succeeded != n || 2*c.CostNanos != d.CostNanos || res.BatchCostRatio != 0.5 {
		t.Fatalf("batch %d nanos, dispatcher %d nanos, ratio %v: want exactly half", c.CostNanos, d.CostNanos, res.BatchCostRatio)
	}
	if res.Speedup != math.Round(res.Arms.Baseline.WallS/d.WallS*1000)/1000 || res.Config.Arms == nil {
		t.Fatalf("speed-up %v from walls %v / %v", res.Speedup, res.Arms.Baseline.WallS, d.WallS)
	}
	if !strings.Contains(errb.String(), "batch arm (round 1) done") || !strings.Contains(errb.String(), "batch arm at batch prices") {
		t.Fatalf("stderr lacks the batch arm's story:\n%s", errb.String())
	}
}

// TestKillNineThenResume: the twenty kills in one 20,000-item run
// (APIDISPATCH_KILL_N and APIDISPATCH_KILLS override either).
func TestKillNineThenResume(t *testing.T) { killNineThenResume(t, 20_000, 20) }

// TestOpenAIBatchKillNineThenResume: 'run --route batch' of a GPT judge
// job over three OpenAI orgs, killed with SIGKILL at random moments and
// resumed each time, then run to its end: each custom_id once in the
// results, each request billed once by the simulator, the summary's cost
// its ledger to the nano-dollar. Each org's enqueued-token limit holds
// about one batch, which the route learns from the batches that fail with
// token_limit_exceeded (their items are sent again once the queue
// drains), so batches are created all along the run and a kill can strike
// an upload or a create as well as a poll or a harvest; 30 % of the
// creates lose their answer after the batch exists, and are adopted only
// once their input file proves them ours.
func TestOpenAIBatchKillNineThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	const size, k = 250, 100
	n, kills := 3000, 12
	if s := os.Getenv("APIDISPATCH_KILLS"); s != "" {
		kills, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("APIDISPATCH_OPENAI_KILL_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("APIDISPATCH_OPENAI_KILL_N=%q: want a number of items", s)
		}
	}
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, k, func(c *sim.Config) {
		c.Faults = []sim.Fault{{Kind: sim.FaultBatchCreateLost500, Probability: 0.3}}
		for _, name := range []string{"gpt_a", "gpt_b", "gpt_c"} {
			c.Orgs = append(c.Orgs, sim.OrgConfig{Name: name, Provider: sim.ProviderOpenAI,
				ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 30_000, TPM: 50_000_000, BatchQueueTokens: size * 320}}})
		}
	})
	dir := t.TempDir()
	input, runDir := filepath.Join(dir, "gpt.jsonl"), filepath.Join(dir, "run")
	f, err := os.Create(input)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(f, n, 7, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := []string{"run", input, "--route", "batch", "--batch-size", strconv.Itoa(size), "--run-dir", runDir,
		"--base-url", r.URL, "--speed", strconv.Itoa(k), "--quiet", "--confirm"}
	rng := rand.New(rand.NewPCG(5, 6))
	phases := map[string]int{}
	// endedOnItsOwn says whether run i, which exited before its kill, may
	// end the kills: it finished the job (exit 0) after at least half of
	// them. (A resume that harvests what its predecessors left can finish
	// the last batches within the kill's random delay.)
	endedOnItsOwn := func(i int, c *exec.Cmd, out fmt.Stringer) bool {
		if c.ProcessState == nil || c.ProcessState.ExitCode() != 0 || i < kills/2 {
			t.Fatalf("run %d ended before its kill (%v):\n%s", i+1, c.ProcessState, tail(out.String()))
		}
		t.Logf("run %d finished the job before its kill", i+1)
		kills = i
		return true
	}
kill:
	for i := range kills {
		// The kill comes at a random moment once the process is in its
		// batches (a big file takes a while to validate).
		seen := batchEvents(runDir)
		c, out, exited := startCLI(t, r, args...)
		for batchEvents(runDir) == seen {
			select {
			case <-exited:
				if endedOnItsOwn(i, c, out) {
					break kill
				}
			case <-time.After(5 * time.Millisecond):
			}
		}
		select {
		case <-exited:
			if endedOnItsOwn(i, c, out) {
				break kill
			}
		case <-time.After(time.Duration(rng.IntN(600)) * time.Millisecond):
		}
		if err := c.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-exited
		phases[phaseOf(t, runDir)]++
	}
	c := cliCmd(r, append(args, "--json")...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		t.Fatalf("final run: %v\n%s", err, tail(errb.String()))
	}
	requireEachOnce(t, runDir, n)
	var s rundir.Summary
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, out.String())
	}
	nanos, billed, twice := batchLedger(r)
	t.Logf("%d kills by phase %v; the simulator billed %d batch requests (%d twice), %d n$; summary %d n$; %d batches created, %d adopted after a lost create, %d abandoned, %d results sent again",
		kills, phases, billed, twice, nanos, s.Cost.TotalNanos, s.Batches.Created, s.Batches.Adopted, s.Batches.Abandoned, s.Batches.Retried)
	if !s.DataLoss.Passed || s.Succeeded != int64(n) {
		t.Fatalf("summary: %d succeeded, data loss %+v", s.Succeeded, s.DataLoss)
	}
	if billed != n || twice != 0 {
		t.Fatalf("the simulator billed %d batch requests (%d twice): want %d, each once", billed, twice, n)
	}
	if s.Cost.TotalNanos != nanos {
		t.Fatalf("summary cost %d n$, ledger %d n$", s.Cost.TotalNanos, nanos)
	}
	if s.Batches.Adopted == 0 {
		t.Fatal("no lost create was adopted: the fault never struck")
	}
	// Every input file is deleted once nothing needs it, also the uploads
	// of creates a kill cut (their records abandoned by a resume).
	for _, name := range []string{"gpt_a", "gpt_b", "gpt_c"} {
		var page struct {
			Data []struct {
				Filename string `json:"filename"`
			} `json:"data"`
		}
		if err := getJSON(r.URL+"/v1/files?purpose=batch&limit=10000", r.Server.Keys()[name][0], &page); err != nil {
			t.Fatalf("listing org %s's files: %v", name, err)
		}
		if len(page.Data) != 0 {
			t.Errorf("org %s holds %d input files after the run, e.g. %s; want none", name, len(page.Data), page.Data[0].Filename)
		}
	}
}

// getJSON decodes the answer to a GET of u with bearer key into out.
func getJSON(u, key string, out any) error {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// batchEvents counts the batch events of a run directory.
func batchEvents(runDir string) int {
	f, err := os.Open(filepath.Join(runDir, rundir.EventsFile))
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e rundir.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Kind == rundir.EventBatch {
			n++
		}
	}
	return n
}
