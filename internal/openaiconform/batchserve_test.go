package openaiconform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/sim"
)

// The OpenAI Files and Batches APIs through 'apidispatch serve', driven
// by the official openai Go SDK given only the gateway's base URL and a
// gateway token: a batch fanned out over two OpenAI orgs of the
// simulator by the gateway's batch machinery.

// batchSim is a simulator with the two OpenAI orgs gpt_a and gpt_b (and
// an Anthropic org), whose batches process perMinute requests an API
// minute, at speed 200.
func batchSim(t *testing.T, perMinute int64) *sim.Running {
	return batchSimAt(t, perMinute, 200)
}

func batchSimAt(t *testing.T, perMinute int64, speed float64) *sim.Running {
	cfg := oaTestConfig()
	cfg.Orgs = cfg.Orgs[:1]
	oaOrgs(&cfg)
	for i := range cfg.Orgs {
		if cfg.Orgs[i].Provider == sim.ProviderOpenAI {
			cfg.Orgs[i].Batch = sim.BatchLimits{PerMinute: perMinute, CancelS: 2}
		}
	}
	cfg.Speed = speed
	return startSim(t, cfg)
}

// judgeFile is an OpenAI batch input file of n judge requests
// (custom_ids prefix-000 …).
func judgeFile(n int, prefix string) []byte {
	var in bytes.Buffer
	for i := range n {
		body, _ := json.Marshal(judgeParams(100 + i))
		line, _ := json.Marshal(openai.BatchInputLine{CustomID: fmt.Sprintf("%s-%03d", prefix, i), Method: "POST", URL: "/v1/chat/completions", Body: body})
		in.Write(append(line, '\n'))
	}
	return in.Bytes()
}

func upload(t *testing.T, cl oai.Client, data []byte) *oai.FileObject {
	t.Helper()
	f, err := cl.Files.New(context.Background(), oai.FileNewParams{File: oai.File(bytes.NewReader(data), "judge.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func newBatch(cl oai.Client, fileID string) (*oai.Batch, error) {
	return cl.Batches.New(context.Background(), oai.BatchNewParams{InputFileID: fileID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"job": "judge"}})
}

// awaitBatch polls b until it is terminal (up to 60 s), checking each
// polled object against the SDK's shape; it returns the statuses seen.
func awaitBatch(t *testing.T, cl oai.Client, id string) (*oai.Batch, map[oai.BatchStatus]bool) {
	t.Helper()
	seen := map[oai.BatchStatus]bool{}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := cl.Batches.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		noDiffer(t, "polled batch", b)
		seen[b.Status] = true
		if openai.BatchTerminal(string(b.Status)) {
			return b, seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s after 60 s", id, b.Status)
		}
	}
}

// content reads a file's content through the SDK.
func content(t *testing.T, cl oai.Client, id string) []openai.BatchOutputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	resp, err := cl.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out []openai.BatchOutputLine
	for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var ol openai.BatchOutputLine
		d := json.NewDecoder(bytes.NewReader(l))
		d.DisallowUnknownFields() // the API's line: id, custom_id, response, error
		if err := d.Decode(&ol); err != nil || ol.ID == "" || ol.CustomID == "" || (ol.Response == nil) == (ol.Error == nil) {
			t.Fatalf("file %s: line %s: %v", id, l, err)
		}
		out = append(out, ol)
	}
	return out
}

// simBatchEntries counts the simulator's ledger entries of OpenAI batch
// requests by custom_id, and sums their cost.
func simBatchEntries(run *sim.Running) (map[string]int, cost.Nanos) {
	by := map[string]int{}
	var n cost.Nanos
	for _, e := range run.Server.Ledger() {
		if e.Provider == sim.ProviderOpenAI && e.BatchID != "" {
			by[e.CustomID]++
			n += cost.Nanos(e.CostNanos)
		}
	}
	return by, n
}

