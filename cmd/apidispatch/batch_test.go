package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
)

// batchLedger sums the simulator's batch-tier ledger and counts custom_ids
// billed more than once.
func batchLedger(r *sim.Running) (nanos int64, billed, twice int) {
	seen := map[string]int{}
	for _, e := range r.Server.Ledger() {
		if e.ServiceTier == "batch" {
			nanos += e.CostNanos
			billed++
			seen[e.CustomID]++
		}
	}
	for _, k := range seen {
		if k > 1 {
			twice++
		}
	}
	return nanos, billed, twice
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
	f, err := os.Open(filepath.Join(runDir, dispatch.EventsFile))
	if err != nil {
		return ""
	}
	defer f.Close()
	note := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e dispatch.Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Kind == dispatch.EventBatch {
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
	st, err := sqlite.Open(filepath.Join(runDir, dispatch.StateFile))
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
		c := cliCmd(r, args...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { c.Wait(); close(exited) }()
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
	var s dispatch.Summary
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
