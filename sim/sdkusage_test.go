package sim

import (
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
)

// sdkUsage is one usage an SDK conformance driver saw, as it reports it.
type sdkUsage struct {
	Model            string `json:"model"`
	Batch            bool   `json:"batch"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
	ReasoningTokens  int64  `json:"reasoning_tokens"`
}

// ledgerIsUsagesPriced checks that what run's ledger billed org equals the
// usages an SDK's driver saw, priced by cost.OpenAI(), and that some was
// billed; it returns the ledger's total.
func ledgerIsUsagesPriced(t *testing.T, run *Running, org, sdk string, usages []sdkUsage) int64 {
	t.Helper()
	var priced cost.Nanos
	for _, u := range usages {
		n, err := cost.OpenAI().Cost(u.Model, openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
			PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: u.CachedTokens},
			CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: u.ReasoningTokens}}, u.Batch)
		if err != nil {
			t.Fatal(err)
		}
		priced += n
	}
	var ledger int64
	for _, e := range run.Server.Ledger() {
		if e.Org == org {
			ledger += e.CostNanos
		}
	}
	if ledger != int64(priced) || priced == 0 {
		t.Errorf("ledger %d n$, the %s's %d usages priced %d n$", ledger, sdk, len(usages), priced)
	}
	return ledger
}
