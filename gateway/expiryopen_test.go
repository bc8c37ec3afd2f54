//go:build long

package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway batch that expires while its upstream batch is still
// processing cancels it; here the API refuses every cancel (500), so the
// upstream batch keeps running and bills what it processes before its own
// expiry. The ledger entry of the gateway batch, which seeds the client's
// gate at the next start, must count what that upstream batch billed, or
// a restarted gateway lets the client spend the same room twice.
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
	base := refuseCancels(t, run.URL)
	dir := t.TempDir()
	mk := func() *Gateway { return batchGateway(t, run, base, dir, speed) }
	g := mk()
	s := httptest.NewServer(g.Handler())
	c := sdkClient(s.URL, tokA)
	reqs := explainAtLength(150)
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
	waitUpstreamBatchesEnded(t, run.Server, 30*time.Second)
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

// A gateway batch that expires while an upstream batch of its run is
// still open cancels that upstream batch, as a cancel does: left open, it
// would go on and bill what it processes after the gateway batch ended,
// results no one will read. Here the first gateway cannot reach the API,
// so the upstream batches are created only when a second gateway resumes
// the batch 2 s later (20,000 API s): they expire that much after the
// gateway batch, and would start processing (85,000 API s after their
// create) before their own expiry.
func TestExpiredBatchCancelsItsOpenUpstreamBatches(t *testing.T) {
	const speed = 10000 // a gateway batch expires in 8.64 s
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 85000
			c.Orgs[i].Batch.PerMinute = 1 // 60 API s an item
		}
	})
	// The first gateway's link to the API is cut (a partition: nothing
	// answers), so its run creates no upstream batch.
	cut := netproxy.Start(t, strings.TrimPrefix(run.URL, "http://"))
	cut.BlackHole(true)
	dir := t.TempDir()
	mk := func(base string) *Gateway { return batchGateway(t, run, base, dir, speed) }
	g1 := mk("http://" + cut.Addr)
	s1 := httptest.NewServer(g1.Handler())
	c1 := sdkClient(s1.URL, tokA)
	reqs := explainAtLength(150)
	b, err := c1.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	s1.Close()
	g1.Close()
	if n := run.Server.BatchStats(); total(n) != 0 {
		t.Fatalf("%d upstream batches created through a cut link", total(n))
	}
	g2 := mk(run.URL)
	s2 := httptest.NewServer(g2.Handler())
	defer func() { s2.Close(); g2.Close() }()
	c2 := sdkClient(s2.URL, tokA)
	e := waitEnded(t, &c2, b.ID)
	if total(run.Server.BatchStats()) == 0 {
		t.Fatal("the resumed gateway created no upstream batch: the test proves nothing")
	}
	// The upstream batches would process from 105,000 API s to their
	// expiry at 106,400: wait past it.
	waitUpstreamBatchesEnded(t, run.Server, 30*time.Second)
	_, batchItems, _ := sim.BatchBilling(run.Server.Ledger())
	t.Logf("gateway batch ended %s (counts %s); the API billed %d batch items after it", e.ProcessingStatus, e.RequestCounts.RawJSON(), batchItems)
	if e.RequestCounts.Expired != 150 {
		t.Errorf("counts %s, want 150 expired", e.RequestCounts.RawJSON())
	}
	if batchItems != 0 {
		t.Errorf("the API billed %d items of upstream batches left open after the gateway batch expired, results no one reads", batchItems)
	}
}

func total(st map[string]sim.BatchStats) (n int64) {
	for _, s := range st {
		n += s.Created
	}
	return n
}

// refuseCancels is a proxy to the API at target that answers every batch
// cancel with a 500 api_error, as an API in trouble may.
func refuseCancels(t *testing.T, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel") {
			w.Header().Set("content-type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// explainAtLength is a batch of n Sonnet requests for long answers.
func explainAtLength(n int) []sdk.MessageBatchNewParamsRequest {
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range n {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 256, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d: explain at length.", i)))}}})
	}
	return reqs
}
