package runner_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
)

// TestRunOpenAIServiceTiers: a run of GPT items asking for every service
// tier (priority, flex, default, auto, none) on models with and without
// priority and flex processing: each answer is billed at the tier that
// served it (the priority rates, flex at the Batch API rates), and the
// summary's cost is the simulator's ledger to the nano-dollar, which is
// each ledger entry's usage priced at its tier by package cost. Before,
// every request was billed, and summed, at the standard rates whatever
// its tier.
func TestRunOpenAIServiceTiers(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	tiers := []string{"priority", "flex", "default", "auto", ""}
	models := []string{"gpt-5-mini", "gpt-4.1-mini", "gpt-5-nano"}
	var in bytes.Buffer
	const n = 45
	for i := range n {
		body := map[string]any{"model": models[i%len(models)], "max_completion_tokens": 700,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("Is answer %d correct? Reply in JSON.", i)}}}
		if tier := tiers[i%len(tiers)]; tier != "" {
			body["service_tier"] = tier
		}
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("tier_%03d", i), "method": "POST", "url": "/v1/chat/completions", "body": body})
		in.Write(append(line, '\n'))
	}
	input := filepath.Join(t.TempDir(), "tiers.jsonl")
	if err := os.WriteFile(input, in.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 50, Prices: cost.Default(), SampleEvery: -1, MaxCost: cost.NanosPerUSD},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != n {
		t.Fatalf("exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	var priced, standard int64
	served := map[string]int{}
	for _, e := range r.Server.Ledger() {
		tier := e.ServiceTier
		if tier == "" {
			tier = cost.TierDefault
		}
		served[tier]++
		u := openai.Usage{PromptTokens: e.InputTokens + e.CacheRead, CompletionTokens: e.OutputTokens}
		u.PromptTokensDetails.CachedTokens = e.CacheRead
		u.CompletionTokensDetails.ReasoningTokens = e.ReasoningTokens
		c, err := cost.OpenAI().CostTier(e.Model, u, tier, false)
		if err != nil || int64(c) != e.CostNanos {
			t.Errorf("ledger entry %s at tier %s: %d n$, its usage priced %d n$ (%v)", e.Model, tier, e.CostNanos, c, err)
		}
		priced += int64(c)
		s, _ := cost.OpenAI().Cost(e.Model, u, false)
		standard += int64(s)
	}
	// 9 priority requests, 3 on each model: gpt-5-nano has no priority
	// (the default tier serves them); 9 flex, 3 on each: gpt-4.1-mini has
	// no flex.
	if served["priority"] != 6 || served["flex"] != 6 {
		t.Errorf("tiers served %v: want 6 priority (gpt-5-nano has none) and 6 flex (gpt-4.1-mini has none)", served)
	}
	if got := out.Summary.Cost.TotalNanos; got != priced || got != r.Server.LedgerTotals().CostNanos {
		t.Errorf("summary %d n$, ledger %d n$, the ledger's usages priced at their tiers %d n$ (at the standard rates %d n$)", got, r.Server.LedgerTotals().CostNanos, priced, standard)
	}
	if priced == standard {
		t.Errorf("the tiers changed nothing: %d n$", priced)
	}
}
