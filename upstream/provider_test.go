package upstream

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/sim"
)

// oaSim serves two OpenAI orgs ("gpt_a" with two keys, "gpt_b") and an
// Anthropic one.
func oaSim(t *testing.T, mutate func(*sim.Config)) (*sim.Running, []org.Org) {
	t.Helper()
	cfg, err := sim.Preset(sim.PresetBuild3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 50
	cfg.Orgs = append(cfg.Orgs[:1],
		sim.OrgConfig{Name: "gpt_a", Provider: sim.ProviderOpenAI, Keys: []string{"sk-proj-sim-gpt-a-key1", "sk-proj-sim-gpt-a-key2"},
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 5000, TPM: 2_000_000}}},
		sim.OrgConfig{Name: "gpt_b", Provider: sim.ProviderOpenAI, ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 5000, TPM: 2_000_000}}})
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, r.Server.AllOrgs()
}

func named(orgs []org.Org, name string) org.Org {
	for _, o := range orgs {
		if o.Name == name {
			return o
		}
	}
	panic(name)
}

func oaRequest(t *testing.T, p *Provider, base string, o org.Org, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+p.Endpoint(), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	p.SetHeaders(req.Header, o, true)
	return req
}

// An OpenAI chat completion goes through the one attempt with OpenAI's
// addressing and classifier: a success with its usage, priced exactly as
// the simulator's ledger bills it, its rate limits mapped onto the
// mirrors (requests, and the one tokens bucket as the admission-charged
// input bucket), and its organisation learnt from openai-organization.
func TestOpenAIAttemptThroughTheSeam(t *testing.T) {
	t.Parallel()
	r, orgs := oaSim(t, nil)
	o := named(orgs, "gpt_b")
	if For(o) != OpenAI || For(named(orgs, orgs[0].Name)) != Anthropic {
		t.Fatalf("For: %v %v", For(o).Name(), For(orgs[0]).Name())
	}
	it := Item{Model: "gpt-4.1-mini", EstInput: 20, MaxTokens: 50, Choices: 2}
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":50,"n":2,"messages":[{"role":"user","content":"Rate this answer from 1 to 10."}]}`
	res := OpenAI.Send(http.DefaultClient, oaRequest(t, OpenAI, r.URL, o, body), 1<<20, nil)
	if res.Outcome.Kind != anthropic.Success || res.Usage == nil || res.Usage.OpenAI == nil {
		t.Fatalf("outcome %+v usage %+v", res.Outcome, res.Usage)
	}
	c, err := OpenAI.Cost(nil, it.Model, res.Usage, false)
	if err != nil {
		t.Fatal(err)
	}
	if led := r.Server.LedgerTotals(); int64(c) != led.CostNanos || c == 0 {
		t.Fatalf("priced %d n$, the ledger billed %d n$", c, led.CostNanos)
	}
	fb := OpenAI.Feedback(res.Outcome, res.Header, res.At, res.Usage, it, c)
	lim := fb.Limits
	if !lim.Requests.Present || !lim.Input.Present || lim.Output.Present || lim.Input.Limit != lim.Tokens.Limit || lim.OrganizationID == "" {
		t.Fatalf("limits %+v", lim)
	}
	// The tokens bucket was charged the prompt and max × n at admission.
	if want := float64(res.Usage.Input + res.Usage.CacheRead + 50*2); fb.Actual.Input != want || fb.Actual.Output != 0 {
		t.Fatalf("actual %+v, want input %v", fb.Actual, want)
	}
	if d := OpenAI.Demand(it); d.EstInput != 20+100 || d.MaxTokens != 0 || d.Output() != 100 {
		t.Fatalf("demand %+v", d)
	}
	if got := OpenAI.RequestID(res.Header); got == "" {
		t.Fatal("no x-request-id")
	}
}

// The two 429s stay apart: a rate limit is retryable, insufficient_quota
// stops every lane of the org with a message that says so (and no key).
func TestOpenAIClassifyTheTwo429s(t *testing.T) {
	t.Parallel()
	now := time.Now()
	h := http.Header{}
	h.Set("retry-after-ms", "1500")
	rl, u := OpenAI.Classify(429, h, []byte(`{"error":{"message":"Rate limit reached for gpt-4.1-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}`), nil, now)
	if rl.Kind != anthropic.Retryable || !rl.RateLimited || !rl.HasRetryAfter || rl.RetryAfter != 1500*time.Millisecond || u != nil {
		t.Fatalf("rate limit: %+v", rl)
	}
	q, _ := OpenAI.Classify(429, http.Header{}, []byte(`{"error":{"message":"You exceeded your current quota, key sk-proj-abcdefghijkl.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`), nil, now)
	if q.Kind != anthropic.LaneFatal || q.Scope != anthropic.ScopeOrg || q.RateLimited || !strings.Contains(q.Reason, "quota") || strings.Contains(q.Reason, "abcdefghijkl") {
		t.Fatalf("quota: %+v", q)
	}
	cut, _ := OpenAI.Classify(200, http.Header{}, []byte(`{"id":"chatcmpl-1","object":"chat.comp`), nil, now)
	if cut.Kind != anthropic.Retryable || !MayHaveBilled(cut, true) {
		t.Fatalf("a cut 2xx: %+v", cut)
	}
	if s5, _ := OpenAI.Classify(503, http.Header{}, nil, nil, now); s5.Kind != anthropic.Retryable {
		t.Fatalf("503: %+v", s5)
	}
}

