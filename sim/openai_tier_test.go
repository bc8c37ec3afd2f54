package sim

import (
	"encoding/json"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
)

// TestOpenAIServiceTierBilling: a chat completion's service_tier decides
// the rates it is billed at, and its answer says the tier that served it:
// priority at the priority rates (about 1.75× to 2× the standard ones),
// flex at the Batch API rates, each only on the models that offer it (a
// model without the tier serves the request at the default tier); auto,
// default and none at the standard rates. Each ledger entry is its usage
// priced by hand from the rates of OpenAI's pricing pages (tenths of a
// nano-dollar per token) and by package cost alike. Before, every
// request was billed at the standard rates whatever the tier its answer
// named.
func TestOpenAIServiceTierBilling(t *testing.T) {
	t.Parallel()
	cfg := oaTestConfig()
	cfg.Orgs[len(cfg.Orgs)-1].ModelLimits = map[string]OpenAILimits{"*": {RPM: 6000, TPM: 10_000_000}}
	run := startSim(t, cfg)
	type rates struct{ in, cached, out int64 }
	cases := []struct {
		model, asked, served string
		r                    rates
	}{
		{"gpt-4.1-mini", "priority", "priority", rates{7000, 1750, 28000}},
		{"gpt-4.1-mini", "fast", "priority", rates{7000, 1750, 28000}},
		{"gpt-5-mini", "priority", "priority", rates{4500, 450, 36000}},
		{"o4-mini", "priority", "priority", rates{20000, 5000, 80000}},
		{"gpt-5-mini", "flex", "flex", rates{1250, 125, 10000}},
		{"o3", "flex", "flex", rates{10000, 2500, 40000}},
		{"gpt-4.1-mini", "flex", "default", rates{4000, 1000, 16000}}, // no flex for gpt-4.1-mini
		{"gpt-5-nano", "priority", "default", rates{500, 50, 4000}},   // no priority for gpt-5-nano
		{"gpt-4.1-mini", "auto", "default", rates{4000, 1000, 16000}},
		{"gpt-4.1-mini", "default", "default", rates{4000, 1000, 16000}},
		{"gpt-4.1-mini", "", "default", rates{4000, 1000, 16000}},
	}
	var sum int64
	for i, c := range cases {
		req := map[string]any{"model": c.model, "max_completion_tokens": 600, "messages": []map[string]string{{"role": "user", "content": "Grade this answer, case " + string(rune('a'+i))}}}
		if c.asked != "" {
			req["service_tier"] = c.asked
		}
		body, _ := json.Marshal(req)
		rep := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, body)
		if rep.status != 200 {
			t.Fatalf("%s %q: HTTP %d %s", c.model, c.asked, rep.status, rep.body)
		}
		var cc openai.ChatCompletion
		if err := json.Unmarshal(rep.body, &cc); err != nil || cc.Usage == nil {
			t.Fatalf("%s: %v %s", c.model, err, rep.body)
		}
		if cc.ServiceTier != c.served {
			t.Errorf("%s asking %q: answered service_tier %q, want %q", c.model, c.asked, cc.ServiceTier, c.served)
		}
		u := *cc.Usage
		cached := u.PromptTokensDetails.CachedTokens
		want := ((u.PromptTokens-cached)*c.r.in + cached*c.r.cached + u.CompletionTokens*c.r.out + 5) / 10
		got, err := cost.OpenAI().CostTier(c.model, u, cc.ServiceTier, false)
		if err != nil || int64(got) != want {
			t.Errorf("%s asking %q: package cost %d (%v), by hand %d", c.model, c.asked, got, err, want)
		}
		led := run.Server.Ledger()
		e := led[len(led)-1]
		if e.CostNanos != want {
			t.Errorf("%s asking %q: ledger %d n$, by hand %d n$ (usage %+v)", c.model, c.asked, e.CostNanos, want, u)
		}
		if tier := map[string]string{"default": ""}[c.served]; c.served != "default" {
			tier = c.served
			if e.ServiceTier != tier {
				t.Errorf("%s asking %q: ledger tier %q", c.model, c.asked, e.ServiceTier)
			}
		}
		sum += want
	}
	if got := run.Server.LedgerTotals().CostNanos; got != sum {
		t.Errorf("ledger total %d n$, by hand %d n$", got, sum)
	}
}