// checkOnce checks that the output and error lines hold each of the n
// custom_ids prefix-000 … once, that the output's completions are the
// SDK's shape, and that what they cost at the Batch API's price is the
// simulator's bill and the gateway's ledger, each billed once. It
// returns the output lines' count.
func checkOnce(t *testing.T, g *gateway.Gateway, run *sim.Running, out, errs []openai.BatchOutputLine, n int, prefix string) int {
	t.Helper()
	seen := map[string]int{}
	var priced cost.Nanos
	for _, l := range out {
		seen[l.CustomID]++
		if l.Response.StatusCode != 200 || l.Error != nil {
			t.Errorf("output line %+v", l)
			continue
		}
		var cc oai.ChatCompletion
		if err := json.Unmarshal(l.Response.Body, &cc); err != nil {
			t.Fatal(err)
		}
		noDiffer(t, "batch completion", cc)
		n, err := cost.OpenAI().Cost(cc.Model, openai.Usage{PromptTokens: cc.Usage.PromptTokens, CompletionTokens: cc.Usage.CompletionTokens,
			PromptTokensDetails:     openai.PromptTokensDetails{CachedTokens: cc.Usage.PromptTokensDetails.CachedTokens},
			CompletionTokensDetails: openai.CompletionTokensDetails{ReasoningTokens: cc.Usage.CompletionTokensDetails.ReasoningTokens}}, true)
		if err != nil {
			t.Fatal(err)
		}
		priced += n
	}
	for _, l := range errs {
		seen[l.CustomID]++
	}
	for i := range n {
		if id := fmt.Sprintf("%s-%03d", prefix, i); seen[id] != 1 {
			t.Errorf("custom_id %s is in the output and error files %d times, want once", id, seen[id])
		}
	}
	if len(seen) != n {
		t.Errorf("%d custom_ids in the files, want %d", len(seen), n)
	}
	billedBy, bill := simBatchEntries(run)
	for id, k := range billedBy {
		if k != 1 {
			t.Errorf("the simulator billed custom_id %s %d times", id, k)
		}
	}
	ledger := g.Ledger().ByOrg()[gateway.OrgGatewayBatches]
	if priced != bill || ledger != bill || bill == 0 && len(out) > 0 {
		t.Errorf("the output's usage at the batch price %d n$, the simulator billed %d n$, the gateway's ledger %d n$", priced, bill, ledger)
	}
	return len(out)
}

