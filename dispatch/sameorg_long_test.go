//go:build long

package dispatch_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// Two keys of one organisation, configured as two orgs (a and b), add no
// capacity from a run's first request on: the organisation never has more
// than the cap in flight, measured at the simulator, in-process and with
// --shared. When the engine learnt the organisation only from its first
// answers, a run had 113 and 160 in flight on a cap of 100: the later
// key's lanes opened when its first answer came back before the earlier
// key's, and stopped only after. The test makes that order certain by
// holding the first request of key a back.
func TestTwoKeysOfOneOrgNeverPassTheCapInARun(t *testing.T) {
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
			h := newHarness(t, sim.PresetOrigin3Org, 2, n, func(c *sim.Config) {
				c.Orgs = c.Orgs[:1]
				c.Orgs[0].Keys = []string{keyA, keyB}
				c.Orgs[0].ServiceCapacity = 0
				c.Orgs[0].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 10_000_000, ITPM: 10_000_000_000, OTPM: 10_000_000_000}}
			})
			h.orgs = []org.Org{{Name: "a", Key: org.NewKey(keyA)}, {Name: "b", Key: org.NewKey(keyB)}}
			res, err := h.run(context.Background(), func(c *dispatch.Config) {
				c.Caps = map[string]int{"sonnet": capN}
				c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
					return &holdFirst{next: rt, key: keyA, hold: 4 * time.Second}
				}
				if withShared {
					rs := testredis.Start(t)
					sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: h.orgs})
					if err != nil {
						t.Fatal(err)
					}
					sb.Start(context.Background())
					t.Cleanup(func() { sb.Close() })
					c.NewGate = sb.NewGate
				}
			})
			if err != nil || !res.Complete {
				t.Fatalf("run: %v", err)
			}
			o := h.sim.Server.Stats().Orgs[0]
			t.Logf("organisation %s: max in flight %d (cap %d), %d completions", o.Name, o.MaxInFlight, capN, o.Completions)
			if o.MaxInFlight > capN {
				t.Errorf("organisation %s had %d in flight through two of its keys; the cap is %d", o.Name, o.MaxInFlight, capN)
			}
			if res.Summary.Succeeded != n || !res.Summary.DataLoss.Passed {
				t.Errorf("%d succeeded of %d; data loss check %+v", res.Summary.Succeeded, n, res.Summary.DataLoss)
			}
		})
	}
}
