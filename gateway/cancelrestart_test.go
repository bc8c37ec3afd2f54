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

// A gateway batch canceled right after a restart, while its upstream
// batch (created by the earlier process) is processing: the canceled
// batch's ledger entry must cover what the API billed for it, and a
// restarted gateway must hold at least that for the client.
func TestAttackBatchCanceledRightAfterARestartIsCountedWhole(t *testing.T) {
	const speed = 100
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 20 // 0.2 s
			c.Orgs[i].Batch.PerMinute = 60  // 10 ms an item
		}
	})
	dir := t.TempDir()
	mk := func() (*Gateway, *httptest.Server) {
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: speed, Prices: cost.Default(),
			Clients: []Client{{Name: "a", Token: tokA, MaxCost: 10_000_000_000}}, StateDir: dir, RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g, httptest.NewServer(g.Handler())
	}
	g1, s1 := mk()
	c1 := sdkClient(s1.URL, tokA)
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 60 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 256, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d: explain at length.", i)))}}})
	}
	b, err := c1.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	waitUpstreamBatchCreated(t, run)
	s1.Close()
	g1.Close()
	g2, s2 := mk()
	c2 := sdkClient(s2.URL, tokA)
	if _, err := c2.Messages.Batches.Cancel(context.Background(), b.ID, sdk.MessageBatchCancelParams{}); err != nil {
		t.Fatal(err)
	}
	e := waitEnded(t, &c2, b.ID)
	waitIdle(t, g2)
	waitUpstreamBatchesEnded(t, run.Server, 30*time.Second)
	recorded := g2.ledger.spent("a")
	s2.Close()
	g2.Close()
	g3, s3 := mk()
	seeded := g3.gates["a"].Committed()
	s3.Close()
	g3.Close()
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	_, items, twice := sim.BatchBilling(run.Server.Ledger())
	t.Logf("counts %s; ledger %s, a restarted gateway holds %s; the API billed %s (%d batch items, %d twice)", e.RequestCounts.RawJSON(), recorded, seeded, billed, items, twice)
	if recorded < billed || seeded < billed {
		t.Errorf("ledger %s, restarted gateway holds %s, for %s billed", recorded, seeded, billed)
	}
	if twice != 0 {
		t.Errorf("%d batch items billed twice", twice)
	}
	if got := e.RequestCounts.Succeeded + e.RequestCounts.Canceled + e.RequestCounts.Errored + e.RequestCounts.Expired; got != 60 {
		t.Errorf("counts %s: %d items, want 60", e.RequestCounts.RawJSON(), got)
	}
}
