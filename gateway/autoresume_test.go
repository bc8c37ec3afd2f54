package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway batch on route auto (a deadline) resumed after a restart with
// its upstream batch open, beside the client's sync requests: together
// they stay within the client's max_cost.
func TestAttackResumedAutoBatchAndSyncStayWithinMaxCost(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 3000 // 3 s at K=1000
		}
	})
	dir := t.TempDir()
	capN := cost.Nanos(250_000_000) // $0.25
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
	c1 := sdkClient(s1.URL, tokA, option.WithHeader(headerRoute, "auto"), option.WithHeader(headerDeadline, "24h"))
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 12 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 1024, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(long(i)))}}})
	}
	b, err := c1.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
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
	s1.Close()
	g1.Close()
	if st := g1.Status().Batches; st[statusInProgress] != 1 {
		t.Fatalf("stopped with batches %v: want it in progress, or the test proves nothing", st)
	}
	g2, s2 := mk()
	defer func() { s2.Close(); g2.Close() }()
	g2.batches.mu.Lock()
	gb := g2.batches.byID[b.ID]
	g2.batches.mu.Unlock()
	worst := gb.meta.WorstNanos
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
	c2 := sdkClient(s2.URL, tokA)
	e := waitEnded(t, &c2, b.ID)
	waitIdle(t, g2)
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	batchN, batchItems, _ := sim.BatchBilling(run.Server.Ledger())
	t.Logf("max_cost %s; batch worst case %s, client a's gate held %s just after the restart; %d sync answered; billed %s (batch: %d items, %s); batch counts %s",
		capN, worst, held, sent, billed, batchItems, cost.Nanos(batchN), e.RequestCounts.RawJSON())
	if billed > capN {
		t.Errorf("the simulator billed %s for client a's requests, past its max_cost %s", billed, capN)
	}
	if batchItems == 0 {
		t.Errorf("%d batch items billed, %d sync answered: want both, or the test proves nothing", batchItems, sent)
	}
}
