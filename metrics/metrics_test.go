package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
)

func TestMetricsCountALane(t *testing.T) {
	m := New()
	newGate := m.Wrap(nil)
	g := newGate(gate.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 10, StartFraction: 1})
	d := gate.Demand{EstInput: 10, MaxTokens: 10}
	now := time.Now()
	p1, _, ok1 := g.TryAdmit(now, d)
	p2, _, ok2 := g.TryAdmit(now, d)
	if _, _, ok3 := g.TryAdmit(now, d); !ok1 || !ok2 || !ok3 {
		t.Fatal("not admitted")
	}
	g.Done(now, p1, gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Billed: true, Cost: cost.Nanos(2_500_000)})
	g.Done(now, p2, gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Retryable, Status: 429, RateLimited: true}})

	srv, err := m.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	addr := srv.Addr()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, want := range []string{
		`apidispatch_admitted_total{org="a",pool="sonnet-4"} 3`,
		`apidispatch_in_flight{org="a",pool="sonnet-4"} 1`,
		`apidispatch_cap{org="a",pool="sonnet-4"} 10`,
		`apidispatch_outcomes_total{class="success",org="a",pool="sonnet-4"} 1`,
		`apidispatch_outcomes_total{class="retryable",org="a",pool="sonnet-4"} 1`,
		`apidispatch_rate_limited_total{org="a",pool="sonnet-4"} 1`,
		`apidispatch_cost_usd_total{org="a",pool="sonnet-4"} 0.0025`,
		// One 429 of two attempts ended.
		`apidispatch_org_rate_limited_ratio{org="a"} 0.5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if _, err := m.Start(context.Background(), "0.0.0.0:0"); err == nil {
		t.Error("served metrics on a non-loopback address")
	}
}

// A gateway's spend per client and per org, queue depth and batches by
// status are read at every scrape.
func TestGatewayMetrics(t *testing.T) {
	m := New()
	n := 0
	if err := m.Gateway(func() GatewayStats {
		n++
		return GatewayStats{
			Clients:     []ClientSpend{{Client: "a", SpentUSD: 0.25, ReservedUSD: 0.5, CapUSD: 1, ByOrgUSD: map[string]float64{"org1": 0.2, "(gateway batches)": 0.05}}, {Client: "b", SpentUSD: float64(n)}},
			OrgSpentUSD: map[string]float64{"org1": 0.2, "(gateway batches)": 0.05},
			Queued:      7,
			Queues:      []ClientQueue{{Client: "a", Class: "bulk", Queued: 6, InFlight: 3, Waits: 9, WaitP50S: 0.5, WaitP99S: 2}, {Client: "b", Class: "interactive", InFlight: 1}},
			Batches:     map[string]int{"in_progress": 2, "ended": 3},
			Cache:       &GatewayCache{Hits: 5, Misses: 4, Stored: 3, SavedUSD: 0.125},
		}
	}); err != nil {
		t.Fatal(err)
	}
	srv, err := m.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	addr := srv.Addr()
	scrape := func() string {
		resp, err := http.Get("http://" + addr.String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	scrape()
	body := scrape()
	for _, want := range []string{
		`apidispatch_gateway_client_spent_usd{client="a"} 0.25`,
		`apidispatch_gateway_client_spent_usd{client="b"} 2`,
		`apidispatch_gateway_client_reserved_usd{client="a"} 0.5`,
		`apidispatch_gateway_client_max_cost_usd{client="a"} 1`,
		`apidispatch_gateway_client_org_spent_usd{client="a",org="org1"} 0.2`,
		`apidispatch_gateway_client_org_spent_usd{client="a",org="(gateway batches)"} 0.05`,
		`apidispatch_gateway_org_spent_usd{org="org1"} 0.2`,
		`apidispatch_gateway_org_spent_usd{org="(gateway batches)"} 0.05`,
		`apidispatch_gateway_queued 7`,
		`apidispatch_gateway_client_queued{class="bulk",client="a"} 6`,
		`apidispatch_gateway_client_in_flight{class="bulk",client="a"} 3`,
		`apidispatch_gateway_client_queue_wait_seconds{class="bulk",client="a",quantile="0.5"} 0.5`,
		`apidispatch_gateway_client_queue_wait_seconds{class="bulk",client="a",quantile="0.99"} 2`,
		`apidispatch_gateway_client_in_flight{class="interactive",client="b"} 1`,
		`apidispatch_gateway_batches{status="in_progress"} 2`,
		`apidispatch_gateway_batches{status="ended"} 3`,
		`apidispatch_gateway_cache_requests_total{result="hit"} 5`,
		`apidispatch_gateway_cache_requests_total{result="miss"} 4`,
		`apidispatch_gateway_cache_requests_total{result="stored"} 3`,
		`apidispatch_gateway_cache_saved_usd_total 0.125`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in the scrape", want)
		}
	}
	if strings.Contains(body, `apidispatch_gateway_client_queue_wait_seconds{class="interactive",client="b"`) {
		t.Error("a client that never waited has wait quantiles")
	}
	if strings.Contains(body, `apidispatch_gateway_client_max_cost_usd{client="b"}`) {
		t.Error("a client without max_cost has a max_cost metric")
	}
}

// Stop ends the serving goroutine and waits for it; a second Stop does
// nothing more.
func TestServerStopTwice(t *testing.T) {
	srv, err := New().Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	default:
		t.Fatal("Stop returned before the serving goroutine")
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + srv.Addr().String() + "/metrics"); err == nil {
		t.Fatal("still serving after Stop")
	}
}

// With --shared the gateway's and each client's budget across every
// gateway on the Redis are series of their own; when Redis did not answer
// only shared_spend_up (0) is left, and without --shared none is there.
func TestGatewaySharedSpendMetrics(t *testing.T) {
	var stats GatewayStats
	m := New()
	if err := m.Gateway(func() GatewayStats { return stats }); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	scrape := func() string {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	stats = GatewayStats{Clients: []ClientSpend{{Client: "a", SpentUSD: 0.25, Shared: &SharedSpend{SpentUSD: 0.75, ReservedUSD: 0.125}}},
		Shared: &GatewayShared{Up: true, SharedSpend: SharedSpend{SpentUSD: 1.5, ReservedUSD: 0.5}}}
	body := scrape()
	for _, want := range []string{
		`apidispatch_gateway_client_spent_usd{client="a"} 0.25`,
		`apidispatch_gateway_client_shared_spent_usd{client="a"} 0.75`,
		`apidispatch_gateway_client_shared_reserved_usd{client="a"} 0.125`,
		`apidispatch_gateway_shared_spent_usd 1.5`,
		`apidispatch_gateway_shared_reserved_usd 0.5`,
		`apidispatch_gateway_shared_spend_up 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in the scrape:\n%s", want, body)
		}
	}
	stats = GatewayStats{Clients: []ClientSpend{{Client: "a", SpentUSD: 0.25}}, Shared: &GatewayShared{}}
	body = scrape()
	if !strings.Contains(body, "apidispatch_gateway_shared_spend_up 0") || strings.Contains(body, "apidispatch_gateway_shared_spent_usd") ||
		strings.Contains(body, "apidispatch_gateway_client_shared_spent_usd") {
		t.Errorf("Redis unavailable: want only shared_spend_up 0:\n%s", body)
	}
	stats = GatewayStats{Clients: []ClientSpend{{Client: "a", SpentUSD: 0.25}}}
	if body = scrape(); strings.Contains(body, "_shared_") {
		t.Errorf("without --shared: shared series in the scrape:\n%s", body)
	}
}
