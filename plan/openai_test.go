package plan_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// oaProbeSim serves an Anthropic org "claude" and two OpenAI orgs: gpt_a
// (two keys, RPM 5,000 and TPM 2,000,000 for every model) and gpt_b (RPM
// 3,000, TPM 400,000), at speed k. The orgs returned name gpt_a's keys
// gpt_a1 and gpt_a2.
func oaProbeSim(t *testing.T, k float64) (*sim.Running, []org.Org) {
	t.Helper()
	cfg := sim.Config{Speed: k, Latency: sim.LatencyConfig{Zero: true}, Orgs: []sim.OrgConfig{
		{Name: "claude", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 50, ITPM: 30_000, OTPM: 8_000}}},
		{Name: "gpt_a", Provider: sim.ProviderOpenAI, Keys: []string{"sk-proj-sim-gpt-a-key1", "sk-proj-sim-gpt-a-key2"},
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 5000, TPM: 2_000_000}}},
		{Name: "gpt_b", Provider: sim.ProviderOpenAI, ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 400_000}}},
	}}
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := r.Server.Keys()
	return r, []org.Org{
		{Name: "claude", Key: org.NewKey(keys["claude"][0])},
		{Name: "gpt_a1", Key: org.NewKey(keys["gpt_a"][0]), Provider: org.OpenAI},
		{Name: "gpt_a2", Key: org.NewKey(keys["gpt_a"][1]), Provider: org.OpenAI},
		{Name: "gpt_b", Key: org.NewKey(keys["gpt_b"][0]), Provider: org.OpenAI},
	}
}

