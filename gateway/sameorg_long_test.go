//go:build long

package gateway

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// Two keys of one organisation, configured as two orgs (a and b), add no
// capacity: from the first request on, the organisation never has more
// than the cap in flight, measured at the simulator, with 500 clients at
// once through serve, in-process and with --shared. Before the gateway
// learnt each key's organisation it had 200 in flight on a cap of 100. The
// first request of key a is held back, so that key b answers first (the
// order in which a rule learnt from answers would let b's lanes open).
func TestTwoKeysOfOneOrgNeverPassTheCapThroughServe(t *testing.T) {
	const (
		capN = 100
		n    = 600
		keyA = "sk-ant-sim-one-organisation-key-a"
		keyB = "sk-ant-sim-one-organisation-key-b"
	)
	for _, withShared := range []bool{false, true} {
		name := "in-process"
		if withShared {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1, func(c *sim.Config) {
				c.Orgs = c.Orgs[:1]
				c.Orgs[0].Keys = []string{keyA, keyB}
				c.Orgs[0].ServiceCapacity = 0
				c.Orgs[0].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 10_000_000, ITPM: 10_000_000_000, OTPM: 10_000_000_000}}
			})
			orgs := []org.Org{{Name: "a", Key: org.NewKey(keyA)}, {Name: "b", Key: org.NewKey(keyB)}}
			_, srv := startGW(t, run, func(c *Config) {
				c.Orgs = orgs
				c.Caps = map[string]int{"sonnet": capN}
				c.HTTPClient = &http.Client{Transport: &holdFirst{next: http.DefaultTransport, key: keyA, hold: 3 * time.Second}}
				if withShared {
					rs := testredis.Start(t)
					sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: orgs})
					if err != nil {
						t.Fatal(err)
					}
					sb.Start(context.Background())
					t.Cleanup(func() { sb.Close() })
					c.NewGate = sb.NewGate
				}
			})
			if f := loadThrough(t, srv.URL, n, 500); f != 0 {
				t.Fatalf("%d requests failed", f)
			}
			st := run.Server.Stats()
			o := st.Orgs[0]
			t.Logf("organisation %s: max in flight %d (cap %d), %d completions", o.Name, o.MaxInFlight, capN, o.Completions)
			if o.MaxInFlight > capN {
				t.Errorf("organisation %s had %d in flight through two of its keys; the cap is %d", o.Name, o.MaxInFlight, capN)
			}
			if o.Completions != n {
				t.Errorf("%d completions, want %d", o.Completions, n)
			}
		})
	}
}

// Two gateways on one Redis (--shared), each with its own key of one
// organisation, 300 clients at once each: the organisation's budget in
// Redis is one once its keys' answers show it, so together they never
// have more than the cap in flight (each key's own budget let them have
// the cap each).
func TestTwoGatewaysOnKeysOfOneOrgShareItsCap(t *testing.T) {
	const (
		capN = 100
		n    = 600
		keyA = "sk-ant-sim-one-organisation-key-a"
		keyB = "sk-ant-sim-one-organisation-key-b"
	)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1, func(c *sim.Config) {
		c.Orgs = c.Orgs[:1]
		c.Orgs[0].Keys = []string{keyA, keyB}
		c.Orgs[0].ServiceCapacity = 0
		c.Orgs[0].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 10_000_000, ITPM: 10_000_000_000, OTPM: 10_000_000_000}}
	})
	rs := testredis.Start(t)
	var urls []string
	for _, o := range []org.Org{{Name: "a", Key: org.NewKey(keyA)}, {Name: "b", Key: org.NewKey(keyB)}} {
		_, srv := startGW(t, run, func(c *Config) {
			c.Orgs = []org.Org{o}
			c.Caps = map[string]int{"sonnet": capN}
			sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: c.Orgs})
			if err != nil {
				t.Fatal(err)
			}
			sb.Start(context.Background())
			t.Cleanup(func() { sb.Close() })
			c.NewGate = sb.NewGate
		})
		urls = append(urls, srv.URL)
	}
	var wg sync.WaitGroup
	for _, u := range urls {
		wg.Go(func() {
			if f := loadThrough(t, u, n/2, 300); f != 0 {
				t.Errorf("%s: %d requests failed", u, f)
			}
		})
	}
	wg.Wait()
	o := run.Server.Stats().Orgs[0]
	t.Logf("organisation %s: max in flight %d (cap %d), %d completions", o.Name, o.MaxInFlight, capN, o.Completions)
	if o.MaxInFlight > capN {
		t.Errorf("organisation %s had %d in flight from two gateways on two of its keys; the cap is %d", o.Name, o.MaxInFlight, capN)
	}
	if o.Completions != n {
		t.Errorf("%d completions, want %d", o.Completions, n)
	}
}
