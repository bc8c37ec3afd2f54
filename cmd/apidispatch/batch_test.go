package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
)

// batchLedger is the simulator's batch billing (sim.BatchBilling).
func batchLedger(r *sim.Running) (nanos int64, billed, twice int) {
	return sim.BatchBilling(r.Server.Ledger())
}

// simBatchRequests is how many requests the simulator's batches hold, over
// every org: with nothing sent twice, exactly N.
func simBatchRequests(r *sim.Running) (requests, created int64) {
	for _, st := range r.Server.BatchStats() {
		requests += st.Requests
		created += st.Created
	}
	return requests, created
}

// lastBatchNote is the note of the last batch event in a run directory:
// where the batch route was when the process died.
func lastBatchNote(runDir string) string {
	f, err := os.Open(filepath.Join(runDir, rundir.EventsFile))
	if err != nil {
		return ""
	}
	defer f.Close()
	note := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e rundir.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Kind == rundir.EventBatch {
			note = e.Note
		}
	}
	return note
}

// phaseOf names what the batch route was doing when its process died,
// from what it left: a batch still recorded as submitting is a create in
// progress (or one whose answer was lost, not yet reconciled); otherwise
// its last event says.
func phaseOf(t *testing.T, runDir string) string {
	path := filepath.Join(runDir, rundir.StateFile)
	if _, err := os.Stat(path); err != nil {
		return "before the run directory was made"
	}
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	bs, err := st.Batches(t.Context())
	if err != nil && !errors.Is(err, store.ErrNotInitialized) {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.Status == store.BatchSubmitting {
			return "submitting"
		}
	}
	note := lastBatchNote(runDir)
	switch {
	case note == "":
		return "before the first batch"
	case strings.Contains(note, "harvested"):
		return "harvesting"
	case strings.Contains(note, "abandoned"):
		return "after a refused create"
	}
	return "polling"
}

// startCLI starts the command args with its output in the returned
// buffer; the channel closes when it has exited.
func startCLI(t *testing.T, r *sim.Running, args ...string) (*exec.Cmd, *bytes.Buffer, chan struct{}) {
	t.Helper()
	c := cliCmd(r, args...)
	out := new(bytes.Buffer)
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { c.Wait(); close(exited) }()
	return c, out, exited
}

// runCmdOut runs the command args to its end and returns its exit code,
// stdout and stderr.
func runCmdOut(t *testing.T, r *sim.Running, args ...string) (int, string, string) {
	t.Helper()
	c := cliCmd(r, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// TestBatchHostileInput: inputs and flags the batch route cannot take are
// refused with a message naming the problem, before anything is sent.
func TestBatchHostileInput(t *testing.T) {
	t.Parallel()
	r, input, runDir := simAndInput(t, 100, 50)
	zero := filepath.Join(t.TempDir(), "zero.jsonl")
	b, err := os.ReadFile(input)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	lines[6] = strings.Replace(lines[6], `"max_tokens":256`, `"max_tokens":0`, 1)
	if err := os.WriteFile(zero, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--base-url", r.URL, "--speed", "100", "--quiet"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"batch size over the API's limit", []string{"run", input, "--route", "batch", "--batch-size", "100001"}, "--batch-size 100001: a batch holds 1 to 100000 requests"},
		{"negative batch size", []string{"run", input, "--route", "batch", "--batch-size", "-5"}, "--batch-size -5"},
		{"unknown route", []string{"run", input, "--route", "fast"}, `--route "fast": want sync, batch or auto`},
		{"cache with batch", []string{"run", input, "--route", "batch", "--cache", filepath.Join(t.TempDir(), "c.db")}, "--cache answers and stores results of the sync route only"},
		{"cancel without batches", []string{"run", input, "--cancel"}, "--cancel cancels a run's open batches: it needs --route batch or auto"},
		{"max_tokens 0 by batch", []string{"run", zero, "--route", "batch", "--run-dir", runDir + "z"}, "line 7: params.max_tokens must be a positive integer, found 0"},
	} {
		code, _, stderr := runCmdOut(t, r, append(tc.args, base...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and %q", tc.name, code, stderr, tc.want)
		}
	}
	if req, created := simBatchRequests(r); req != 0 || created != 0 || r.Server.LedgerTotals().Requests != 0 {
		t.Fatalf("something was sent: %d batches, %d requests, %d billed", created, req, r.Server.LedgerTotals().Requests)
	}
}

// slowBatches is a simulator whose batches take several seconds: a short
// queue wait, then 200 requests a minute per org, at K = 20.
func slowBatches(t *testing.T, n int) (*sim.Running, string, string) {
	return simWith(t, 20, n, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute = 1, 200
		}
	})
}

// startUntilBatches starts args and waits until the simulator has created
// want batches.
func startUntilBatches(t *testing.T, r *sim.Running, want int64, args ...string) (*exec.Cmd, *bytes.Buffer, chan struct{}) {
	t.Helper()
	c, out, exited := startCLI(t, r, args...)
	for {
		if _, created := simBatchRequests(r); created >= want {
			return c, out, exited
		}
		select {
		case <-exited:
			t.Fatalf("the run ended before creating %d batches:\n%s", want, tail(out.String()))
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestBatchSignalLeavesBatchesRunning: the first SIGINT stops the run at
// once with its batches left running on the API (exit 4); the same command
// re-attaches to them by id and harvests them, creating nothing new.
func TestBatchSignalLeavesBatchesRunning(t *testing.T) {
	t.Parallel()
	const n = 1500
	r, input, runDir := slowBatches(t, n)
	args := []string{"run", input, "--route", "batch", "--run-dir", runDir, "--base-url", r.URL, "--speed", "20", "--quiet"}
	c, out, exited := startUntilBatches(t, r, 3, args...)
	time.Sleep(100 * time.Millisecond)
	if err := c.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not stop within 10 s of SIGINT")
	}
	var stopped rundir.Summary
	if b, err := os.ReadFile(filepath.Join(runDir, rundir.SummaryFile)); err != nil || json.Unmarshal(b, &stopped) != nil || stopped.Batches == nil {
		t.Fatalf("the stopped run's summary: %v\n%s", err, tail(out.String()))
	}
	if code := c.ProcessState.ExitCode(); code != exitIncomplete || stopped.Batches.Open == 0 || !strings.Contains(stopped.StopReason, "batches still running on the API; the same command re-attaches") {
		t.Fatalf("exit %d, %d batches open, stop reason %q; want 4 with the batches left running and named\n%s", code, stopped.Batches.Open, stopped.StopReason, tail(out.String()))
	}
	code, stdout, stderr := runCmdOut(t, r, append(args, "--json")...)
	if code != exitOK {
		t.Fatalf("the re-attaching run: exit %d\n%s", code, tail(stderr))
	}
	requireEachOnce(t, runDir, n)
	var s rundir.Summary
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), &s); err != nil {
		t.Fatal(err)
	}
	if req, created := simBatchRequests(r); created != 3 || req != n || s.Batches.Harvested != 3 {
		t.Fatalf("the simulator created %d batches (%d requests), the run harvested %d: want the 3 first ones re-attached", created, req, s.Batches.Harvested)
	}
}
