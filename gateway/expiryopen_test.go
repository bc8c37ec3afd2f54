//go:build long

package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway batch that expires while its upstream batch is still
// processing is ended at once: its run is cut, the upstream batch keeps
// running on the API and bills what it processes before its own expiry.
// The ledger entry of the gateway batch, which seeds the client's gate at
// the next start, must count that upstream batch (its worst case, as its
// billing is not known), or a restarted gateway lets the client spend the
// same room twice.
func TestExpiredBatchLedgerCountsItsOpenUpstreamBatch(t *testing.T) {
	const speed = 10000 // a gateway batch expires in 8.64 s
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		for i := range c.Orgs {
			// Processing starts about when the gateway batch expires and
			// runs past the upstream batch's own expiry (10 API s an item).
			c.Orgs[i].Batch.QueueWaitS = 86100
			c.Orgs[i].Batch.PerMinute = 6
		}
	})
	dir := t.TempDir()
	mk := func() *Gateway {
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: speed, Prices: cost.Default(),
			Clients: []Client{{Name: "a", Token: tokA, MaxCost: 1_000_000_000}}, StateDir: dir, RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := mk()
	s := httptest.NewServer(g.Handler())
	c := sdkClient(s.URL, tokA)
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 150 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 256, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d: explain at length.", i)))}}})
	}
	b, err := c.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	e := waitEnded(t, &c, b.ID)
	waitIdle(t, g)
	recorded := g.ledger.spent("a")
	s.Close()
	g.Close()
	// What a restarted gateway holds for client a.
	g2 := mk()
	seeded := g2.gates["a"].Committed()
	g2.Close()
	// The upstream batches run on to their own expiry.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		open := 0
		for _, st := range run.Server.BatchStats() {
			open += st.InProgress
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("upstream batches still open 30 s after the gateway batch ended")
		}
	}
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	batchN, batchItems, _ := sim.BatchBilling(run.Server.Ledger())
	t.Logf("gateway batch ended %s (counts %s); ledger records %s for client a, a restarted gateway holds %s; the API billed %s (batch: %d items, %s)",
		e.ProcessingStatus, e.RequestCounts.RawJSON(), recorded, seeded, billed, batchItems, cost.Nanos(batchN))
	if batchItems == 0 {
		t.Fatal("no batch item billed: the test proves nothing")
	}
	if recorded < billed {
		t.Errorf("client a's ledger records %s, the API billed %s for its requests: a restarted gateway seeds its gate %s short", recorded, billed, billed-recorded)
	}
	if seeded < billed {
		t.Errorf("a restarted gateway holds %s for client a, the API billed %s: its max_cost may be passed by %s", seeded, billed, billed-seeded)
	}
}
