package plan_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/sim"
)

// startSim starts a preset on loopback and returns it with one org.Org per
// simulated org (its first key).
func startSim(t *testing.T, cfg sim.Config) (*sim.Running, []org.Org) {
	t.Helper()
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	var orgs []org.Org
	for _, o := range cfg.Orgs {
		orgs = append(orgs, org.Org{Name: o.Name, Key: org.NewKey(r.Server.Keys()[o.Name][0])})
	}
	return r, orgs
}

// TestProbeOrigin3Org probes the simulator's origin-3org preset and checks
// that the limits file holds exactly the preset's limits, times K at speed
// K (the simulator multiplies every limit by K; the file records the
// headers as sent and the speed factor, and Project divides by it), with
// each probe's cost from its usage.
func TestProbeOrigin3Org(t *testing.T) {
	t.Parallel()
	for _, speed := range []float64{1, 20} {
		t.Run(fmt.Sprintf("K=%g", speed), func(t *testing.T) {
			t.Parallel()
			probeOrigin(t, speed)
		})
	}
}

func probeOrigin(t *testing.T, speed float64) {
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = speed
	r, orgs := startSim(t, cfg)
	models := []string{"claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", "claude-opus-4-8", "claude-3-sonnet-20240229"}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	l, calls, err := plan.Probe(context.Background(), plan.ProbeConfig{Orgs: orgs, BaseURL: r.URL, Models: models, Prices: cost.Default(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != len(orgs)*len(models) {
		t.Fatalf("%d calls", len(calls))
	}
	var total cost.Nanos
	for _, oc := range cfg.Orgs {
		got := l.Orgs[oc.Name]
		for _, m := range models[:3] {
			want := oc.Limits[anthropic.PoolOf(m)]
			k := int64(speed)
			want.RPM, want.ITPM, want.OTPM = want.RPM*k, want.ITPM*k, want.OTPM*k
			g := got[m]
			if g.Status != http.StatusOK || g.RPM != want.RPM || g.ITPM != want.ITPM || g.OTPM != want.OTPM {
				t.Errorf("K=%g %s/%s: status %d rpm %d itpm %d otpm %d; preset %+v", speed, oc.Name, m, g.Status, g.RPM, g.ITPM, g.OTPM, want)
			}
			if g.OrgID != oc.ID || g.ServiceTier != "standard" || g.CostNanos <= 0 || g.Remaining.Requests <= 0 {
				t.Errorf("K=%g %s/%s: %+v (org id %s)", speed, oc.Name, m, g, oc.ID)
			}
			if g.KeyFingerprint != org.Fingerprint(r.Server.Keys()[oc.Name][0]) {
				t.Errorf("key fingerprint %q", g.KeyFingerprint)
			}
			total += g.CostNanos
		}
		// An old model is a 404 on every org: recorded, not a crash.
		if g := got["claude-3-sonnet-20240229"]; g.Status != http.StatusNotFound || !strings.Contains(g.Error, "not_found_error") {
			t.Errorf("K=%g %s old model: %+v", speed, oc.Name, g)
		}
		if l.OrgIDs[oc.Name] != oc.ID {
			t.Errorf("org id of %s = %q", oc.Name, l.OrgIDs[oc.Name])
		}
	}
	// The probe's cost is what the simulator billed.
	if led := r.Server.LedgerTotals(); int64(total) != led.CostNanos || l.ProbeCostNanos != total {
		t.Errorf("K=%g probe cost %d, file %d, ledger %d", speed, total, l.ProbeCostNanos, led.CostNanos)
	}
	if !l.OrgsDistinctAdditive || len(l.SharedOrgs) != 0 || !l.ProbedAt.Equal(now) || l.Source != "probe" {
		t.Errorf("file header: %+v", l)
	}
	if _, ok := l.Prices["claude-sonnet-4-5"]; !ok || l.PricesSource != "embedded" {
		t.Errorf("prices not recorded: %v %q", l.Prices, l.PricesSource)
	}
	if speed != 1 && l.SpeedFactor != speed {
		t.Errorf("speed factor %g, want %g", l.SpeedFactor, speed)
	}
	// Projected from the file, the lanes are in API units whatever K:
	// high_prio's Sonnet RPM is 30,000 a minute.
	p, err := plan.Project(plan.Input{Workload: judgeSummary(t, 100), Prices: cost.Default(), Limits: l, Orgs: []string{"high_prio"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Lanes[0].RPM; got != 30_000 {
		t.Errorf("K=%g: lane RPM %g, want the API's 30,000", speed, got)
	}
	// The written file reads back the same, and keeps no key.
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range r.Server.Keys() {
		for _, k := range ks {
			if strings.Contains(string(b), k) {
				t.Fatal("the limits file contains a key")
			}
		}
	}
	l2, err := plan.ParseLimits(b)
	if err != nil {
		t.Fatal(err)
	}
	for on, ms := range l.Orgs {
		for m, v := range ms {
			if l2.Orgs[on][m] != v {
				t.Errorf("round trip %s/%s: %+v vs %+v", on, m, l2.Orgs[on][m], v)
			}
		}
	}
}

// TestProbeSharedOrgAnd429: two keys of one organisation are flagged (their
// limits do not add), and a probe refused with a 429 is recorded as status
// 429 with the limits its headers carry.
func TestProbeSharedOrgAnd429(t *testing.T) {
	t.Parallel()
	cfg := sim.Config{Latency: sim.LatencyConfig{Zero: true}, Orgs: []sim.OrgConfig{
		{Name: "solo", Keys: []string{"sk-ant-sim-solo-1", "sk-ant-sim-solo-2"},
			Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 1, ITPM: 30_000, OTPM: 8_000}}},
		{Name: "other", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 50, ITPM: 30_000, OTPM: 8_000}}},
	}}
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := r.Server.Keys()
	orgs := []org.Org{
		{Name: "a", Key: org.NewKey(keys["solo"][0])},
		{Name: "b", Key: org.NewKey(keys["solo"][1])},
		{Name: "c", Key: org.NewKey(keys["other"][0])},
	}
	// Two models of one pool: RPM 1 lets the first through and refuses the second.
	models := []string{"claude-sonnet-4-5", "claude-sonnet-4-6"}
	l, _, err := plan.Probe(context.Background(), plan.ProbeConfig{Orgs: orgs, BaseURL: r.URL, Models: models})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.SharedOrgs) != 1 || strings.Join(l.SharedOrgs[0], ",") != "a,b" || l.OrgsDistinctAdditive {
		t.Errorf("shared orgs %v additive %v", l.SharedOrgs, l.OrgsDistinctAdditive)
	}
	n429 := 0
	for _, on := range []string{"a", "b"} {
		for _, m := range models {
			g := l.Orgs[on][m]
			if g.Status == http.StatusTooManyRequests {
				n429++
				if g.RPM != 1 || !strings.Contains(g.Error, "rate_limit_error") {
					t.Errorf("%s/%s 429 entry: %+v", on, m, g)
				}
			}
		}
	}
	if n429 == 0 {
		t.Errorf("no 429 recorded with RPM 1 on a shared org: %+v", l.Orgs)
	}
	found := false
	for _, n := range l.Notes {
		found = found || strings.Contains(n, "do not add")
	}
	if !found {
		t.Errorf("notes %v", l.Notes)
	}
	// The projection over these orgs counts the shared org once.
	p, err := plan.Project(plan.Input{Workload: judgeSummary(t, 100), Prices: cost.Default(), Orgs: []string{"a", "b", "c"}, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	if b := p.Lanes[1]; b.Org != "b" || b.BindingLimit != plan.BindSameOrg || b.CeilingRPM != 0 {
		t.Errorf("lane b %+v", b)
	}
}
