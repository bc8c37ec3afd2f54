//go:build sdkexamples

package openaiconform

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

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/openai"
)

// TestOpenAIPythonSDKBatchesThroughServe runs the official openai Python
// SDK's batch lifecycle (sim/testdata/openai-python/driver.py, as sim's
// TestOpenAIPythonSDK runs it against the simulator) through 'apidispatch
// serve', the SDK given only the gateway's base URL and a token:
// files.create and retrieve, batches.create, cancel, retrieve (every
// poll), list (a page and auto-paginated), files.content of the output
// and error files, files.list and delete, and another client's 404s.
// Every answer validates strictly against the SDK's own pydantic types
// (0 differ), and the batch's usages priced at the Batch API's price are
// the gateway's ledger and the simulator's bill.
//
// It builds only with the tag, and fails, not skips, when python3 cannot
// import openai (see sim's TestOpenAIPythonSDK for PYTHONPATH):
//
//	PYTHONPATH=/path/to/site go test -tags sdkexamples -run TestOpenAIPythonSDKBatchesThroughServe -v ./internal/openaiconform
func TestOpenAIPythonSDKBatchesThroughServe(t *testing.T) {
	dir := filepath.Join("..", "..", "sim", "testdata", "openai-python")
	probe := exec.Command("python3", "-c", "import openai; print(openai.__version__)")
	probe.Dir = dir
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("the openai Python SDK is not installed here, nor on PYTHONPATH=%q (%v %s)", os.Getenv("PYTHONPATH"), err, out)
	}
	cfg := oaTestConfig()
	cfg.Speed = 200
	// 21 requests take 315 API seconds (1.6 s here): long enough for a
	// loaded machine's polls to see the batch in progress.
	cfg.Orgs[1].Batch.PerMinute = 4
	run := startSim(t, cfg)
	g, url, _ := serve(t, run, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "driver.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GW_URL="+url, "GW_KEY="+tokA, "GW_KEY2="+tokB)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 driver.py through serve: %v\n%s\n%s", err, out, stderr.String())
	}
	var usages []struct {
		Model            string `json:"model"`
		Batch            bool   `json:"batch"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
		CachedTokens     int64  `json:"cached_tokens"`
		ReasoningTokens  int64  `json:"reasoning_tokens"`
	}
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
	if differs > 0 || oks < 40 {
		t.Fatalf("%d ok, %d differ:\n%s", oks, differs, out)
	}
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
	bill := openAIBill(run, "oa")
	ledger := g.Ledger().ByOrg()[gateway.OrgGatewayBatches]
	if len(usages) != 20 || priced != bill || ledger != bill {
		t.Errorf("%d usages priced %d n$, the simulator billed %d n$, the gateway's ledger %d n$", len(usages), priced, bill, ledger)
	}
	t.Logf("%s%d ok, 0 differ; ledger = simulator bill = usages priced = %d n$", out, oks, ledger)
}
