package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// sharedPair is two gateways on one Redis (--shared) in front of one
// simulator, with one clients list.
type sharedPair struct {
	run  *sim.Running
	gws  [2]*Gateway
	urls [2]string
	tt   *timedTransport
}

func startSharedPair(tb testing.TB, speed float64, clients []Client) *sharedPair {
	tb.Helper()
	rs := testredis.Start(tb)
	run := fairSim(tb, speed, nil)
	p := &sharedPair{run: run, tt: &timedTransport{rt: &http.Transport{MaxIdleConnsPerHost: 4096}}}
	for i := range 2 {
		sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: run.Server.Orgs()})
		if err != nil {
			tb.Fatal(err)
		}
		sb.Start(context.Background())
		tb.Cleanup(func() { sb.Close() })
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: speed, Prices: cost.Default(),
			Caps: fairCaps, NewGate: sb.NewGate, RetryFor: time.Minute, HTTPClient: &http.Client{Transport: p.tt},
			Clients: clients, StateDir: tb.TempDir()})
		if err != nil {
			tb.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		tb.Cleanup(func() { srv.Close(); g.Close() })
		p.gws[i], p.urls[i] = g, srv.URL
	}
	return p
}

func (p *sharedPair) queued() int { return p.gws[0].lanes.queued() + p.gws[1].lanes.queued() }

// BenchmarkTwoGatewaysFairness measures the fair shares across two
// gateways on one Redis, where each gateway orders only its own waiters.
// bulk-split: a bulk client keeps ≥ 1,000 requests waiting on gateway 0,
// an interactive client sends two at a time to gateway 1; its p50 and p95
// against the upstream latency. bulk-both: the same with each client's
// requests spread over both gateways. weights-split: bulk clients of
// weights 1 and 3, 300 requests at a time each, one per gateway; the
// weight-1 client's share of the completions. weights-both: the same with
// each client's requests spread over both gateways.
//
//	go test ./gateway -run '^$' -bench TwoGatewaysFairness -benchtime 1x
func BenchmarkTwoGatewaysFairness(b *testing.B) {
	speed := float64(envInt("APIDISPATCH_GW_SPEED", fairSpeed))
	rounds := envInt("APIDISPATCH_FAIR_ROUNDS", 15)
	for range b.N {
		for _, spread := range []bool{false, true} {
			name := map[bool]string{false: "split", true: "both"}[spread]
			clients := []Client{{Name: "a", Token: tokA, Priority: Bulk}, {Name: "b", Token: tokB}}
			p := startSharedPair(b, speed, clients)
			l0, l1 := newFairLoad(p.urls[0]), newFairLoad(p.urls[1])
			if spread {
				l0.closedLoop(tokA, 550)
				l1.closedLoop(tokA, 550)
			} else {
				l0.closedLoop(tokA, 1100)
			}
			for end := time.Now().Add(30 * time.Second); p.queued() < 1000 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			}
			waitRamped(b, p.gws[0], 60)
			lat := readLat(p.tt)
			var lats []time.Duration
			minQ := 1 << 30
			for round := range rounds {
				minQ = min(minQ, p.queued())
				var wg sync.WaitGroup
				var mu sync.Mutex
				for k := range 2 {
					l := l1
					if spread && k == 0 {
						l = l0
					}
					wg.Go(func() {
						d := l.send(tokB, 10_000+2*round+k)
						mu.Lock()
						lats = append(lats, d)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			up := meanSince(p.tt, lat)
			l0.end()
			l1.end()
			p50, p95 := quantile(lats, 0.5), quantile(lats, 0.95)
			b.Logf("bulk-%s: interactive (%d) while ≥ %d waited: p50 %v (%.2f×), p95 %v (%.2f×) of upstream %v",
				name, len(lats), minQ, p50.Round(time.Millisecond), p50.Seconds()/up.Seconds(), p95.Round(time.Millisecond), p95.Seconds()/up.Seconds(), up.Round(time.Millisecond))
			b.ReportMetric(p50.Seconds()/up.Seconds(), "bulk-"+name+"-interactive-p50/upstream")
			b.ReportMetric(p95.Seconds()/up.Seconds(), "bulk-"+name+"-interactive-p95/upstream")
		}
		for _, spread := range []bool{false, true} {
			name := map[bool]string{false: "split", true: "both"}[spread]
			clients := []Client{{Name: "a", Token: tokA, Priority: Bulk, Weight: 1}, {Name: "b", Token: tokB, Priority: Bulk, Weight: 3}}
			p := startSharedPair(b, speed, clients)
			l0, l1 := newFairLoad(p.urls[0]), newFairLoad(p.urls[1])
			if spread {
				l0.closedLoop(tokA, 150)
				l1.closedLoop(tokA, 150)
				l0.closedLoop(tokB, 150)
				l1.closedLoop(tokB, 150)
			} else {
				l0.closedLoop(tokA, 300)
				l1.closedLoop(tokB, 300)
			}
			for end := time.Now().Add(30 * time.Second); p.queued() < 400 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			}
			time.Sleep(500 * time.Millisecond)
			from := time.Now()
			time.Sleep(5 * time.Second)
			to := time.Now()
			q := p.queued()
			l0.end()
			l1.end()
			a := l0.completions(tokA, from, to) + l1.completions(tokA, from, to)
			bb := l0.completions(tokB, from, to) + l1.completions(tokB, from, to)
			share := float64(a) / float64(a+bb)
			b.Logf("weights-%s: weights 1 and 3: %d and %d completions: %.3f and %.3f (%d waiting at the end)", name, a, bb, share, 1-share, q)
			b.ReportMetric(share, "weights-"+name+"-weight1-share")
		}
	}
}
