//go:build long

package gateway

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// Three gateways on one Redis (--shared), each with its own client at
// concurrency 100: together they never put more than the cap in flight on
// a key, and every request is answered.
func TestThreeGatewaysOnOneRedisStayUnderTheCap(t *testing.T) {
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	const capN = 20
	var urls []string
	for i := range 3 {
		sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: run.Server.Orgs()})
		if err != nil {
			t.Fatal(err)
		}
		sb.Start(context.Background())
		t.Cleanup(func() { sb.Close() })
		g, err := New(Config{Orgs: run.Server.Orgs(), BaseURL: run.URL, Speed: 100, Prices: cost.Default(),
			Caps: map[string]int{"sonnet": capN}, NewGate: sb.NewGate, RetryFor: time.Minute,
			Clients: []Client{{Name: fmt.Sprint("c", i), Token: tokA}}, StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.Handler())
		t.Cleanup(func() { srv.Close(); g.Close() })
		urls = append(urls, srv.URL)
	}
	var wg sync.WaitGroup
	for _, u := range urls {
		wg.Go(func() {
			if f := loadThrough(t, u, 600, 100); f != 0 {
				t.Errorf("%s: %d failed", u, f)
			}
		})
	}
	wg.Wait()
	for _, o := range run.Server.Stats().Orgs {
		t.Logf("org %s: max in flight %d (cap %d), %d completions", o.Name, o.MaxInFlight, capN, o.Completions)
		if o.MaxInFlight > capN {
			t.Errorf("org %s: %d in flight from three gateways, cap %d", o.Name, o.MaxInFlight, capN)
		}
	}
}
