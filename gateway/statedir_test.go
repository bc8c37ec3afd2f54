package gateway

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// Two gateways started on one --state-dir each kept the client's max_cost
// alone in memory: measured from outside, client alice with max_cost $0.05
// was billed $0.0932 by the simulator (17 + 22 requests through the two).
// The state directory is one process's: the second gateway must not open it,
// and whatever it does the simulator's ledger stays within the client's cap.
func TestTwoGatewaysOnOneStateDirKeepOneClientCap(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	capN := cost.Nanos(20_000_000) // $0.02: a few judge calls at worst case
	dir := t.TempDir()
	cfg := Config{
		Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients:  []Client{{Name: "a", Token: tokA, MaxCost: capN}},
		StateDir: dir, RetryFor: time.Minute,
	}
	var urls []string
	for i := range 2 {
		g, err := New(cfg)
		if err != nil {
			if i == 0 {
				t.Fatal(err)
			}
			t.Logf("second gateway refused: %v", err)
			continue
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(func() {
			srv.Close()
			g.Close()
		})
		urls = append(urls, srv.URL)
	}
	for _, u := range urls {
		c := sdkClient(u, tokA)
		for i := range 30 {
			if _, err := c.Messages.New(context.Background(), judgeParams(i)); err != nil {
				break
			}
		}
	}
	if billed := cost.Nanos(run.Server.LedgerTotals().CostNanos); billed > capN {
		t.Errorf("two gateways on one state dir (%d opened): billed %s over client a's max_cost %s", len(urls), billed, capN)
	}
}
