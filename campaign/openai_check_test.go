package campaign

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
)

// The checker reads an OpenAI item's result as run writes it (the OpenAI
// batch output line): a response of status 200 holds the chat completion
// the ledger names; an error response or a local error is no success. A
// Message Batches line beside it still reads as before.
func TestSucceededIDsReadsOpenAILines(t *testing.T) {
	lines := [][]byte{
		rundir.OpenAIResultLine("gpt_ok", 200, []byte(`{"id":"chatcmpl-A1","object":"chat.completion"}`), "", "", rundir.Dispatch{RequestID: "req_1"}),
		rundir.OpenAIResultLine("gpt_429", 429, []byte(`{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}`), "", "", rundir.Dispatch{RequestID: "req_2"}),
		rundir.OpenAIResultLine("gpt_local", 0, nil, "budget_exhausted", "--max-cost reached", rundir.Dispatch{}),
		[]byte(`{"custom_id":"claude_ok","result":{"type":"succeeded","message":{"id":"msg_01"}},"dispatch":{}}`),
	}
	path := filepath.Join(t.TempDir(), "results.jsonl")
	var b strings.Builder
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got := succeededIDs(path)
	want := map[string]string{"gpt_ok": "chatcmpl-A1", "claude_ok": "msg_01"}
	if len(got) != len(want) {
		t.Fatalf("succeeded %v, want %v", got, want)
	}
	for id, msg := range want {
		if got[id] != msg {
			t.Errorf("%s: message %q, want %q", id, got[id], msg)
		}
	}
	n, err := readResults(path)
	if err != nil || len(n) != 4 {
		t.Fatalf("readResults: %v, %v", n, err)
	}
}
