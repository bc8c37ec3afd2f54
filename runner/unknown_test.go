package runner_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
)

// Issue 29, finding 4 for 'run': a request file naming a model the price
// table lacks (Fable 5, which the simulator serves: a model released
// after the table) was refused outright. Without --max-cost it is run,
// priced as its pool's most expensive known model, with a warning; with
// --max-cost, which needs an exact price, validation refuses it naming
// the line and the reason.
func TestRunModelMissingFromPriceTable(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Limits[anthropic.PoolFable5] = sim.Limits{RPM: 1000, ITPM: 500_000, OTPM: 100_000}
		}
	})
	dir := t.TempDir()
	input := simtest.Judge(t, dir, 6, 1)
	b, err := os.ReadFile(input)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	lines[3] = bytes.Replace(lines[3], []byte(`"model":"claude-sonnet-4-5-20250929"`), []byte(`"model":"claude-fable-5"`), 1)
	if !bytes.Contains(lines[3], []byte("claude-fable-5")) {
		t.Fatalf("line 4 names no other model: %s", lines[3])
	}
	if err := os.WriteFile(input, bytes.Join(lines, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(maxCost cost.Nanos) (runner.Outcome, string) {
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log,
			Sync: dispatch.Config{Orgs: r.Server.Orgs(), BaseURL: r.URL, Speed: 50, Prices: cost.Default(), SampleEvery: -1, MaxCost: maxCost},
		})
		return out, log.String()
	}

	out, log := run(cost.Nanos(1e9))
	if out.Code() != runner.ExitUsage || out.Err == nil || !strings.Contains(out.Err.Error(), "line 4") ||
		!strings.Contains(out.Err.Error(), "--max-cost") || !strings.Contains(out.Err.Error(), "claude-fable-5") {
		t.Errorf("with --max-cost: exit %d, err %v; want a usage error naming line 4, the model and --max-cost", out.Code(), out.Err)
	}

	out, log = run(0)
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 6 {
		t.Fatalf("without a cap: exit %d, err %v, log:\n%s", out.Code(), out.Err, log)
	}
	if !strings.Contains(log, "claude-fable-5") || !strings.Contains(log, "estimate") {
		t.Errorf("no warning about the estimated price; log:\n%s", log)
	}
	f, err := os.ReadFile(out.ResultsPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(bytes.TrimSpace(f), []byte("\n")) {
		var v struct {
			Dispatch struct {
				CostUSD float64 `json:"cost_usd"`
			} `json:"dispatch"`
		}
		if err := json.Unmarshal(line, &v); err != nil || v.Dispatch.CostUSD <= 0 {
			t.Errorf("result %s: want a priced dispatch (err %v)", line, err)
		}
	}
}
