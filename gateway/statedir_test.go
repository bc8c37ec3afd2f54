package gateway

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

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

// A truncated 2xx is billed by the API though no answer comes back; the
// gateway retried it with the one reservation of the request and charged
// only the final success, so a client's max_cost could be passed by every
// attempt lost so (measured from outside: two sonnet requests billed twice
// after the gateway's upstream timeout, recorded once in the ledger). Each
// attempt that may have been billed must stay counted at its worst case.
func TestClientMaxCostCountsAttemptsBilledWithoutAnAnswer(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, func(c *sim.Config) {
		c.Faults = append(c.Faults, sim.Fault{Kind: sim.FaultTruncatedBody, Probability: 0.5})
	})
	capN := cost.Nanos(30_000_000) // $0.03
	_, srv := startGW(t, run, func(c *Config) { c.Clients[0].MaxCost = capN })
	c := sdkClient(srv.URL, tokA)
	for i := range 60 {
		if _, err := c.Messages.New(context.Background(), judgeParams(i)); err != nil {
			var apiErr *sdk.Error
			if errors.As(err, &apiErr) && apiErr.StatusCode == 400 {
				break
			}
		}
	}
	if billed := cost.Nanos(run.Server.LedgerTotals().CostNanos); billed > capN {
		t.Errorf("billed %s over client a's max_cost %s (attempts cut after billing were not counted)", billed, capN)
	}
}
