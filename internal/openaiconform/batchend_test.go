package openaiconform

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/sim"
)

// How an OpenAI batch that the gateway stopped for good ends, as the
// official SDK sees it: not completed (a client reading only the status
// took a batch whose lines were never run for a done one).

// stoppedBatch creates an OpenAI batch of n lines on a gateway whose link
// to the simulator is cut, so that nothing is sent, and stops that
// gateway; it returns the batch's id and the state directory, for a
// second gateway (made by the caller) to resume.
func stoppedBatch(t *testing.T, run *sim.Running, n int, prefix string) (string, string) {
	t.Helper()
	cut := netproxy.Start(t, strings.TrimPrefix(run.URL, "http://"))
	cut.BlackHole(true)
	state := t.TempDir()
	g, err := gateway.New(gateway.Config{Orgs: run.Server.AllOrgs(), BaseURL: "http://" + cut.Addr, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients: []gateway.Client{{Name: "a", Token: tokA}}, StateDir: state, RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	alice := gwClient(srv.URL, tokA)
	f := upload(t, alice, judgeFile(n, prefix))
	b, err := newBatch(alice, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	return b.ID, state
}

// resume starts a gateway of cfg on state until the test ends and returns
// alice's client of it.
func resume(t *testing.T, cfg gateway.Config) oai.Client {
	t.Helper()
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return gwClient(srv.URL, tokA)
}

// checkStoppedForGood checks a batch of n lines that ended without running
// any: failed, failed_at set and no completed_at, errors.data naming code
// (and its message containing why), every line in the error file with code.
func checkStoppedForGood(t *testing.T, cl oai.Client, b *oai.Batch, n int, prefix, code, why string) {
	t.Helper()
	if b.Status != "failed" || b.FailedAt == 0 || b.CompletedAt != 0 || b.FinalizingAt != 0 || len(b.Errors.Data) != 1 ||
		b.Errors.Data[0].Code != code || !strings.Contains(b.Errors.Data[0].Message, why) {
		t.Fatalf("batch %s, want failed with errors.data [%s: …%s…] (completed before: its lines batch_cancelled)", b.RawJSON(), code, why)
	}
	t.Logf("%s: errors.data %s: %s", b.Status, b.Errors.Data[0].Code, b.Errors.Data[0].Message)
	if c := b.RequestCounts; c.Total != int64(n) || c.Completed != 0 || c.Failed != int64(n) {
		t.Errorf("request_counts %+v, want total %d, completed 0, failed %d", c, n, n)
	}
	if b.OutputFileID != "" || b.ErrorFileID == "" {
		t.Fatalf("output file %q, error file %q: want none and one", b.OutputFileID, b.ErrorFileID)
	}
	errs := content(t, cl, b.ErrorFileID)
	seen := map[string]bool{}
	for _, l := range errs {
		seen[l.CustomID] = true
		if l.Error == nil || l.Error.Code != code || !strings.Contains(l.Error.Message, why) {
			t.Errorf("error line %+v, want code %s saying %q", l, code, why)
		}
	}
	if len(errs) != n || len(seen) != n || !strings.HasPrefix(errs[0].CustomID, prefix) {
		t.Errorf("%d error lines of %d custom_ids, want %d", len(errs), len(seen), n)
	}
}

// TestOpenAIBatchStoppedAtMaxCostEndsFailed: a batch resumed on a gateway
// where its client's max_cost leaves no room for it (the operator lowered
// it) stops at the spend cap for good. It ends failed, errors.data saying
// insufficient_quota, each line in the error file with that code; before,
// it ended completed, every line batch_cancelled.
func TestOpenAIBatchStoppedAtMaxCostEndsFailed(t *testing.T) {
	run := batchSim(t, 1200)
	const n = 6
	id, state := stoppedBatch(t, run, n, "cap")
	alice := resume(t, gateway.Config{Orgs: run.Server.AllOrgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients: []gateway.Client{{Name: "a", Token: tokA, MaxCost: 1}}, StateDir: state, RetryFor: time.Minute})
	done, _ := awaitBatch(t, alice, id)
	checkStoppedForGood(t, alice, done, n, "cap", "insufficient_quota", "max_cost")
	if by, bill := simBatchEntries(run); len(by) != 0 || bill != 0 {
		t.Errorf("the simulator billed %d n$ for %d lines of a batch stopped at its cap", bill, len(by))
	}
}

// TestOpenAIBatchThatCannotRunEndsFailed: a batch resumed on a gateway
// that has no OpenAI org any more cannot run. It ends failed, errors.data
// saying why (batch_failed), each line in the error file with that code;
// before, it ended completed, every line batch_cancelled.
func TestOpenAIBatchThatCannotRunEndsFailed(t *testing.T) {
	run := batchSim(t, 1200)
	const n = 6
	id, state := stoppedBatch(t, run, n, "nr")
	var anthropicOnly []org.Org
	for _, o := range run.Server.AllOrgs() {
		if o.Provider != org.OpenAI {
			anthropicOnly = append(anthropicOnly, o)
		}
	}
	alice := resume(t, gateway.Config{Orgs: anthropicOnly, BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients: []gateway.Client{{Name: "a", Token: tokA}}, StateDir: state, RetryFor: time.Minute})
	done, _ := awaitBatch(t, alice, id)
	checkStoppedForGood(t, alice, done, n, "nr", "batch_failed", "OpenAI")
}