// TestOpenAIBatchThroughServe: upload, create, retrieve, list and read the
// results of a batch through serve over two OpenAI orgs: each custom_id
// once, every line the API's, the cost the simulator's bill at half
// price; a file with bad lines makes a batch that answers validating,
// then is failed naming them; another client finds none of it.
func TestOpenAIBatchThroughServe(t *testing.T) {
	run := batchSim(t, 1200)
	g, url, _ := serve(t, run, nil)
	alice, bob := gwClient(url, tokA), gwClient(url, tokB)
	ctx := context.Background()
	const n = 60
	data := judgeFile(n, "item")
	f := upload(t, alice, data)
	noDiffer(t, "file", f)
	if f.Bytes != int64(len(data)) || f.Purpose != "batch" || f.Filename != "judge.jsonl" || !strings.HasPrefix(f.ID, "file-") {
		t.Errorf("file %s", f.RawJSON())
	}
	if got, err := alice.Files.Get(ctx, f.ID); err != nil || got.ID != f.ID || got.Bytes != f.Bytes {
		t.Errorf("file get: %v %v", got, err)
	}
	b, err := newBatch(alice, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "batch", b)
	if b.Status != "validating" || b.RequestCounts.Total != n || b.Metadata["job"] != "judge" || b.InputFileID != f.ID || b.Endpoint != "/v1/chat/completions" {
		t.Errorf("created batch %s", b.RawJSON())
	}

	// Bob finds none of alice's.
	var apiErr *oai.Error
	notFound := func(what string, err error) {
		t.Helper()
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type != "invalid_request_error" {
			t.Errorf("bob's %s of alice's: %v, want a 404", what, err)
		}
	}
	_, err = bob.Batches.Get(ctx, b.ID)
	notFound("batch get", err)
	_, err = bob.Batches.Cancel(ctx, b.ID)
	notFound("batch cancel", err)
	_, err = bob.Files.Get(ctx, f.ID)
	notFound("file get", err)
	_, err = bob.Files.Content(ctx, f.ID)
	notFound("file content", err)
	_, err = bob.Files.Delete(ctx, f.ID)
	notFound("file delete", err)
	_, err = newBatch(bob, f.ID)
	notFound("batch on alice's file", err)
	if page, err := bob.Batches.List(ctx, oai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("bob's list: %v %v", page, err)
	}

	done, seen := awaitBatch(t, alice, b.ID)
	if done.Status != "completed" || !seen["in_progress"] || done.RequestCounts.Total != n || done.RequestCounts.Completed+done.RequestCounts.Failed != n ||
		done.OutputFileID == "" || done.CompletedAt == 0 || done.InProgressAt == 0 || done.FinalizingAt == 0 {
		t.Fatalf("batch %s; statuses seen %v", done.RawJSON(), seen)
	}
	out, errs := content(t, alice, done.OutputFileID), content(t, alice, done.ErrorFileID)
	if got := checkOnce(t, g, run, out, errs, n, "item"); got != n {
		t.Errorf("%d answered, want %d", got, n)
	}
	var in, outTok int64
	for _, l := range out {
		var cc oai.ChatCompletion
		json.Unmarshal(l.Response.Body, &cc)
		in, outTok = in+cc.Usage.PromptTokens, outTok+cc.Usage.CompletionTokens
	}
	if u := done.Usage; u.InputTokens != in || u.OutputTokens != outTok || u.TotalTokens != in+outTok || in == 0 || done.Model != "gpt-4.1-mini" {
		t.Errorf("the batch's model %q and usage %+v; its output lines' usage summed: %d in, %d out", done.Model, u, in, outTok)
	}
	_, err = bob.Files.Content(ctx, done.OutputFileID)
	notFound("output content", err)
	if of, err := alice.Files.Get(ctx, done.OutputFileID); err != nil || of.Purpose != "batch_output" {
		t.Errorf("output file: %v %v", of, err)
	} else {
		noDiffer(t, "output file", of)
	}
	orgs := map[string]bool{}
	for _, e := range run.Server.Ledger() {
		if e.BatchID != "" {
			orgs[e.Org] = true
		}
	}
	t.Logf("batch of %d served by orgs %v", n, orgs)

	// A file with bad lines: a failed batch naming them by line number.
	bad := bytes.Replace(judgeFile(3, "bad"), []byte(`"method":"POST"`), []byte(`"method":"GET"`), 1)
	bad = append(bad, []byte("{not json\n")...)
	bf := upload(t, alice, bad)
	fb, err := newBatch(alice, bf.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fb.Status != "validating" || len(fb.Errors.Data) != 0 || fb.FailedAt != 0 {
		t.Errorf("the create of a file with bad lines answered %s, want validating (the API's)", fb.RawJSON())
	}
	fb, err = alice.Batches.Get(ctx, fb.ID)
	if err != nil {
		t.Fatal(err)
	}
	noDiffer(t, "failed batch", fb)
	if fb.Status != "failed" || len(fb.Errors.Data) != 2 || fb.Errors.Data[0].Line != 1 || fb.Errors.Data[1].Line != 4 || fb.FailedAt == 0 {
		t.Errorf("a file with bad lines 1 and 4: %s", fb.RawJSON())
	}
	_, err = alice.Batches.Cancel(ctx, fb.ID)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "failed") {
		t.Errorf("cancel of a failed batch: %v", err)
	}

	// The list: newest first, paged by after.
	page, err := alice.Batches.List(ctx, oai.BatchListParams{Limit: oai.Int(1)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != fb.ID || !page.HasMore {
		t.Fatalf("list: %v %v", page, err)
	}
	noDiffer(t, "list", page, "object", "first_id", "last_id")
	next, err := page.GetNextPage()
	if err != nil || len(next.Data) != 1 || next.Data[0].ID != b.ID || next.HasMore {
		t.Fatalf("list page 2: %v %v", next, err)
	}

	// Deleting the input file: gone for alice; the batch is not touched.
	if del, err := alice.Files.Delete(ctx, f.ID); err != nil || !del.Deleted || del.ID != f.ID {
		t.Errorf("delete: %v %v", del, err)
	}
	_, err = alice.Files.Get(ctx, f.ID)
	notFound("get of a deleted file", err)
}

// A batch whose worst case is above what is left of the client's
// max_cost is refused at create, before anything is sent; one within it
// runs.
func TestOpenAIBatchMaxCostThroughServe(t *testing.T) {
	run := batchSim(t, 1200)
	const n = 20
	data := judgeFile(n, "cap")
	// judgeParams asks for 200 completion tokens: the batch's worst case
	// is above n × 200 output tokens at the batch price, so a cap of
	// half of that refuses it.
	p, err := cost.OpenAI().Lookup("gpt-4.1-mini")
	if err != nil {
		t.Fatal(err)
	}
	outputOnly := cost.Tenths(n*200) * p.Batch.Output
	g, url, _ := serve(t, run, func(c *gateway.Config) { c.Clients[0].MaxCost = outputOnly.Nanos() / 2 })
	alice := gwClient(url, tokA)
	f := upload(t, alice, data)
	_, err = newBatch(alice, f.ID)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" || !strings.Contains(apiErr.Message, "spend cap") {
		t.Fatalf("a batch above max_cost: %v, want the 429 insufficient_quota", err)
	}
	if page, err := alice.Batches.List(context.Background(), oai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("list after the refusal: %v %v", page, err)
	}
	time.Sleep(100 * time.Millisecond)
	if by, bill := simBatchEntries(run); len(by) != 0 || bill != 0 || openAIBill(run, "gpt_a", "gpt_b") != 0 {
		t.Errorf("the simulator billed %d n$ for a refused batch", bill)
	}
	if spent := g.Ledger().ByOrg()[gateway.OrgGatewayBatches]; spent != 0 {
		t.Errorf("ledger %d n$ for a refused batch", spent)
	}
	// Bob, without a cap, runs the same file.
	bob := gwClient(url, tokB)
	bf := upload(t, bob, data)
	b, err := newBatch(bob, bf.ID)
	if err != nil {
		t.Fatal(err)
	}
	done, _ := awaitBatch(t, bob, b.ID)
	if done.Status != "completed" {
		t.Fatalf("bob's batch %s", done.RawJSON())
	}
	checkOnce(t, g, run, content(t, bob, done.OutputFileID), content(t, bob, done.ErrorFileID), n, "cap")
}

// A cancelled batch ends cancelled: what was done is in the output file,
// the rest in the error file as batch_cancelled, each custom_id once,
// and what was done is what was billed.
func TestOpenAIBatchCancelThroughServe(t *testing.T) {
	run := batchSim(t, 1200)
	// The upstream batches stop after a quarter of their requests: the
	// cancel finds requests not done however late it comes.
	if _, err := run.Server.AddFault(sim.Fault{Kind: sim.FaultBatchStall, Fraction: 0.25, ID: "stall"}); err != nil {
		t.Fatal(err)
	}
	g, url, _ := serve(t, run, nil)
	alice := gwClient(url, tokA)
	const n = 40
	f := upload(t, alice, judgeFile(n, "cx"))
	b, err := newBatch(alice, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitSimBatch(t, run)
	c, err := alice.Batches.Cancel(context.Background(), b.ID)
	if err != nil || (c.Status != "cancelling" && c.Status != "cancelled") || c.CancellingAt == 0 {
		t.Fatalf("cancel: %v %v", c, err)
	}
	noDiffer(t, "cancelling batch", c)
	done, _ := awaitBatch(t, alice, b.ID)
	if done.Status != "cancelled" || done.CancelledAt == 0 || done.ErrorFileID == "" || done.RequestCounts.Completed+done.RequestCounts.Failed != n {
		t.Fatalf("cancelled batch %s", done.RawJSON())
	}
	out, errs := content(t, alice, done.OutputFileID), content(t, alice, done.ErrorFileID)
	answered := checkOnce(t, g, run, out, errs, n, "cx")
	cancelled := 0
	for _, l := range errs {
		if l.Error != nil && l.Error.Code == "batch_cancelled" {
			cancelled++
		}
	}
	if cancelled == 0 || answered+cancelled != n || int64(answered) != done.RequestCounts.Completed {
		t.Errorf("%d answered, %d cancelled of %d; counts %+v", answered, cancelled, n, done.RequestCounts)
	}
	t.Logf("cancelled: %d answered, %d cancelled", answered, cancelled)
}

// waitSimBatch waits (up to 30 s) until an OpenAI org of the simulator has
// a batch: the gateway has sent one upstream.
func waitSimBatch(t *testing.T, run *sim.Running) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, o := range run.Server.AllOrgs() {
			if o.Provider != "openai" {
				continue
			}
			req, _ := http.NewRequest(http.MethodGet, run.URL+"/v1/batches", nil)
			req.Header.Set("Authorization", "Bearer "+o.Key.Reveal())
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var l struct {
				Data []json.RawMessage `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&l)
			resp.Body.Close()
			if len(l.Data) > 0 {
				return
			}
		}
	}
	t.Fatal("no upstream batch within 30 s")
}

// A gateway stopped while its OpenAI batch runs upstream resumes it at its
// next start on the same state directory: the batch completes, each
// custom_id once in its files and billed once, the ledger the bill.
func TestOpenAIBatchRestartThroughServe(t *testing.T) {
	// 20 requests an org take 300 API seconds (1.5 s here): the gateway
	// stops while they run.
	run := batchSim(t, 4)
	state := t.TempDir()
	start := func() (*gateway.Gateway, *httptest.Server) {
		g, err := gateway.New(gateway.Config{Orgs: run.Server.AllOrgs(), BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
			Clients: []gateway.Client{{Name: "a", Token: tokA}, {Name: "b", Token: tokB}}, StateDir: state, RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g, httptest.NewServer(g.Handler())
	}
	g, srv := start()
	const n = 40
	alice := gwClient(srv.URL, tokA)
	f := upload(t, alice, judgeFile(n, "rs"))
	b, err := newBatch(alice, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitSimBatch(t, run)
	if mid, err := alice.Batches.Get(context.Background(), b.ID); err != nil || mid.Status != "in_progress" {
		t.Fatalf("before the stop: %v %v, want the batch in progress", mid, err)
	}
	srv.Close()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything the gateway keeps is its own to read.
	filepath.WalkDir(state, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(p, filepath.Join(state, "files")) {
			if fi, _ := d.Info(); fi.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
			}
		}
		return nil
	})

	g, srv = start()
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	alice = gwClient(srv.URL, tokA)
	done, _ := awaitBatch(t, alice, b.ID)
	if done.Status != "completed" || done.RequestCounts.Completed != n {
		t.Fatalf("resumed batch %s", done.RawJSON())
	}
	if got := checkOnce(t, g, run, content(t, alice, done.OutputFileID), content(t, alice, done.ErrorFileID), n, "rs"); got != n {
		t.Errorf("%d answered, want %d", got, n)
	}
}

// A batch not done within its 24 h (the upstream batches stall after half
// their requests) ends expired: what was answered is in the output file,
// the rest in the error file as batch_expired, each custom_id once, and
// the ledger is what the simulator billed.
func TestOpenAIBatchExpiryThroughServe(t *testing.T) {
	const speed = 10000 // a batch expires in 8.64 s
	run := batchSimAt(t, 600, speed)
	if _, err := run.Server.AddFault(sim.Fault{Kind: sim.FaultBatchStall, Fraction: 0.5, ID: "stall"}); err != nil {
		t.Fatal(err)
	}
	g, url, _ := serve(t, run, nil)
	alice := gwClient(url, tokA)
	const n = 40
	f := upload(t, alice, judgeFile(n, "ex"))
	b, err := newBatch(alice, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	done, _ := awaitBatch(t, alice, b.ID)
	if done.Status != "expired" || done.ExpiredAt == 0 || done.ErrorFileID == "" || done.RequestCounts.Completed+done.RequestCounts.Failed != n {
		t.Fatalf("expired batch %s", done.RawJSON())
	}
	out, errs := content(t, alice, done.OutputFileID), content(t, alice, done.ErrorFileID)
	answered := checkOnce(t, g, run, out, errs, n, "ex")
	expired := 0
	for _, l := range errs {
		if l.Error != nil && l.Error.Code == "batch_expired" {
			expired++
		}
	}
	if expired == 0 || answered+expired != n {
		t.Errorf("%d answered, %d expired of %d", answered, expired, n)
	}
	t.Logf("expired: %d answered, %d expired", answered, expired)
}
