package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// sharedGW starts a gateway on state directory dir with its own
// connection to the Redis at url (as a gateway process of its own has),
// its spend (and, with lanes, its lanes) shared there.
func sharedGW(t *testing.T, run *sim.Running, url, dir string, lanes bool, mutate func(*Config)) (*Gateway, *httptest.Server) {
	t.Helper()
	sb, err := shared.Open(context.Background(), shared.Config{URL: url, Orgs: run.Server.Orgs()})
	if err != nil {
		t.Fatal(err)
	}
	sb.Start(context.Background())
	cfg := Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		RetryFor: time.Minute, StateDir: dir, SharedSpend: sb,
		Clients: []Client{{Name: "alice", Token: tokA}, {Name: "bob", Token: tokB}}}
	if lanes {
		cfg.NewGate = sb.NewGate
	}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := New(cfg)
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
	return g, srv
}

// post sends a Messages body and returns the status and the body.
func post(url, tok string, body []byte) (int, string, http.Header, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("x-api-key", tok)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// spendUntilRefused sends judge requests from workers at once, each to
// the next of urls in turn, with the tokens in turn, until every worker
// has been refused by a spend cap five times in a row while none of the
// test's requests was in flight: the caps, not the test, end the work.
func spendUntilRefused(t *testing.T, urls []string, toks []string, workers int) (answered, refused int64) {
	t.Helper()
	var next, inflight, ok, no atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			streak := 0
			for {
				i := next.Add(1)
				if i > 5000 {
					t.Errorf("5000 requests and no cap refused them")
					return
				}
				inflight.Add(1)
				status, body, _, err := post(urls[int(i)%len(urls)], toks[int(i)%len(toks)], judgeBody(int(i), ""))
				alone := inflight.Add(-1) == 0
				switch {
				case err != nil:
					t.Errorf("request %d: %v", i, err)
					return
				case status == http.StatusOK:
					ok.Add(1)
					streak = 0
				case status == http.StatusBadRequest && strings.Contains(body, anthropic.SpendLimitMessagePrefix):
					no.Add(1)
					if alone {
						streak++
					}
					if streak >= 5 {
						return
					}
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("request %d: %d %s", i, status, body)
					return
				}
			}
		})
	}
	wg.Wait()
	return ok.Load(), no.Load()
}

// checkBill fails the test unless the simulator billed at most capN and,
// the work having been more than capN, at least 95 % of it.
func checkBill(t *testing.T, run *sim.Running, capN cost.Nanos, what string, answered, refused int64) {
	t.Helper()
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	t.Logf("%s: %d answered, %d refused; the simulator billed %s on a cap of %s (%.3f×)", what, answered, refused, billed, capN, float64(billed)/float64(capN))
	if refused == 0 {
		t.Fatalf("%s: nothing refused: the work did not exceed the cap, the test proves nothing", what)
	}
	if billed > capN {
		t.Errorf("%s: billed %s, past the cap %s", what, billed, capN)
	}
	if billed < capN*95/100 {
		t.Errorf("%s: billed %s, under 95 %% of the cap %s though the work exceeded it", what, billed, capN)
	}
}

// Issue 27: two gateways on one Redis with one clients file let alice
// spend her max_cost on each (1.40× to 1.88× measured from outside). With
// --shared her max_cost is one budget for every gateway on the Redis: the
// bill stays within it, and within 95 % of it when her work exceeds it,
// with two gateways and with three.
func TestSharedSpendClientMaxCostAcrossGateways(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n, " gateways"), func(t *testing.T) {
			rs := testredis.Start(t)
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
			const capN = cost.Nanos(200_000_000) // $0.20: ~50 judge calls at their worst case
			var urls []string
			for range n {
				_, srv := sharedGW(t, run, rs.URL(), t.TempDir(), true, func(c *Config) { c.Clients[0].MaxCost = capN })
				urls = append(urls, srv.URL)
			}
			ok, no := spendUntilRefused(t, urls, []string{tokA}, 12)
			checkBill(t, run, capN, fmt.Sprintf("alice's max_cost over %d gateways", n), ok, no)
		})
	}
}

// The gateway's --max-cost, given to two gateways on one Redis, is one
// budget too: two uncapped clients spread over both stay within it.
func TestSharedSpendGatewayMaxCostAcrossGateways(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	const capN = cost.Nanos(200_000_000)
	var urls []string
	for range 2 {
		_, srv := sharedGW(t, run, rs.URL(), t.TempDir(), true, func(c *Config) { c.MaxCost = capN })
		urls = append(urls, srv.URL)
	}
	ok, no := spendUntilRefused(t, urls, []string{tokA, tokB}, 12)
	checkBill(t, run, capN, "--max-cost over 2 gateways", ok, no)
}

// With Redis out of reach a capped request cannot be judged against the
// other gateways' spend: it is refused (529, which SDKs retry later,
// naming why) and nothing is sent; an uncapped client is still served.
func TestSharedSpendRedisDownRefusesCappedRequests(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := sharedGW(t, run, rs.URL(), t.TempDir(), false, func(c *Config) { c.Clients[0].MaxCost = 100_000_000 })
	if status, body, _, err := post(srv.URL, tokA, judgeBody(1, "")); err != nil || status != http.StatusOK {
		t.Fatalf("with Redis up: %d %s %v", status, body, err)
	}
	rs.Stop()
	before := run.Server.LedgerTotals().Requests
	status, body, h, err := post(srv.URL, tokA, judgeBody(2, ""))
	if err != nil {
		t.Fatal(err)
	}
	if status != 529 || !strings.Contains(body, "spend cap") || !strings.Contains(body, "unreachable") || h.Get(anthropic.HeaderShouldRetry) == "false" {
		t.Errorf("capped request with Redis down: %d %s (x-should-retry %q): want a 529 naming the unreachable shared spend budget", status, body, h.Get(anthropic.HeaderShouldRetry))
	}
	if got := run.Server.LedgerTotals().Requests; got != before {
		t.Errorf("the simulator billed %d requests more with Redis down: a capped request went out unjudged", got-before)
	}
	if status, body, _, err := post(srv.URL, tokB, judgeBody(3, "")); err != nil || status != http.StatusOK {
		t.Errorf("uncapped client with Redis down: %d %s %v: want it served", status, body, err)
	}
}

