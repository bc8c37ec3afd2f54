package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// planRequests writes n judge requests (opts) and returns the path.
func planRequests(t *testing.T, n int, opts workload.GenOptions) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "req.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateJudge(f, n, 5, opts); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// orgsFile writes a TOML orgs file whose keys are in 0600 key files, so a
// test needs no environment variables.
func orgsFile(t *testing.T, keys map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	for _, name := range sortedNames(keys) {
		kf := filepath.Join(dir, name+".key")
		if err := os.WriteFile(kf, []byte(keys[name]), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "[[org]]\nname = %q\nkey_file = %q\n\n", name, kf)
	}
	p := filepath.Join(dir, "orgs.toml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func sortedNames(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func simKeys(r *sim.Running) map[string]string {
	m := map[string]string{}
	for name, ks := range r.Server.Keys() {
		m[name] = ks[0]
	}
	return m
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = mainCode(args, &o, &e)
	return code, o.String(), e.String()
}

func TestPlanExitCodes(t *testing.T) {
	t.Parallel()
	judge := planRequests(t, 300, workload.GenOptions{})
	// 300 Opus 4.8 requests that each generate 20,000 tokens: 300 × 20,000 ×
	// $25/M = $150 of output, over the $100 confirm threshold.
	big := planRequests(t, 300, workload.GenOptions{Model: "claude-opus-4-8", MaxTokens: 20000})
	orgs := orgsFile(t, map[string]string{"a": "sk-ant-test-a", "b": "sk-ant-test-b"})
	tests := []struct {
		name string
		args []string
		code int
		out  []string // substrings of stdout
	}{
		// 300 × (282 × $3/M + 100 × $15/M) ≈ $0.70.
		{"small passes", []string{"plan", "--orgs", orgs, judge}, exitOK,
			[]string{"gate: pass", "claude-sonnet-4-5-20250929", "binding", "no limits file"}},
		{"flags after the file", []string{"plan", judge, "--orgs", orgs, "--budget", "1"}, exitOK,
			[]string{"expected $0.70", "≤ $1.00 × (1 + 0.5) = $1.50 → within budget"}},
		{"over budget pauses", []string{"plan", "--orgs", orgs, "--budget", "0.40", judge}, exitPaused,
			[]string{"gate: pause", "> $0.400000 × (1 + 0.5) = $0.600000 → pause"}},
		{"tolerance lifts it", []string{"plan", "--orgs", orgs, "--budget", "0.40", "--tolerance", "1", judge}, exitOK, nil},
		{"$100 needs confirm", []string{"plan", "--orgs", orgs, "--expect-output", "20000", big}, exitRefused,
			[]string{"gate: confirm_required", "≥ $100.00 → --confirm required"}},
		{"confirm given", []string{"plan", "--orgs", orgs, "--expect-output", "20000", "--confirm", big}, exitOK,
			[]string{"→ --confirm given"}},
		{"phase6 shape, two arms", []string{"plan", "--phase6", "--n", "2000", "--orgs", orgs}, exitOK,
			[]string{"2,000 items × 2 arms", "total (2 arms)", "baseline arm", "projected speed-up"}},
		{"phase6 over budget", []string{"plan", "--phase6", "--n", "2000", "--budget", "5", "--tolerance", "0"}, exitPaused,
			[]string{"= 2 arms × $", "> $5.00 × (1 + 0) = $5.00"}},
		{"phase6 with limits", []string{"plan", "--phase6", "--n", "1000", "--limits", "../../plan/testdata/phase0_limits.json"}, exitOK,
			[]string{"high_prio", "low_prio", "30,000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestPlanUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	body := `{"custom_id":"a","params":{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}}
{"custom_id":"a","params":{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}}
{"custom_id":"c","params":{"model":"claude-fable-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}}
`
	if err := os.WriteFile(bad, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	judge := planRequests(t, 10, workload.GenOptions{})
	orgs := orgsFile(t, map[string]string{"a": "sk-ant-test-a"})
	for _, tc := range []struct {
		name string
		args []string
		err  []string
	}{
		{"invalid input", []string{"plan", "--orgs", orgs, bad}, []string{"line 2:", "duplicate", "line 3:", "claude-fable-5"}},
		{"no file", []string{"plan", "--orgs", orgs}, []string{"usage:"}},
		{"file and phase6", []string{"plan", "--phase6", judge}, []string{"usage:"}},
		{"pilot is a run flag", []string{"plan", "--pilot", "200", judge}, []string{"run --pilot", "--from-run"}},
		{"bad budget", []string{"plan", "--budget", "lots", judge}, []string{"--budget"}},
		{"missing limits", []string{"plan", "--limits", filepath.Join(dir, "none.json"), judge}, []string{"limits file"}},
		{"from-run of nothing", []string{"plan", "--from-run", filepath.Join(dir, "norun"), judge}, []string{"--from-run"}},
		{"count-tokens without keys", []string{"plan", "--orgs", filepath.Join(dir, "none.toml"), "--count-tokens", judge}, []string{"none.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d:\n%s", code, exitUsage, errOut)
			}
			for _, s := range tc.err {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
		})
	}
}

// TestPlanJSONCountTokensAndFromRun: 'plan --json --count-tokens' against
// the simulator, then a pilot of 50 items run by the engine and 'plan
// --from-run' re-projecting from it.
func TestPlanJSONCountTokensAndFromRun(t *testing.T) {
	t.Parallel()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 50
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := simKeys(r)
	orgs := orgsFile(t, keys)
	input := planRequests(t, 400, workload.GenOptions{})

	code, out, errOut := runCLI("plan", "--orgs", orgs, "--base-url", r.URL, "--count-tokens", "--count-sample", "20", "--json", "--speed", "50", input)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc plan.ProjectionJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if doc.N != 400 || doc.Gate != plan.Pass || len(doc.Lanes) != 3 || doc.ProjectedCostUSD.Expected <= 0 ||
		doc.ProjectedWallS <= 0 || doc.SpeedFactor != 50 || !strings.Contains(doc.Models[0].InputSource, "count_tokens on 20 of 400") {
		t.Errorf("json %s", out)
	}
	if led := r.Server.LedgerTotals(); led.Requests != 0 {
		t.Errorf("plan sent %d billed requests", led.Requests)
	}

	// A pilot of 50 items, as 'run --pilot 50' sends it.
	ctx := context.Background()
	ws, err := rundir.Validate(input, cost.Default())
	if err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(t.TempDir(), "run")
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: input, RunDir: runDir, Prices: cost.Default()}, ws)
	if err != nil {
		t.Fatal(err)
	}
	var orgList []org.Org
	for _, name := range sortedNames(keys) {
		orgList = append(orgList, org.Org{Name: name, Key: org.NewKey(keys[name])})
	}
	eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: orgList, BaseURL: r.URL, Speed: 50, Prices: cost.Default(), MaxSeq: 50, SampleEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Run(ctx); err != nil && !errors.Is(err, dispatch.ErrIncomplete) {
		t.Fatal(err)
	}
	job.Close()

	code, out, errOut = runCLI("plan", "--orgs", orgs, "--from-run", runDir, "--json", input)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	doc = plan.ProjectionJSON{}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	spent := float64(r.Server.LedgerTotals().CostNanos) / 1e9
	if doc.Done != 50 || doc.Models[0].Remaining != 350 || doc.ProjectedCostUSD.Spent != spent {
		t.Errorf("from-run: done %d remaining %d spent %v (ledger %v)", doc.Done, doc.Models[0].Remaining, doc.ProjectedCostUSD.Spent, spent)
	}
	// Another input's run directory is refused.
	other := planRequests(t, 10, workload.GenOptions{})
	if code, _, errOut := runCLI("plan", "--orgs", orgs, "--from-run", runDir, other); code != exitUsage || !strings.Contains(errOut, "another input") {
		t.Errorf("from-run of another input: exit %d %s", code, errOut)
	}
}

// TestPlanRoutes: 'plan' shows the sync and batch routes side by side, and
// with --deadline (wall-clock at the server's speed K) the auto split.
func TestPlanRoutes(t *testing.T) {
	t.Parallel()
	judge := planRequests(t, 300, workload.GenOptions{})
	orgs := orgsFile(t, map[string]string{"a": "sk-ant-test-a", "b": "sk-ant-test-b"})
	limits := filepath.Join(t.TempDir(), "limits.json")
	lim := `{"orgs":{"a":{"claude-sonnet-4-5":{"status":200,"rpm":30000}},"b":{"claude-sonnet-4-5":{"status":200,"rpm":30000}}},"batch":{"per_minute":100}}`
	if err := os.WriteFile(limits, []byte(lim), 0o644); err != nil {
		t.Fatal(err)
	}
	planJSON := func(t *testing.T, args ...string) plan.ProjectionJSON {
		t.Helper()
		code, out, errOut := runCLI(append([]string{"plan", "--orgs", orgs, "--json"}, append(args, judge)...)...)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var doc plan.ProjectionJSON
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if doc.Routes == nil {
			t.Fatalf("no routes: %s", out)
		}
		return doc
	}

	t.Run("no deadline", func(t *testing.T) {
		code, out, _ := runCLI("plan", "--orgs", orgs, "--json", judge)
		if code != exitOK || !strings.Contains(out, `"auto":null`) || !strings.Contains(out, `"deadline_s":0`) {
			t.Errorf("exit %d: %s", code, out)
		}
		d := planJSON(t)
		r := d.Routes
		// 150 per org: 240 + 150 × 0.03 + 60 = 304.5 s; half the sync cost.
		if r.Sync.Items != 300 || r.Batch.WallS != 304.5 || r.Batch.BoundS != 86400 || r.Sync.ExpectedUSD != d.ProjectedCostUSD.Expected ||
			r.Batch.ExpectedNanos*2 != r.Sync.ExpectedNanos || r.Sync.Binding != "cap" || r.Batch.Binding != "batch throughput" {
			t.Errorf("routes %+v", r)
		}
	})
	t.Run("deadline at speed K", func(t *testing.T) {
		// 1 min at K=10 is 600 API s, target 510 ≥ 304.5: all batch.
		r := planJSON(t, "--speed", "10", "--deadline", "1m").Routes
		if r.DeadlineS != 600 || r.Auto == nil || r.Auto.Meets == nil || !*r.Auto.Meets || r.Auto.BatchItems != 300 || r.Auto.WallAtSpeedS != 30.45 {
			t.Errorf("routes %+v auto %+v", r, r.Auto)
		}
		// 1 min at K=1: target 51 s < 304.5, sync takes seconds: all sync.
		r = planJSON(t, "--deadline", "1m").Routes
		if r.DeadlineS != 60 || r.Auto == nil || !*r.Auto.Meets || r.Auto.SyncItems != 300 || r.Auto.BatchItems != 0 {
			t.Errorf("auto %+v", r.Auto)
		}
	})
	t.Run("batch size and limits file", func(t *testing.T) {
		r := planJSON(t, "--batch-size", "50").Routes
		if r.BatchModel.MaxBatch != 50 || !strings.Contains(r.Batch.Explain, "150 per org in 3 batches of up to 50") {
			t.Errorf("batch %+v", r.Batch)
		}
		// per_minute 100: 240 + 150/100 × 60 + 60 = 390 s.
		r = planJSON(t, "--limits", limits).Routes
		if r.Batch.WallS != 390 || r.BatchModel.PerMinute != 100 || r.BatchModel.MaxBatch != plan.MaxBatchRequests {
			t.Errorf("batch %+v model %+v", r.Batch, r.BatchModel)
		}
	})
	t.Run("text", func(t *testing.T) {
		code, out, errOut := runCLI("plan", "--orgs", orgs, "--deadline", "2h", judge)
		for _, s := range []string{"routes (one arm", "batch  ", "auto", "24 h 00 min", "--route auto would send 300 items by batch and 0 by sync: meets the deadline", "no batch timing was ever measured"} {
			if !strings.Contains(out, s) {
				t.Errorf("stdout lacks %q (exit %d, %s):\n%s", s, code, errOut, out)
			}
		}
	})
	t.Run("bad flags", func(t *testing.T) {
		for _, args := range [][]string{{"--batch-size", "0"}, {"--batch-size", "100001"}, {"--deadline", "-1m"}} {
			code, _, errOut := runCLI(append([]string{"plan", "--orgs", orgs}, append(args, judge)...)...)
			if code != exitUsage || !strings.Contains(errOut, args[0]) {
				t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
			}
		}
	})
}

// 'plan --count-tokens' on a file of Anthropic and OpenAI requests with an
// OpenAI org first: count_tokens is Anthropic's, so it counts the Anthropic
// requests with the first Anthropic org's key and leaves the OpenAI
// requests at their local estimates. It asked with the first org's key
// whatever its provider, and sent the OpenAI requests to count_tokens too.
func TestPlanCountTokensCountsOnlyAnthropicRequests(t *testing.T) {
	t.Parallel()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 50
	cfg.Orgs = append([]sim.OrgConfig{{Name: "a_gpt", Provider: sim.ProviderOpenAI,
		ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 30_000, TPM: 50_000_000}}}}, cfg.Orgs...)
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := simKeys(r)
	dir := t.TempDir()
	writeOrgs := func(names ...string) string {
		var b strings.Builder
		for _, name := range names {
			kf := filepath.Join(dir, name+".key")
			if err := os.WriteFile(kf, []byte(keys[name]), 0o600); err != nil {
				t.Fatal(err)
			}
			provider := ""
			if name == "a_gpt" {
				provider = "provider = \"openai\"\n"
			}
			fmt.Fprintf(&b, "[[org]]\nname = %q\nkey_file = %q\n%s\n", name, kf, provider)
		}
		p := filepath.Join(dir, fmt.Sprintf("orgs%d.toml", len(names)))
		if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var anth, gpt, mixed bytes.Buffer
	if err := workload.GenerateJudge(&anth, 60, 5, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 40, 7, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	mixed.Write(anth.Bytes())
	mixed.Write(gpt.Bytes())
	input := filepath.Join(dir, "mixed.jsonl")
	gptOnly := filepath.Join(dir, "gpt.jsonl")
	if err := os.WriteFile(input, mixed.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gptOnly, gpt.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	all := writeOrgs("a_gpt", "high_prio", "batch")

	code, out, errOut := runCLI("plan", "--orgs", all, "--base-url", r.URL, "--count-tokens", "--count-sample", "0", "--json", "--speed", "50", input)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "org high_prio") {
		t.Errorf("stderr %q: want the count made with high_prio, the first Anthropic org", errOut)
	}
	var doc plan.ProjectionJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	var sawAnthropic, sawGPT bool
	for _, m := range doc.Models {
		switch {
		case strings.HasPrefix(m.Model, "claude-"):
			sawAnthropic = true
			if !strings.Contains(m.InputSource, "count_tokens on 60 of 60") {
				t.Errorf("%s input source %q, want count_tokens on all 60", m.Model, m.InputSource)
			}
		case strings.HasPrefix(m.Model, "gpt-"):
			sawGPT = true
			if m.InputSource != "local estimate" {
				t.Errorf("%s input source %q, want the local estimate", m.Model, m.InputSource)
			}
		}
	}
	if !sawAnthropic || !sawGPT {
		t.Errorf("models %+v: want one of each provider", doc.Models)
	}
	if led := r.Server.LedgerTotals(); led.Requests != 0 {
		t.Errorf("plan sent %d billed requests", led.Requests)
	}

	// Anthropic requests and only an OpenAI org: a usage error naming why.
	code, _, errOut = runCLI("plan", "--orgs", writeOrgs("a_gpt"), "--base-url", r.URL, "--count-tokens", input)
	if code != exitUsage || !strings.Contains(errOut, "Anthropic org") {
		t.Errorf("only an OpenAI org: exit %d, stderr %q; want %d naming the missing Anthropic org", code, errOut, exitUsage)
	}
	// Only OpenAI requests: nothing to count, said, and the plan goes on.
	code, _, errOut = runCLI("plan", "--orgs", writeOrgs("a_gpt"), "--base-url", r.URL, "--count-tokens", "--speed", "50", gptOnly)
	if code != exitOK || !strings.Contains(errOut, "no Anthropic requests to count") {
		t.Errorf("only OpenAI requests: exit %d, stderr %q; want %d and a note", code, errOut, exitOK)
	}
}
