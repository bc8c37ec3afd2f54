package runner_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
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

// TestRunMixedFileByBatch: 'run --route batch' of a mixed file sends its
// Claude items in Message Batches on the Anthropic orgs and its GPT items
// in OpenAI batches on the OpenAI org, each once at the batch price; the
// summary's cost is the ledger's, and each results line is its
// provider's.
func TestRunMixedFileByBatch(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 2000, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 60, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 40, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	if err := os.WriteFile(input, append(claude.Bytes(), gpt.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	runDir := filepath.Join(t.TempDir(), "run")
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: runDir, Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1, MaxCost: cost.NanosPerUSD},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 100 {
		t.Fatalf("mixed run by batch: exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	nanos, billed, twice := sim.BatchBilling(r.Server.Ledger())
	if billed != 100 || twice != 0 || out.Summary.Cost.TotalNanos != nanos {
		t.Fatalf("ledger: %d batch requests billed (%d twice), %d n$; summary %d n$", billed, twice, nanos, out.Summary.Cost.TotalNanos)
	}
	byOrg := map[string]int{}
	for _, e := range r.Server.Ledger() {
		if e.ServiceTier != "batch" {
			t.Fatalf("a request billed outside a batch: %+v", e)
		}
		byOrg[e.Org]++
	}
	if byOrg["gpt"] != 40 || len(byOrg) < 2 {
		t.Fatalf("billed by org %v: want the 40 GPT items on gpt, the 60 Claude items on the Anthropic orgs", byOrg)
	}
	data, err := os.ReadFile(filepath.Join(runDir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var oaLines, anLines int
	for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var v struct {
			CustomID string          `json:"custom_id"`
			Response json.RawMessage `json:"response"`
			Result   json.RawMessage `json:"result"`
			Dispatch struct {
				Org, Route string
			} `json:"dispatch"`
		}
		if err := json.Unmarshal(l, &v); err != nil || v.Dispatch.Route != "batch" {
			t.Fatalf("line %s: %v", l, err)
		}
		switch {
		case strings.HasPrefix(v.CustomID, "gpt_judge_") && v.Response != nil && v.Result == nil && v.Dispatch.Org == "gpt":
			oaLines++
		case !strings.HasPrefix(v.CustomID, "gpt_judge_") && v.Result != nil && v.Response == nil && v.Dispatch.Org != "gpt":
			anLines++
		default:
			t.Fatalf("line of the wrong provider's shape or org: %s", l)
		}
	}
	if oaLines != 40 || anLines != 60 {
		t.Fatalf("%d OpenAI lines, %d Anthropic lines; want 40 and 60", oaLines, anLines)
	}
}

// TestRunMixedFileByAuto: 'run --route auto' of a mixed file sends its GPT
// items by the OpenAI Batch API (the cheapest; the router's projection
// covers the Claude items, here by sync under a deadline that batches
// would miss): every item once, no request billed twice, the summary's
// cost the ledger's.
func TestRunMixedFileByAuto(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 2000, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 60, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 40, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	// GPT items first, then Claude: auto's sync share (the first Claude
	// items) must not take a GPT item.
	if err := os.WriteFile(input, append(gpt.Bytes(), claude.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	runDir := filepath.Join(t.TempDir(), "run")
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: runDir, Prices: cost.Default(), Stderr: &log, Route: runner.RouteAuto,
		// Batches that the router expects to take four API days: under the
		// deadline the Claude items go by sync.
		Deadline: time.Minute, Limits: &plan.Limits{Batch: &plan.BatchModel{QueueWaitS: 400_000}},
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 100 {
		t.Fatalf("mixed run by auto: exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	led := r.Server.LedgerTotals()
	if led.DuplicateBodies != 0 || led.CostNanos != out.Summary.Cost.TotalNanos || led.Requests != 100 {
		t.Fatalf("ledger %d requests, %d bodies twice, %d n$; summary %d n$; log:\n%s", led.Requests, led.DuplicateBodies, led.CostNanos, out.Summary.Cost.TotalNanos, log.String())
	}
	var claudeSync int
	for _, e := range r.Server.Ledger() {
		if e.Org == "gpt" && e.ServiceTier != "batch" {
			t.Fatalf("a GPT item went by sync: %+v", e)
		}
		if e.Org != "gpt" && e.ServiceTier != "batch" {
			claudeSync++
		}
	}
	if claudeSync == 0 {
		t.Fatalf("no Claude item went by sync: the router's sync share was not exercised; log:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "40 OpenAI items go by batch first") {
		t.Errorf("no note on the OpenAI items; log:\n%s", log.String())
	}
}

// TestRunMixedFileByBatchOpenAIOrgOut: by --route batch, a mixed file whose
// only OpenAI org's key is revoked (its upload answered 401): the Claude
// items complete in Message Batches; the GPT items stay pending, none
// lost, and the run stops naming the first one's line and why its
// provider's org cannot create batches.
func TestRunMixedFileByBatchOpenAIOrgOut(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 2000, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
		c.Faults = []sim.Fault{{Kind: sim.FaultKeyRevoked, Org: "gpt"}}
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 30, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 20, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	if err := os.WriteFile(input, append(claude.Bytes(), gpt.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1},
	})
	s := out.Summary
	if out.Code() != runner.ExitIncomplete || s == nil || s.Succeeded != 30 || s.Unfinished != 20 || !s.DataLoss.Passed {
		t.Fatalf("exit %d, err %v, summary %+v", out.Code(), out.Err, s)
	}
	if !strings.Contains(s.StopReason, "line 31") || !strings.Contains(s.StopReason, "gpt: ") || !strings.Contains(s.StopReason, "401") {
		t.Fatalf("stop reason %q: want it to name line 31 and the gpt org's 401", s.StopReason)
	}
	if led := r.Server.LedgerTotals(); led.Requests != 30 || led.CostNanos != s.Cost.TotalNanos {
		t.Fatalf("ledger %+v, summary %d n$", led, s.Cost.TotalNanos)
	}
}