// The worst case of an OpenAI request: its input bounded by its bytes,
// max_completion_tokens (else the model's maximum) for each choice.
func TestOpenAIWorstCase(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`)
	p, _ := cost.OpenAI().Lookup("gpt-4.1")
	got, err := OpenAI.WorstCase(nil, Item{Model: "gpt-4.1", EstInput: 10, Choices: 3}, body, false)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := cost.OpenAI().WorstCase("gpt-4.1", int64(len(body)), p.MaxOutput, 3, false)
	if got != want || want == 0 {
		t.Fatalf("worst %d, want %d", got, want)
	}
	half, _ := OpenAI.WorstCase(nil, Item{Model: "gpt-4.1", EstInput: 10, Choices: 3}, body, true)
	if 2*half < got-1 || 2*half > got+1 {
		t.Fatalf("batch worst %d, sync %d", half, got)
	}
	if _, err := OpenAI.WorstCase(nil, Item{Model: "gpt-nope"}, nil, false); err == nil {
		t.Fatal("an unknown model was priced")
	}
}

// Pools and caps: OpenAI limits are per model, so each model (a dated
// snapshot with its model) is a pool; lanes of a pool are only its
// provider's orgs; caps come by family.
func TestOpenAIPoolsLanesAndCaps(t *testing.T) {
	t.Parallel()
	if a, b := OpenAI.PoolOf("gpt-4.1-mini"), OpenAI.PoolOf("gpt-4.1-mini-2025-04-14"); a != b || OfPool(a) != OpenAI || OfPool(anthropic.PoolSonnet4) != Anthropic {
		t.Fatalf("pools %q %q", a, b)
	}
	if OpenAI.PoolOf("gpt-4.1") == OpenAI.PoolOf("gpt-4.1-mini") {
		t.Fatal("two models share a pool")
	}
	for m, want := range map[string]int{"gpt-4.1": 100, "gpt-4o-mini": 120, "o3": 40, "davinci": 40} {
		if got := OpenAI.CapFor(nil, m); got != want {
			t.Errorf("cap of %s = %d, want %d", m, got, want)
		}
	}
	if got := OpenAI.CapFor(map[string]int{FamilyOSeries: 7}, "o4-mini"); got != 7 {
		t.Errorf("configured o-series cap: %d", got)
	}
	orgs := []org.Org{{Name: "c", Key: org.NewKey("k1")}, {Name: "g1", Key: org.NewKey("k2"), Provider: org.OpenAI}, {Name: "g2", Key: org.NewKey("k3"), Provider: org.OpenAI}}
	s := NewLanes(LanesConfig{Orgs: orgs})
	var names []string
	for _, l := range s.Pool(OpenAI.PoolOf("gpt-4.1"), 5) {
		names = append(names, l.Org)
	}
	if strings.Join(names, ",") != "g1,g2" || len(s.Pool(anthropic.PoolSonnet4, 5)) != 1 {
		t.Fatalf("OpenAI lanes %v", names)
	}
}

// Two keys of one OpenAI organisation hold one cap: the discovery request
// (GET /v1/models?limit=1 with the Bearer key) learns openai-organization
// for each, and the later key's lanes stop.
func TestOpenAISameOrganisationDiscovered(t *testing.T) {
	t.Parallel()
	r, all := oaSim(t, nil)
	a := named(all, "gpt_a")
	second := org.Org{Name: "gpt_a2", Key: org.NewKey("sk-proj-sim-gpt-a-key2"), Provider: org.OpenAI}
	orgs := []org.Org{a, second, named(all, "gpt_b")}
	var dropped []string
	o := NewOrgs(orgs, func(drop, keep, id, reason string) { dropped = append(dropped, drop+"→"+keep) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Discover(ctx, Discovery{Client: http.DefaultClient, Base: r.URL, Orgs: orgs, Speed: 50})
	waitKnown(t, o, "gpt_a", "gpt_a2", "gpt_b")
	ida, _ := o.ID("gpt_a")
	idb, _ := o.ID("gpt_b")
	if !strings.HasPrefix(ida, "org-") || ida == idb {
		t.Fatalf("ids %q %q", ida, idb)
	}
	if o.Dropped("gpt_a2") == "" || o.Dropped("gpt_a") != "" || o.Dropped("gpt_b") != "" {
		t.Fatalf("dropped %v", dropped)
	}
	if strings.Contains(o.Dropped("gpt_a2"), "key2") {
		t.Fatal("a key in the notice")
	}
}
