//go:build sdkexamples

package openaiconform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/sdkdriver"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/openai"
)

// TestOpenAIPythonSDKBatchesThroughServe runs the official openai Python
// SDK's judge workflow (sim/testdata/openai-python/driver.py, as sim's
// TestOpenAIPythonSDK runs it against the simulator) through 'apidispatch
// serve', the SDK given only the gateway's base URL and a token. First
// its chat part, the code main() runs but the simulator's faults:
// models.list and retrieve, a completion (its headers, the gateway's
// x-apidispatch-*, a JSON verdict, its usage), streams with the usage
// (the raw events, the SDK's Stream and its stream helper) and without
// it (no usage field reaches the client), n = 2, a reasoning model, JSON
// mode and its 400, structured outputs by parse() and the stream helper,
// the async client, a bad gateway token's 401, a model without a price
// (the gateway's 400 on model), unknown file and batch 404s and a bad
// temperature's 400. Then the batch lifecycle: files.create and retrieve,
// batches.create, cancel, retrieve (every poll), list (a page and
// auto-paginated), files.content of the output and error files,
// files.list and delete, and another client's 404s. Every answer
// validates strictly against the SDK's own pydantic types (0 differ), and
// the usages priced (the batch's at the Batch API's price) are the
// gateway's ledger and the simulator's bill.
//
// It builds only with the tag, and fails, not skips, when python3 cannot
// import openai (see sim's TestOpenAIPythonSDK for PYTHONPATH):
//
//	PYTHONPATH=/path/to/site go test -tags sdkexamples -run TestOpenAIPythonSDKBatchesThroughServe -v ./internal/openaiconform
func TestOpenAIPythonSDKBatchesThroughServe(t *testing.T) {
	dir := filepath.Join("..", "..", "sim", "testdata", "openai-python")
	sdkdriver.Python(t, dir)
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
	// A driver that ran less than its workflow fails too, as one whose
	// last line is not its count.
	if differs > 0 || oks < 90 || !strings.Contains(string(out), fmt.Sprintf(": %d checks, 0 differ\n", oks)) {
		t.Fatalf("%d ok, %d differ:\n%s", oks, differs, out)
	}
	var priced cost.Nanos
	batchLines := 0
	for _, u := range usages {
		if u.Batch {
			batchLines++
		}
		n, err := cost.OpenAI().Cost(u.Model, openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
			PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: u.CachedTokens},
			CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: u.ReasoningTokens}}, u.Batch)
		if err != nil {
			t.Fatal(err)
		}
		priced += n
	}
	// The chat completions are in the ledger under the org that answered
	// them, the batch under the gateway's batches. 12 usages are the
	// chat part's (a stream without the usage is counted at its plain twin's).
	ledger := spentOn(g, run, "oa", gateway.OrgGatewayBatches)
	bill := openAIBill(run, "oa")
	if batchLines != 20 || len(usages) != 32 || priced != bill || ledger != bill {
		t.Errorf("%d usages (%d batch lines) priced %d n$, the simulator billed %d n$, the gateway's ledger %d n$",
			len(usages), batchLines, priced, bill, ledger)
	}
	t.Logf("%s%d ok, 0 differ; ledger = simulator bill = usages priced = %d n$", out, oks, ledger)
}
