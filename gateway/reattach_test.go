package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway batch resumed at start held its worst case in its client's
// gate only until its run opened the run directory: the hold was freed
// there, and the upstream batch the run re-attaches was held again only
// once the batch route had loaded it. In between, the client's sync
// requests were admitted into room the upstream batch, running and billed
// in full, still needed (the gateway campaign's seed 206: a client billed
// $0.101036 on a max_cost of $0.098105 across a kill -9 and a restart).
// Here the resumed run fails between the two (its results file cannot be
// opened) and tries again, so the window stays open: the client's sync
// requests and the batch together must stay within its max_cost.
func TestResumedBatchHeldUntilItsUpstreamBatchIsReattached(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 3000 // 3 s at K=1000
		}
	})
	dir := t.TempDir()
	capN := cost.Nanos(60_000_000) // $0.06
	mk := func() (*Gateway, *httptest.Server) {
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: 1000, Prices: cost.Default(),
			Clients: []Client{{Name: "a", Token: tokA, MaxCost: capN}}, StateDir: dir, RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g, httptest.NewServer(g.Handler())
	}
	// Answers at length fill max_tokens: each is billed near its worst
	// case, the batch's four items too.
	long := func(i int) string {
		return fmt.Sprintf("Item %d: explain the judging rubric at length.", i)
	}
	g1, s1 := mk()
	c1 := sdkClient(s1.URL, tokA)
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 4 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 1024, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(long(i)))}}})
	}
	b, err := c1.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	waitUpstreamBatchCreated(t, run)
	s1.Close()
	g1.Close()
	if st := g1.Status().Batches; st[statusInProgress] != 1 {
		t.Fatalf("stopped with batches %v: want it in progress, or the test proves nothing", st)
	}
	results := filepath.Join(dir, batchesDir, b.ID, batchRun, rundir.ResultsFile)
	if err := os.RemoveAll(results); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(results, 0o700); err != nil {
		t.Fatal(err)
	}

	g2, s2 := mk()
	defer func() { s2.Close(); g2.Close() }()
	g2.batches.mu.Lock()
	gb := g2.batches.byID[b.ID]
	g2.batches.mu.Unlock()
	worst := gb.meta.WorstNanos
	// Wait for the resumed run to have opened its run directory (and so
	// made the batch's gate); it fails next, before re-attaching.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		gb.mu.Lock()
		opened := gb.gate != nil
		gb.mu.Unlock()
		if opened {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the resumed batch's run did not open its run directory in 10 s")
		}
	}
	held := g2.gates["a"].Committed()
	// Sync requests until the cap refuses one.
	var sent int
	for i := range 10 {
		body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":%q}]}`, long(100+i))
		status, answer, _ := gwPost(t, s2.URL, tokA, []byte(body))
		if refusedByCap(status, answer) {
			break
		}
		if status != 200 {
			t.Fatalf("sync request %d: %d %s", i, status, answer)
		}
		sent++
	}
	// The run opens its results file again, re-attaches and ends.
	if err := os.Remove(results); err != nil {
		t.Fatal(err)
	}
	c2 := sdkClient(s2.URL, tokA)
	e := waitEnded(t, &c2, b.ID)
	waitIdle(t, g2)
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	batchN, batchItems, _ := sim.BatchBilling(run.Server.Ledger())
	t.Logf("max_cost %s; batch worst case %s, held %s while its upstream batch was not re-attached; %d sync answered; billed %s (batch: %d items, %s); batch counts %s",
		capN, worst, held, sent, billed, batchItems, cost.Nanos(batchN), e.RequestCounts.RawJSON())
	if held < worst {
		t.Errorf("client a's gate held %s while the resumed batch's upstream batch (worst case %s) was not re-attached: want at least its worst case", held, worst)
	}
	if billed > capN {
		t.Errorf("the simulator billed %s for client a's requests, past its max_cost %s", billed, capN)
	}
	if batchItems == 0 || sent == 0 {
		t.Errorf("%d batch items billed, %d sync answered: want both, or the test proves nothing", batchItems, sent)
	}
}

// waitUpstreamBatchCreated waits until the simulator has created an
// upstream batch (a gateway batch's run has sent its create).
func waitUpstreamBatchCreated(t *testing.T, run *sim.Running) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var created int64
		for _, st := range run.Server.BatchStats() {
			created += st.Created
		}
		if created > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no upstream batch created in 10 s")
		}
	}
}
