package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/sdkdriver"
)

// nodeReport is what testdata/openai-node/driver.mjs prints.
type nodeReport struct {
	Differ   []string `json:"differ"`
	Failures []string `json:"failures"`
	Calls    int      `json:"calls"`
	// Objects is how many objects (nested ones included) were checked
	// against the SDK's declarations.
	Objects int `json:"objects"`
	// RetryAfterMsWait is how long the SDK waited before retrying a 429
	// whose retry-after-ms was 1.2 s, in seconds.
	RetryAfterMsWait float64    `json:"retryAfterMsWait"`
	Usages           []sdkUsage `json:"usages"`
}

// TestOpenAINodeSDK runs the official openai npm SDK (the version pinned
// in testdata/openai-node/package.json) through a judge workflow against
// the simulator: models, a completion, the same streamed with usage, the
// SDK's stream helper, an error event mid-stream (thrown as APIError), n
// choices, a reasoning model, JSON mode (its answer JSON; refused without
// JSON in the messages), structured outputs through parse() (the answer
// fits the json_schema), a 400, a 401, 404s (a model, a file, a
// batch), a 500 and a 429 it retries through, a 429 whose retry-after-ms
// it waits (1.2 s, not its own backoff nor the retry-after of 2 s), the
// quota 429 with and without retries, and the batch lifecycle with its
// output and error files (a line refused with 400, a cancelled batch's
// batch_cancelled lines). Every object it returns matches the SDK's own
// type declarations (0 differ) and the ledger equals its usages priced by
// package cost. Without node it is skipped, except under CI=true, where it
// fails.
func TestOpenAINodeSDK(t *testing.T) {
	dir := filepath.Join("testdata", "openai-node")
	node := sdkdriver.Node(t, dir)
	cfg := oaTestConfig()
	cfg.Speed = 200
	// 20 requests take 100 API seconds (0.5 s here): long enough for a
	// loaded machine's polls to see the batch in progress.
	cfg.Orgs[1].Batch.PerMinute = 12
	run := startSim(t, cfg)
	oa := run.Server.OpenAIOrgs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "driver.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SIM_URL="+run.URL, "SIM_KEY="+oa.Key, "SIM_ORG="+oa.ID, "SIM_PROJECT="+oa.Projects[0])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node driver.mjs: %v\n%s", err, stderr.String())
	}
	var rep nodeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("driver report %q: %v\n%s", out, err, stderr.String())
	}
	if len(rep.Failures) > 0 {
		t.Errorf("%d failures:\n  %s", len(rep.Failures), strings.Join(rep.Failures, "\n  "))
	}
	if len(rep.Differ) > 0 {
		t.Errorf("%d differ:\n  %s", len(rep.Differ), strings.Join(rep.Differ, "\n  "))
	}
	ledger := ledgerIsUsagesPriced(t, run, "oa", "npm SDK", rep.Usages)
	t.Logf("%d calls, %d objects checked, %d usages, 0 differ, a 429's retry-after-ms (1.2 s) waited %.3f s, ledger = usage priced = %d n$", rep.Calls, rep.Objects, len(rep.Usages), rep.RetryAfterMsWait, ledger)
}
