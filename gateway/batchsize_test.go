package gateway

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// TestGatewayBatchHalfPrice: N judge requests sent as gateway batches by
// the batch route (creates of at most 100,000 requests, the API's limit)
// end with every custom_id once, the simulator billing each request once
// at the batch price, the gateway's ledger = the simulator's bill, and that
// bill exactly half of what the same requests' usage costs at the sync
// price.
//
// APIDISPATCH_GW_BATCH_N sets N (default 600; the Phase 6 job is 141,600).
func TestGatewayBatchHalfPrice(t *testing.T) {
	n := 600
	if v := os.Getenv("APIDISPATCH_GW_BATCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("APIDISPATCH_GW_BATCH_N=%q: want a number of requests, at least 1", v)
		}
	}
	// A gateway batch expires 24 API hours after its create: 43 s at
	// K=2000, less than a loaded machine takes for 100,000 requests.
	speed := 2000.0
	if n > 20_000 {
		speed = 200
	}
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, nil)
	g, srv := startGW(t, run, func(c *Config) { c.RetryFor = 10 * time.Minute })
	c := sdkClient(srv.URL, tokA, option.WithRequestTimeout(10*time.Minute))
	ctx := context.Background()
	t0 := time.Now()
	var ids []string
	for start := 0; start < n; start += MaxBatchRequests {
		end := min(n, start+MaxBatchRequests)
		reqs := make([]sdk.MessageBatchNewParamsRequest, 0, end-start)
		for i := start; i < end; i++ {
			reqs = append(reqs, batchReq(fmt.Sprintf("judge-%06d", i), i))
		}
		b, err := c.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: reqs})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, b.ID)
	}
	seen := make(map[string]bool, n)
	for _, id := range ids {
		waitEndedWithin(t, &c, id, 30*time.Minute)
		st := c.Messages.Batches.ResultsStreaming(ctx, id, sdk.MessageBatchResultsParams{})
		for st.Next() {
			r := st.Current()
			if r.Result.Type != "succeeded" || seen[r.CustomID] {
				raw := r.RawJSON()
				t.Fatalf("result %s (seen before: %v): %.600s", r.CustomID, seen[r.CustomID], raw)
			}
			seen[r.CustomID] = true
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
	}
	wall := time.Since(t0)
	if len(seen) != n {
		t.Fatalf("%d custom_ids ended, want %d", len(seen), n)
	}
	entries := run.Server.Ledger()
	batchN, billed, twice := sim.BatchBilling(entries)
	if billed != n || twice != 0 || len(entries) != n {
		t.Fatalf("the simulator billed %d batch requests (%d twice) of %d: want %d, none twice, nothing else", billed, twice, len(entries), n)
	}
	var syncN cost.Nanos
	prices := cost.Default()
	for _, e := range entries {
		c, err := prices.Cost(e.Model, anthropic.Usage{InputTokens: e.InputTokens, OutputTokens: e.OutputTokens}, false)
		if err != nil {
			t.Fatal(err)
		}
		syncN += c
	}
	if err := g.Ledger().Flush(); err != nil {
		t.Fatal(err)
	}
	_, tot := g.Ledger().Totals()
	if cost.Nanos(batchN).USD() != tot.SpentUSD || 2*cost.Nanos(batchN) != syncN {
		t.Fatalf("simulator billed %s, ledger $%v, sync price of the same usage %s: want ledger = bill = ½ sync", cost.Nanos(batchN), tot.SpentUSD, syncN)
	}
	t.Logf("N=%d in %d gateway batches: %d results, each custom_id once; billed %s = ledger = ½ × %s (sync price); %.1f s at K=%g",
		n, len(ids), len(seen), cost.Nanos(batchN), syncN, wall.Seconds(), speed)
}

func waitEndedWithin(t *testing.T, c *sdk.Client, id string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		b, err := c.Messages.Batches.Get(context.Background(), id, sdk.MessageBatchGetParams{})
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if b.ProcessingStatus == sdk.MessageBatchProcessingStatusEnded {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s: %s", id, b.ProcessingStatus, b.RawJSON())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
