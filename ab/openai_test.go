package ab

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/sim"
)

// TestRunRefusesOpenAIOrgs: the A/B sends the Phase 6 Claude judge
// workload, and its legacy arm is the Anthropic SDK's path on one org, so
// an OpenAI org cannot take part in it. With one Anthropic and one OpenAI
// org configured (the OpenAI one first, where the legacy arm's org is
// taken from) the A/B is refused before anything is sent, saying that
// OpenAI orgs cannot serve it. Before, the two orgs passed the
// two-org precondition and the legacy arm sent Claude requests with the
// OpenAI key.
func TestRunRefusesOpenAIOrgs(t *testing.T) {
	t.Parallel()
	r, err := sim.Start(sim.Config{Speed: 50, Latency: sim.LatencyConfig{Zero: true}, Orgs: []sim.OrgConfig{
		{Name: "claude", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 4000, ITPM: 2_000_000, OTPM: 400_000}}},
		{Name: "gpt", Provider: sim.ProviderOpenAI, ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 5000, TPM: 2_000_000}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := r.Server.Keys()
	cfg := Config{
		N: 100, Speed: 50, Dir: filepath.Join(t.TempDir(), "ab"), ProgressEvery: -1, BaseURL: r.URL, Confirm: true,
		StormTest: StormTest{N: 300, Speed: 50},
		Orgs: []org.Org{
			{Name: "gpt", Key: org.NewKey(keys["gpt"][0]), Provider: org.OpenAI},
			{Name: "claude", Key: org.NewKey(keys["claude"][0])},
		},
	}
	var out bytes.Buffer
	cfg.Stderr = &out
	_, err = Run(context.Background(), cfg)
	if !errors.Is(err, ErrTooFewOrgs) || !strings.Contains(out.String(), "blocked: the A/B needs at least 2 Anthropic orgs, found 1 (claude); gpt is an OpenAI org, which it cannot use: the A/B sends the Phase 6 Claude judge workload") {
		t.Fatalf("err %v, output:\n%s\nwant a refusal naming the OpenAI org and why", err, out.String())
	}
	if n := r.Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("a refused A/B sent %d requests", n)
	}
}
