//go:build sdkexamples

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

// TestOpenAIPythonSDK runs the official openai Python SDK through a judge
// workflow against the simulator (testdata/openai-python/driver.py):
// models, a completion with its headers, the same streamed with usage (raw
// events and the SDK's Stream: accumulated = unstreamed; obfuscation on
// and off), the SDK's stream helper, an error event mid-stream, n choices,
// a reasoning model, JSON mode, structured outputs through parse() and the
// stream helper (a pydantic model with a nested one), the async client,
// the errors (401, 404 for a model, a file and a batch, 400, a 500 and a
// rate-limit 429 retried through, the 429 waiting retry-after-ms, a
// drained TPM bucket's 429 and the retries that wait it out, the quota 429
// raised as RateLimitError insufficient_quota with and without retries),
// and the batch lifecycle (upload, retrieve, create, cancel, poll, list,
// the output and error files, the files list and delete). Every answer's
// body validates strictly against the SDK's own pydantic types with no
// field they do not declare, and the ledger equals the SDK's usages priced
// by package cost.
//
// CI cannot install the SDK (no PyPI), so it builds only with the tag,
// and fails, not skips, when python3 cannot import openai. PYTHONPATH may
// name a directory holding the SDK's sources and their pure-Python
// dependencies: openai, httpx, httpcore, h11, anyio, sniffio, idna,
// certifi, distro (2.x) and, for openai 3.x, httpx2 (pydantic's fork of
// httpx; httpx itself under that name serves the SDK's calls), with a
// jiter whose from_json parses with json.loads (the SDK uses it only in its
// stream helper, on partial structured output and strict tool-call
// arguments); pydantic and typing_extensions installed or there too:
//
//	PYTHONPATH=/path/to/site go test -tags sdkexamples -run TestOpenAIPythonSDK -v ./sim
func TestOpenAIPythonSDK(t *testing.T) {
	dir := filepath.Join("testdata", "openai-python")
	sdkdriver.Python(t, dir)
	cfg := oaTestConfig()
	cfg.Speed = 200
	// 21 requests take 315 API seconds (1.6 s here): long enough for a
	// loaded machine's polls to see the batch in progress.
	cfg.Orgs[1].Batch.PerMinute = 4
	// o4-mini's bucket holds one request of 1,000 completion tokens and
	// refills it in a quarter of a second here: a loaded machine's
	// requests still drain it.
	cfg.Orgs[1].ModelLimits["o4-mini"] = OpenAILimits{RPM: 600, TPM: 1200}
	run := startSim(t, cfg)
	oa := run.Server.OpenAIOrgs()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "driver.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SIM_URL="+run.URL, "SIM_KEY="+oa.Key, "SIM_ORG="+oa.ID, "SIM_PROJECT="+oa.Projects[0])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 driver.py: %v\n%s\n%s", err, out, stderr.String())
	}
	var usages []sdkUsage
	var oks, differs int
	for l := range strings.Lines(string(out)) {
		switch {
		case strings.HasPrefix(l, "ok "):
			oks++
		case strings.HasPrefix(l, "differ "):
			differs++
		case strings.HasPrefix(l, "usages "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "usages ")), &usages); err != nil {
				t.Fatalf("usages: %v", err)
			}
		}
	}
	// A driver that ran less than its workflow fails too.
	if differs > 0 || oks < 70 {
		t.Fatalf("%d ok, %d differ:\n%s", oks, differs, out)
	}
	ledger := ledgerIsUsagesPriced(t, run, "oa", "Python SDK", usages)
	t.Logf("%s%d usages, ledger = usages priced = %d n$", out, len(usages), ledger)
}