// TestProbeOpenAIOrgs: probe sends each OpenAI org one minimal chat
// completion per OpenAI model (and no Claude model), and reads its
// x-ratelimit-* headers into the limits file (RPM, TPM; K × the API's on
// a simulator at speed K), the org id from openai-organization (two keys
// of one organisation are flagged), the service tier and the cost, which
// is what the simulator billed.
func TestProbeOpenAIOrgs(t *testing.T) {
	t.Parallel()
	const k = 10
	r, orgs := oaProbeSim(t, k)
	models := []string{"claude-haiku-4-5", "gpt-4.1-mini", "gpt-5-mini"}
	l, calls, err := plan.Probe(context.Background(), plan.ProbeConfig{Orgs: orgs, BaseURL: r.URL, Models: models, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// One probe per org and model of its provider: 1 + 3 × 2.
	if len(calls) != 7 {
		t.Errorf("%d probe calls, want 7 (each org probes its provider's models only)", len(calls))
	}
	if _, ok := l.Orgs["claude"]["gpt-4.1-mini"]; ok {
		t.Error("the Anthropic org was probed with an OpenAI model")
	}
	if _, ok := l.Orgs["gpt_b"]["claude-haiku-4-5"]; ok {
		t.Error("an OpenAI org was probed with a Claude model")
	}
	want := map[string][2]int64{"gpt_a1": {5000, 2_000_000}, "gpt_a2": {5000, 2_000_000}, "gpt_b": {3000, 400_000}}
	var total cost.Nanos
	for on, w := range want {
		for _, m := range models[1:] {
			g := l.Orgs[on][m]
			if g.Status != http.StatusOK || g.RPM != w[0]*k || g.TPM != w[1]*k || g.ITPM != 0 || g.OTPM != 0 {
				t.Errorf("%s/%s: status %d rpm %d tpm %d itpm %d otpm %d; want rpm %d tpm %d", on, m, g.Status, g.RPM, g.TPM, g.ITPM, g.OTPM, w[0]*k, w[1]*k)
			}
			if g.Pool != "openai:"+m || !strings.HasPrefix(g.OrgID, "org-") || g.ServiceTier != "default" || g.CostNanos <= 0 ||
				g.Remaining.Requests <= 0 || g.Remaining.Tokens <= 0 || g.KeyFingerprint == "" {
				t.Errorf("%s/%s: %+v", on, m, g)
			}
			total += g.CostNanos
		}
	}
	total += l.Orgs["claude"]["claude-haiku-4-5"].CostNanos
	if led := r.Server.LedgerTotals(); int64(total) != led.CostNanos || l.ProbeCostNanos != total {
		t.Errorf("probe cost %d, file %d, ledger %d", total, l.ProbeCostNanos, led.CostNanos)
	}
	if len(l.SharedOrgs) != 1 || strings.Join(l.SharedOrgs[0], ",") != "gpt_a1,gpt_a2" || l.OrgIDs["gpt_a1"] == l.OrgIDs["gpt_b"] {
		t.Errorf("shared orgs %v, ids %v", l.SharedOrgs, l.OrgIDs)
	}
	if l.SpeedFactor != k {
		t.Errorf("speed factor %g", l.SpeedFactor)
	}
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range r.Server.Keys() {
		for _, key := range ks {
			if strings.Contains(string(b), key) {
				t.Fatal("the limits file contains a key")
			}
		}
	}
	l2, err := plan.ParseLimits(b)
	if err != nil {
		t.Fatal(err)
	}
	if g := l2.Orgs["gpt_b"]["gpt-4.1-mini"]; g.Pool != "openai:gpt-4.1-mini" || g.TPM != 400_000*k {
		t.Errorf("read back: %+v", g)
	}
}

// writeOpenAIJudge writes n OpenAI judge lines (and m Claude judge lines
// after them) and validates the file.
func writeOpenAIJudge(t *testing.T, n, m int) *workload.Summary {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mixed.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(f, n, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if m > 0 {
		if err := workload.GenerateJudge(f, m, 2, workload.GenOptions{Prefix: "claude-"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	ws, err := workload.Validate(path, workload.ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// TestProjectOpenAIItems: plan projects a file's OpenAI items — their
// cost at the OpenAI price table (the batch route at half), the lanes of
// the OpenAI orgs alone from the probed RPM and TPM (a second key of one
// organisation adds nothing), and the gate judges both providers'
// costs. Before, the OpenAI items were left out of the projection (and a
// file of OpenAI items alone could not be projected at all).
func TestProjectOpenAIItems(t *testing.T) {
	t.Parallel()
	const k = 10
	r, orgs := oaProbeSim(t, k)
	l, _, err := plan.Probe(context.Background(), plan.ProbeConfig{Orgs: orgs, BaseURL: r.URL, Models: []string{"claude-sonnet-4-5", "gpt-4.1-mini"}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	ws := writeOpenAIJudge(t, 1000, 500)
	in := plan.Input{Workload: ws, Prices: cost.Default(), Limits: l, Orgs: []string{"claude"}, OpenAIOrgs: []string{"gpt_a1", "gpt_a2", "gpt_b"}}
	p, err := plan.Project(in)
	if err != nil {
		t.Fatal(err)
	}
	var gpt *plan.ModelProjection
	var claude cost.Nanos
	for i, m := range p.Models {
		if m.Model == "gpt-4.1-mini" {
			gpt = &p.Models[i]
		} else {
			claude += m.Expected
		}
	}
	if gpt == nil || gpt.Provider != org.OpenAI || gpt.N != 1000 || gpt.Pool != "openai:gpt-4.1-mini" {
		t.Fatalf("no OpenAI model in the projection: %+v", p.Models)
	}
	ms := ws.OpenAIModels["gpt-4.1-mini"]
	price, err := cost.OpenAI().Lookup("gpt-4.1-mini")
	if err != nil {
		t.Fatal(err)
	}
	// n × (prompt × input + min(limit, 100) × output), in tenths of n$.
	inPer := float64(ms.EstInput) / 1000
	maxPer := float64(ms.MaxTokens) / 1000
	want := 1000 * (inPer*float64(price.Standard.Input) + min(maxPer, 100)*float64(price.Standard.Output)) / 10
	if d := float64(gpt.Expected) - want; d < 0 || d > 1 {
		t.Errorf("OpenAI expected cost %d n$, want %.1f", gpt.Expected, want)
	}
	if d := float64(gpt.BatchExpected) - want/2; d < 0 || d > 1 {
		t.Errorf("OpenAI batch expected cost %d n$, want half of %.1f", gpt.BatchExpected, want)
	}
	// The worst case at the priority rates: the projection does not read
	// the items' service_tier.
	worst := 1000 * (4*inPer*float64(price.Priority.Input) + maxPer*float64(price.Priority.Output)) / 10
	if d := float64(gpt.WorstCase) - worst; d < 0 || d > 1 {
		t.Errorf("OpenAI worst case %d n$, want %.1f", gpt.WorstCase, worst)
	}
	if p.PerArmExpected != claude+gpt.Expected {
		t.Errorf("total expected %d, want Claude %d + GPT %d", p.PerArmExpected, claude, gpt.Expected)
	}
	// The OpenAI pool's lanes: gpt_a1 by its cap or limits, gpt_a2 the
	// same organisation, gpt_b bound by its TPM (400,000 a minute over
	// the prompt and max_completion_tokens charged at admission).
	lanes := map[string]plan.LaneProjection{}
	for _, ln := range p.Lanes {
		if ln.Pool == "openai:gpt-4.1-mini" {
			lanes[ln.Org] = ln
		} else if ln.Org != "claude" {
			t.Errorf("an OpenAI org has a lane in a Claude pool: %+v", ln)
		}
	}
	if len(lanes) != 3 || lanes["gpt_a2"].BindingLimit != plan.BindSameOrg || lanes["gpt_a1"].RPM != 5000 {
		t.Errorf("OpenAI lanes %+v", lanes)
	}
	b := lanes["gpt_b"]
	charge := inPer + maxPer
	if b.BindingLimit != plan.BindTPM || b.RPM != 3000 || b.ITPMRPM < 400_000/charge*0.999 || b.ITPMRPM > 400_000/charge*1.001 {
		t.Errorf("gpt_b lane %+v, want tpm-bound at %.1f req/min", b, 400_000/charge)
	}
	// The gate judges both providers: a budget the Claude items alone
	// fit in pauses the run.
	g := plan.Gate(p, ws.N, plan.GateConfig{Budget: claude + gpt.Expected/2})
	if g.Decision != plan.Pause {
		t.Errorf("gate %v at a budget under the projection: %s", g.Decision, g.Explain)
	}
	// A file of OpenAI items alone is projected too.
	only := writeOpenAIJudge(t, 200, 0)
	po, err := plan.Project(plan.Input{Workload: only, Prices: cost.Default(), Limits: l, OpenAIOrgs: []string{"gpt_b"}})
	if err != nil {
		t.Fatal(err)
	}
	if po.PerArmExpected <= 0 || po.WallS <= 0 || len(po.Lanes) != 1 || po.Lanes[0].BindingLimit != plan.BindTPM {
		t.Errorf("OpenAI-only projection: expected %d wall %g lanes %+v", po.PerArmExpected, po.WallS, po.Lanes)
	}
}

// TestRoutesOpenAIItems: the routes of a file with OpenAI items. A file
// of GPT items alone gets auto's cheapest split for a deadline (some by
// batch at half price, the rest by sync), priced pro rata; and a mixed
// file's batch route ends when the slower provider's share does, each
// provider's batches spread over its own orgs only (here 10,000 Claude
// items on one Anthropic org: 240 s + 5 min + 60 s = 600 s; spread over
// all four orgs it would have been 450 s). Before, OpenAI items were not
// projected, and the batch route counted every org for every item.
func TestRoutesOpenAIItems(t *testing.T) {
	t.Parallel()
	ws := writeOpenAIJudge(t, 20_000, 0)
	in := plan.Input{Workload: ws, Prices: cost.Default(), OpenAIOrgs: []string{"g1", "g2"}, LatencyS: 2}
	p, err := plan.Project(in)
	if err != nil {
		t.Fatal(err)
	}
	// Each org's lane: 120 (gpt-mini) / 2 s = 3,600 a minute; 20,000
	// items by sync take 20,000 / 7,200 min = 166.7 s + warm-up + 2 s.
	r, err := plan.ProjectRoutes(p, in, plan.DefaultBatchModel(), 400)
	if err != nil {
		t.Fatal(err)
	}
	a := r.Auto
	if a == nil || !a.Meets || a.BatchItems < 100 || a.SyncItems < 1 || a.BatchItems+a.SyncItems != 20_000 {
		t.Fatalf("auto for 400 s: %+v", a)
	}
	if !(a.ExpectedCost < r.Sync.ExpectedCost && a.ExpectedCost > r.Batch.ExpectedCost) || r.Batch.ExpectedCost*2 > r.Sync.ExpectedCost+2 {
		t.Errorf("costs: sync %d, batch %d, auto %d (%d by batch)", r.Sync.ExpectedCost, r.Batch.ExpectedCost, a.ExpectedCost, a.BatchItems)
	}
	if got := r.SplitOpenAI(a.SyncItems); got != a.SyncItems {
		t.Errorf("the sync share's OpenAI items: %d of %d", got, a.SyncItems)
	}

	mixed := writeOpenAIJudge(t, 10_000, 10_000)
	in = plan.Input{Workload: mixed, Prices: cost.Default(), Orgs: []string{"claude"}, OpenAIOrgs: []string{"g1", "g2", "g3"}, LatencyS: 2}
	p, err = plan.Project(in)
	if err != nil {
		t.Fatal(err)
	}
	r, err = plan.ProjectRoutes(p, in, plan.DefaultBatchModel(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Batch.WallS != 600 {
		t.Errorf("mixed batch route: %g s, want 600 s (the Claude half on its one org)", r.Batch.WallS)
	}
	if got := r.SplitOpenAI(1000); got != 500 {
		t.Errorf("a sync share of 1,000 holds %d OpenAI items, want 500", got)
	}
}
