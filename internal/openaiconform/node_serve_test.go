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

	"github.com/apidispatch/apidispatch/internal/sdkdriver"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/openai"
)

// TestOpenAINodeSDKBatchesThroughServe runs the official openai npm SDK's
// judge workflow (sim/testdata/openai-node/driver.mjs, as sim's
// TestOpenAINodeSDK runs it against the simulator) through 'apidispatch
// serve', the SDK given only the gateway's base URL and a token. First
// its chat part, the code main() runs but the simulator's faults:
// models.list and retrieve, a completion (its headers, the gateway's
// x-apidispatch-*, a JSON verdict, its usage), a stream with the usage
// (accumulated = the completion, one usage chunk) and one without (no
// usage member reaches the client), the stream helper's
// finalChatCompletion, n = 2, a reasoning model, JSON mode and its 400,
// structured outputs by parse(), a bad temperature's 400, a bad gateway
// token's 401, a model without a price (the gateway's 400 on model),
// unknown file and batch 404s. Then the batch lifecycle. Every object it
// returns has exactly the members the SDK's .d.ts declares (0 differ),
// another client gets the API's 404s, and the usages priced (the
// batch's at the Batch API's price) are the gateway's ledger and the
// simulator's bill. Like sim's test it installs the pinned SDK with npm ci
// on first use, and is skipped without node except under CI=true.
func TestOpenAINodeSDKBatchesThroughServe(t *testing.T) {
	dir := filepath.Join("..", "..", "sim", "testdata", "openai-node")
	node := sdkdriver.Node(t, dir)
	cfg := oaTestConfig()
	cfg.Speed = 200
	// 21 requests take 105 API seconds (0.5 s here): long enough for a
	// loaded machine's polls to see the batch in progress.
	cfg.Orgs[1].Batch.PerMinute = 12
	run := startSim(t, cfg)
	g, url, _ := serve(t, run, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "driver.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GW_URL="+url, "GW_KEY="+tokA, "GW_KEY2="+tokB)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node driver.mjs through serve: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Differ   []string `json:"differ"`
		Failures []string `json:"failures"`
		Calls    int      `json:"calls"`
		Polls    int      `json:"polls"`
		Objects  int      `json:"objects"`
		Usages   []struct {
			Model            string `json:"model"`
			Batch            bool   `json:"batch"`
			PromptTokens     int64  `json:"prompt_tokens"`
			CompletionTokens int64  `json:"completion_tokens"`
			CachedTokens     int64  `json:"cached_tokens"`
			ReasoningTokens  int64  `json:"reasoning_tokens"`
		} `json:"usages"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("driver report %q: %v\n%s", out, err, stderr.String())
	}
	if len(rep.Failures) > 0 {
		t.Errorf("%d failures:\n  %s", len(rep.Failures), strings.Join(rep.Failures, "\n  "))
	}
	// A driver that ran less than its workflow fails too (an uncaught
	// error is a failure; the usages counted below are each call's). Its
	// workflow makes 30 calls, and polls a batch until it ends as many
	// times as the batch's pace makes it (a faster batch made a count of
	// both fall short of a bound of 60).
	if len(rep.Differ) > 0 || rep.Objects < 250 || rep.Calls < 30 || rep.Polls < 2 {
		t.Errorf("%d calls, %d polls, %d objects checked, %d differ:\n  %s", rep.Calls, rep.Polls, rep.Objects, len(rep.Differ), strings.Join(rep.Differ, "\n  "))
	}
	var priced cost.Nanos
	batchLines := 0
	for _, u := range rep.Usages {
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
	// them, the batch under the gateway's batches. 8 usages are the chat
	// part's (a stream without the usage is counted at its plain twin's).
	ledger := spentOn(g, run, "oa", gateway.OrgGatewayBatches)
	bill := openAIBill(run, "oa")
	if batchLines != 20 || len(rep.Usages) != 28 || priced != bill || ledger != bill {
		t.Errorf("%d usages (%d batch lines) priced %d n$, the simulator billed %d n$, the gateway's ledger %d n$",
			len(rep.Usages), batchLines, priced, bill, ledger)
	}
	t.Logf("%d calls and %d polls, %d objects checked, 0 differ; ledger = simulator bill = usages priced = %d n$", rep.Calls, rep.Polls, rep.Objects, ledger)
}
