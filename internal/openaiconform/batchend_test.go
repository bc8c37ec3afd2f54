package openaiconform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/openai"
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

// resume starts serve's gateway on the state directory state, changed by
// mutate, until the test ends, and returns alice's client of it.
func resume(t *testing.T, run *sim.Running, state string, mutate func(*gateway.Config)) oai.Client {
	t.Helper()
	_, url, _ := serve(t, run, func(c *gateway.Config) {
		c.StateDir = state
		mutate(c)
	})
	return gwClient(url, tokA)
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
	alice := resume(t, run, state, func(c *gateway.Config) { c.Clients[0].MaxCost = 1 })
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
	alice := resume(t, run, state, func(c *gateway.Config) { c.Orgs = anthropicOnly })
	done, _ := awaitBatch(t, alice, id)
	checkStoppedForGood(t, alice, done, n, "nr", "batch_failed", "OpenAI")
}

// TestOpenAISDKSeesMixedModelsAndFileExpiry, with the official Go SDK
// through serve: a batch whose file names two models is validating at
// create, then failed with the API's mixed_models error on body.model at
// the other model's line (it ran before); an upload with expires_after
// has the API's expires_at (null before), and so do the default upload
// and the batch's error file; every object has the SDK's shape.
func TestOpenAISDKSeesMixedModelsAndFileExpiry(t *testing.T) {
	run := batchSim(t, 1200)
	_, url, _ := serve(t, run, nil)
	alice := gwClient(url, tokA)
	ctx := context.Background()
	f, err := alice.Files.New(ctx, oai.FileNewParams{File: oai.File(bytes.NewReader(judgeFile(2, "ea")), "judge.jsonl", "application/jsonl"),
		Purpose: oai.FilePurposeBatch, ExpiresAfter: oai.FileNewParamsExpiresAfter{Seconds: 3600}})
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "file with expires_after", f)
	// An hour of API time is 18 s at speed 200.
	if d := f.ExpiresAt - f.CreatedAt; d < 17 || d > 20 {
		t.Errorf("expires_at %d, created_at %d: want 18 s apart (3600 s of API time at speed 200)", f.ExpiresAt, f.CreatedAt)
	}
	var mixed bytes.Buffer
	for i, m := range []string{"gpt-4.1-mini", "gpt-4.1-nano", "gpt-4.1-mini"} {
		p := judgeParams(i)
		p.Model = m
		body, _ := json.Marshal(p)
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("mx-%d", i), Method: "POST", URL: "/v1/chat/completions", Body: body})
		mixed.Write(append(line, '\n'))
	}
	mf := upload(t, alice, mixed.Bytes())
	if d := mf.ExpiresAt - mf.CreatedAt; d < 12960-1 || d > 12960+2 {
		t.Errorf("a default upload's expires_at is %d s after its created_at, want 30 days of API time (12,960 s at speed 200)", d)
	}
	b, err := newBatch(alice, mf.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != "validating" {
		t.Errorf("the create of a batch of mixed models answered %s, want validating", b.Status)
	}
	done, _ := awaitBatch(t, alice, b.ID)
	noDiffer(t, "failed batch of mixed models", done)
	if done.Status != "failed" || len(done.Errors.Data) != 1 || done.Errors.Data[0].Code != "mixed_models" || done.Errors.Data[0].Param != "body.model" ||
		done.Errors.Data[0].Line != 2 || done.FailedAt == 0 || done.InProgressAt != 0 {
		t.Errorf("a batch of mixed models: %s, want failed, mixed_models on body.model at line 2", done.RawJSON())
	}
}
