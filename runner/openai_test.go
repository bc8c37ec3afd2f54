package runner_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// 'run' of a mixed file (Claude and GPT judge items): each item goes to
// its provider's orgs and the run completes, its cost the simulator's
// ledger; without an OpenAI org the file is refused before anything is
// sent, naming its first OpenAI line (TestRunMixedFileByBatch and
// TestRunMixedFileByAuto send them by the other routes).
func TestRunMixedFile(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 5, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 5, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	// Lines 1-5 Claude, 6-10 GPT.
	if err := os.WriteFile(input, append(claude.Bytes(), gpt.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(orgs []org.Org, route string) (runner.Outcome, string) {
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log, Route: route,
			Sync: dispatch.Config{Orgs: orgs, BaseURL: r.URL, Speed: 50, Prices: cost.Default(), SampleEvery: -1},
		})
		return out, log.String()
	}
	out, log := run(r.Server.Orgs(), "")
	if out.Code() != runner.ExitUsage || out.Err == nil || !strings.Contains(out.Err.Error(), "line 6") || !strings.Contains(out.Err.Error(), "no OpenAI org") {
		t.Fatalf("without an OpenAI org: exit %d, err %v; want a usage error naming line 6", out.Code(), out.Err)
	}
	if got := r.Server.LedgerTotals().Requests; got != 0 {
		t.Fatalf("%d requests sent before the refusal", got)
	}
	out, log = run(r.Server.AllOrgs(), "")
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 10 {
		t.Fatalf("mixed run: exit %d, err %v, log:\n%s", out.Code(), out.Err, log)
	}
	if led := r.Server.LedgerTotals(); led.CostNanos != out.Summary.Cost.TotalNanos || led.ByOrg["gpt"].Requests != 5 {
		t.Fatalf("ledger %+v, summary %d n$", led, out.Summary.Cost.TotalNanos)
	}
	if !strings.Contains(log, "5 OpenAI items") {
		t.Errorf("no note on the OpenAI items; log:\n%s", log)
	}
}

// A file of OpenAI items only (nothing for plan to project) runs too.
func TestRunOpenAIOnlyFile(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	input := filepath.Join(t.TempDir(), "gpt.jsonl")
	var gpt bytes.Buffer
	if err := workload.GenerateOpenAIJudge(&gpt, 8, 2, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(input, gpt.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 50, Prices: cost.Default(), SampleEvery: -1, MaxCost: cost.NanosPerUSD},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 8 || out.Summary.Cost.TotalNanos != r.Server.LedgerTotals().CostNanos {
		t.Fatalf("exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
}

// Two runs of GPT items on the same OpenAI keys at once, sharing their
// budget in Redis (--shared): both complete, each item once, and the
// organisation's requests in flight never pass its one cap between them.
func TestRunOpenAISharedBudget(t *testing.T) {
	t.Parallel()
	url := testredis.URL(t)
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 30000, TPM: 100_000_000}}})
	})
	var gptOrgs []org.Org
	for _, o := range r.Server.AllOrgs() {
		if o.ProviderName() == org.OpenAI {
			gptOrgs = append(gptOrgs, o)
		}
	}
	const n, capN = 80, 6
	outs := make(chan runner.Outcome, 2)
	for i := range 2 {
		input := filepath.Join(t.TempDir(), "gpt.jsonl")
		var gpt bytes.Buffer
		if err := workload.GenerateOpenAIJudge(&gpt, n, int64(10+i), workload.GenOptions{Prefix: fmt.Sprintf("p%d_", i)}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(input, gpt.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		go func() {
			outs <- runner.Run(t.Context(), runner.Config{
				Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Shared: runner.Shared{URL: url},
				Sync: dispatch.Config{Orgs: gptOrgs, BaseURL: r.URL, Speed: 50, Prices: cost.Default(), SampleEvery: -1,
					Caps: map[string]int{"gpt-mini": capN}},
			})
		}()
	}
	for range 2 {
		out := <-outs
		if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != n {
			t.Fatalf("exit %d, err %v", out.Code(), out.Err)
		}
	}
	if led := r.Server.LedgerTotals(); led.Requests != 2*n || led.Duplicates != 0 {
		t.Fatalf("ledger %+v", led)
	}
	if st := r.Server.Stats().Org("gpt"); st.MaxInFlight > capN || st.MaxInFlight == 0 {
		t.Fatalf("%d requests in flight on the one key between two processes, cap %d", st.MaxInFlight, capN)
	}
}
