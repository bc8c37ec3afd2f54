//go:build long

package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// A sync-route gateway batch whose process died with attempts in flight
// (their worst case in the run directory's attempt journal) and that was
// being canceled is finalized at the next start without running: its
// ledger entry must count what the journal says may have been billed, as
// a run of the directory would, or the client's gate is seeded short.
func TestCanceledResumedSyncBatchCountsItsDeadProcessJournal(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1, nil)
	dir := t.TempDir()
	mk := func() *Gateway {
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: 1, Prices: cost.Default(),
			Clients: []Client{{Name: "a", Token: tokA, MaxCost: 1_000_000_000}}, StateDir: dir, RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g1 := mk()
	s1 := httptest.NewServer(g1.Handler())
	c := sdkClient(s1.URL, tokA, option.WithHeader(headerRoute, "sync"))
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 2 {
		reqs = append(reqs, sdk.MessageBatchNewParamsRequest{CustomID: fmt.Sprintf("r-%d", i), Params: sdk.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 4096, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(fmt.Sprintf("Item %d: explain at length.", i)))}}})
	}
	b, err := c.Messages.Batches.New(context.Background(), sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	s1.Close()
	g1.Close()
	bdir := filepath.Join(dir, batchesDir, b.ID)
	// What a kill -9 leaves: an attempt the journal holds open, and the
	// batch's record saying a cancel was asked for.
	const worst = cost.Nanos(50_000_000)
	j, err := rundir.OpenJournal(filepath.Join(bdir, batchRun))
	if err != nil {
		t.Fatal(err)
	}
	j.Sent(1, 99, worst)
	j.Close(false)
	mp := filepath.Join(bdir, batchMeta)
	raw, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["status"] != statusInProgress {
		t.Fatalf("batch record %s: want it in progress, or the test proves nothing", raw)
	}
	m["status"] = statusCanceling
	raw, _ = json.Marshal(m)
	if err := os.WriteFile(mp, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	g2 := mk()
	s2 := httptest.NewServer(g2.Handler())
	defer func() { s2.Close(); g2.Close() }()
	c2 := sdkClient(s2.URL, tokA)
	waitEnded(t, &c2, b.ID)
	waitIdle(t, g2)
	var batchCost cost.Nanos
	for _, e := range ledgerEntries(t, g2) {
		if e.BatchID == b.ID {
			batchCost += e.Cost
		}
	}
	t.Logf("batch record %s; ledger entry of the batch %s; the dead process's journal held %s", raw, batchCost, worst)
	if batchCost < worst {
		t.Errorf("the canceled batch's ledger entry is %s: want at least the %s its dead process's journal held open", batchCost, worst)
	}
}
