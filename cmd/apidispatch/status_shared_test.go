package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/metrics"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// Issue 27, the operator's view: two gateways on one Redis (--shared) and
// one clients file; alice sends through both. 'apidispatch status
// --gateway' of either shows her spend across both gateways (the
// simulator's bill for her) against her max_cost beside the gateway's own,
// and the metrics carry it as apidispatch_gateway_client_shared_spent_usd.
func TestStatusGatewaySharedSpendAcrossGateways(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	const alice = "sk-gw-status-shared-alice-01"
	var gws []*gateway.Gateway
	var bases, states []string
	for range 2 {
		sb, err := shared.Open(context.Background(), shared.Config{URL: rs.URL(), Orgs: run.Server.Orgs()})
		if err != nil {
			t.Fatal(err)
		}
		sb.Start(context.Background())
		state := t.TempDir()
		g, err := gateway.New(gateway.Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
			RetryFor: time.Minute, StateDir: state, SharedSpend: sb,
			Clients: []gateway.Client{{Name: "alice", Token: alice, MaxCost: 2_000_000_000}}})
		if err != nil {
			sb.Close()
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(func() {
			srv.Close()
			g.Close()
			sb.Close()
		})
		gws, bases, states = append(gws, g), append(bases, srv.URL), append(states, state)
	}
	for i := range 4 {
		body := fmt.Appendf(nil, `{"model":"claude-haiku-4-5","max_tokens":32,"messages":[{"role":"user","content":"item %d"}]}`, i)
		if status, b, err := postGW(bases[i%2], alice, body); err != nil || status != http.StatusOK {
			t.Fatalf("request %d: %d %s %v", i, status, b, err)
		}
	}
	bill := cost.Nanos(run.Server.LedgerTotals().CostNanos).USD()
	// Each gateway's status file, once it shows alice's spend on both.
	var s gateway.StatusSnapshot
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if s, err = gateway.ReadStatus(states[0]); err != nil {
			t.Fatal(err)
		}
		if len(s.Clients) == 1 && s.Clients[0].Shared != nil && s.Clients[0].Shared.SpentUSD == bill {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("gateway a's status never showed alice's spend on both gateways ($%v): %+v", bill, s.Clients)
		}
	}
	a := s.Clients[0]
	if a.SpentUSD <= 0 || a.SpentUSD >= bill || a.CapUSD != 2 {
		t.Errorf("alice on gateway a: own spent %v of the bill %v, max_cost %v", a.SpentUSD, bill, a.CapUSD)
	}
	var out, errOut bytes.Buffer
	if code := gatewayStatus(states[0], false, time.Now(), &out, &errOut); code != exitOK {
		t.Fatalf("status --gateway: %d %s", code, errOut.String())
	}
	row := ""
	for l := range strings.Lines(out.String()) {
		if strings.HasPrefix(l, "alice") && strings.Contains(l, fmt.Sprintf("$%.6f", bill)) {
			row = l
		}
	}
	if !strings.Contains(out.String(), "every gateway's spend (--shared;") || row == "" ||
		!strings.Contains(row, "$2.000000") || !strings.Contains(row, fmt.Sprintf("$%.6f", a.SpentUSD)) {
		t.Errorf("status --gateway: no line of alice's spend on every gateway ($%.6f, max_cost $2, this gateway's $%.6f):\n%s", bill, a.SpentUSD, out.String())
	}
	// The metrics of gateway b, as serve registers them.
	m := metrics.New()
	if err := m.Gateway(func() metrics.GatewayStats { return gatewayStats(gws[1].Status()) }); err != nil {
		t.Fatal(err)
	}
	ms := httptest.NewServer(m.Handler())
	defer ms.Close()
	var body string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(ms.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if strings.Contains(body, fmt.Sprintf(`apidispatch_gateway_client_shared_spent_usd{client="alice"} %v`, bill)) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no apidispatch_gateway_client_shared_spent_usd{client=\"alice\"} %v in the metrics:\n%s", bill, body)
		}
	}
	for _, want := range []string{
		fmt.Sprintf(`apidispatch_gateway_shared_spent_usd %v`, bill),
		`apidispatch_gateway_client_shared_reserved_usd{client="alice"} 0`,
		`apidispatch_gateway_shared_spend_up 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in the metrics", want)
		}
	}
}