// Issue 27, the operator's view: with --shared each gateway's Status shows
// beside its own spend the budget every gateway on the Redis shares: alice
// sends through two gateways, and each shows her shared spent as the sum
// of both gateways' own (the simulator's bill for her) against her
// max_cost, nothing left reserved once every answer is settled, and the
// gateway's budget (the total's) the same.
func TestSharedSpendStatusShowsEveryGatewaysSpend(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	const capN = cost.Nanos(5_000_000_000)
	var gws []*Gateway
	var urls []string
	for range 2 {
		g, srv := sharedGW(t, run, rs.URL(), t.TempDir(), false, func(c *Config) { c.Clients[0].MaxCost = capN })
		gws, urls = append(gws, g), append(urls, srv.URL)
	}
	for i := range 5 {
		if status, body, _, err := post(urls[i%2], tokA, judgeBody(i, "")); err != nil || status != http.StatusOK {
			t.Fatalf("request %d: %d %s %v", i, status, body, err)
		}
	}
	bill := cost.Nanos(run.Server.LedgerTotals().CostNanos).USD()
	client := func(s Status, name string) ClientSpend {
		for _, c := range s.Clients {
			if c.Client == name {
				return c
			}
		}
		t.Fatalf("no client %s in %+v", name, s.Clients)
		return ClientSpend{}
	}
	var sts [2]Status
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sts = [2]Status{gws[0].Status(), gws[1].Status()}
		a0, a1 := client(sts[0], "alice"), client(sts[1], "alice")
		if a0.Shared != nil && a1.Shared != nil && a0.Shared.SpentUSD == bill && a1.Shared.SpentUSD == bill && a0.Shared.ReservedUSD == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("alice's shared spend never reached the bill $%v: %+v / %+v", bill, a0.Shared, a1.Shared)
		}
	}
	own := client(sts[0], "alice").SpentUSD + client(sts[1], "alice").SpentUSD
	if client(sts[0], "alice").SpentUSD <= 0 || client(sts[1], "alice").SpentUSD <= 0 || math.Abs(own-bill) > 1e-9 {
		t.Errorf("alice's own spend on the gateways: %v + %v, want both > 0 summing to the bill %v", client(sts[0], "alice").SpentUSD, client(sts[1], "alice").SpentUSD, bill)
	}
	for i, s := range sts {
		a, b := client(s, "alice"), client(s, "bob")
		if a.CapUSD != capN.USD() || a.Shared.Unavailable != "" || a.Shared.HeldUSD != 0 {
			t.Errorf("gateway %d: alice %+v shared %+v", i, a, a.Shared)
		}
		if b.Shared == nil || b.Shared.SpentUSD != 0 || b.Shared.Unavailable != "" {
			t.Errorf("gateway %d: bob's shared figures %+v, want zero", i, b.Shared)
		}
		if s.Total.Shared == nil || s.Total.Shared.SpentUSD != bill || s.Total.Shared.ReservedUSD != 0 {
			t.Errorf("gateway %d: the gateway's shared figures %+v, want spent %v", i, s.Total.Shared, bill)
		}
	}
}

// Redis out of reach neither fails nor stalls the status: within a few
// reads the shared figures are marked unavailable, with why, beside the
// gateway's own, and no Status call waits for Redis; without --shared
// there are none.
func TestSharedSpendStatusRedisDown(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := sharedGW(t, run, rs.URL(), t.TempDir(), false, nil)
	if status, body, _, err := post(srv.URL, tokA, judgeBody(1, "")); err != nil || status != http.StatusOK {
		t.Fatalf("%d %s %v", status, body, err)
	}
	rs.Stop()
	var s Status
	var slowest time.Duration
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		start := time.Now()
		s = g.Status()
		slowest = max(slowest, time.Since(start))
		if s.Total.Shared != nil && s.Total.Shared.Unavailable != "" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the shared figures never became unavailable with Redis down: %+v", s.Total.Shared)
		}
	}
	t.Logf("slowest Status with Redis going down: %s", slowest)
	if slowest > sharedStatusTimeout/2 {
		t.Errorf("a Status call took %s with Redis down: it waited for Redis", slowest)
	}
	for _, c := range append(s.Clients, s.Total) {
		if c.Shared == nil || !strings.Contains(c.Shared.Unavailable, "unreachable") || c.Shared.SpentUSD != 0 {
			t.Errorf("%s: shared figures %+v with Redis down, want unavailable naming why", c.Client, c.Shared)
		}
	}
	if s.Clients[0].Client != "alice" || s.Clients[0].SpentUSD <= 0 {
		t.Errorf("alice's own spend lost with Redis down: %+v", s.Clients[0])
	}
	local, _ := startGW(t, run, nil)
	for _, c := range append(local.Status().Clients, local.Status().Total) {
		if c.Shared != nil {
			t.Errorf("without --shared %s has shared figures %+v", c.Client, c.Shared)
		}
	}
}
