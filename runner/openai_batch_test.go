package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// gptLimits are roomy limits of an OpenAI org for a judge job.
var gptLimits = sim.OpenAILimits{RPM: 30_000, TPM: 50_000_000}

// gptBench is a simulator with three OpenAI orgs (gpt_a, gpt_b, gpt_c,
// each with the limits lim for every model; the preset's Anthropic orgs
// beside them) and the faults given, and a GPT judge file of n items;
// orgs are the OpenAI orgs only.
func gptBench(t *testing.T, n int, speed float64, lim sim.OpenAILimits, faults ...sim.Fault) *bench {
	t.Helper()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		for _, name := range []string{"gpt_a", "gpt_b", "gpt_c"} {
			c.Orgs = append(c.Orgs, sim.OrgConfig{Name: name, Provider: sim.ProviderOpenAI,
				ModelLimits: map[string]sim.OpenAILimits{"*": lim}})
		}
		c.Faults = faults
	})
	input := filepath.Join(t.TempDir(), "gpt.jsonl")
	var buf bytes.Buffer
	if err := workload.GenerateOpenAIJudge(&buf, n, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(input, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var orgs []org.Org
	for _, o := range r.Server.AllOrgs() {
		if o.Provider == org.OpenAI {
			orgs = append(orgs, o)
		}
	}
	return &bench{t: t, sim: r, input: input, orgs: orgs, speed: speed, n: n}
}

// TestOpenAIBatchRouteHalfPrice: a GPT judge job over three OpenAI orgs by
// the batch route (the OpenAI Files and Batch APIs) completes each
// custom_id once, spread over every org; its cost is the simulator's
// ledger to the nano-dollar, and half what the same items cost by sync
// (to each request's rounding to a whole nano-dollar).
//
// APIDISPATCH_OPENAI_BATCH_N sets n (the job is 50,000).
func TestOpenAIBatchRouteHalfPrice(t *testing.T) {
	t.Parallel()
	n := 1500
	if v := os.Getenv("APIDISPATCH_OPENAI_BATCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 3 {
			t.Fatalf("APIDISPATCH_OPENAI_BATCH_N=%q: want a number of items, at least 3", v)
		}
	}
	b := gptBench(t, n, 2000, gptLimits)
	ctx := t.Context()
	res, err, dir := b.exec(ctx, "", runner.Exec{Route: runner.RouteBatch})
	if err != nil {
		t.Fatalf("batch route: %v", err)
	}
	s := res.Summary
	if !res.Complete || s.Succeeded != int64(n) || !s.DataLoss.Passed {
		t.Fatalf("batch route: complete %v, %d succeeded, data loss %+v", res.Complete, s.Succeeded, s.DataLoss)
	}
	b.audit(dir)
	mark := b.sim.Server.Mark()
	total, billed, twice := batchLedger(b.sim.Server.Ledger())
	if billed != n || twice != 0 {
		t.Fatalf("the simulator billed %d batch requests (%d twice); want %d, none twice", billed, twice, n)
	}
	if s.Cost.TotalNanos != total {
		t.Fatalf("summary cost %d n$, simulator ledger %d n$", s.Cost.TotalNanos, total)
	}
	if s.Batches == nil || s.Batches.Created < 3 || s.Batches.Retried != 0 || len(s.ByOrg) != 3 {
		t.Fatalf("batches %+v over orgs %v; want at least one per OpenAI org, none failed", s.Batches, s.ByOrg)
	}
	br := s.ByRoute[store.RouteBatch]
	if br == nil || br.Items != int64(n) || br.CostNanos != total {
		t.Fatalf("by_route batch = %+v", br)
	}
	// Every line is an OpenAI batch output line (as the sync route writes).
	batchAnswers := checkOpenAILines(t, dir, n, store.RouteBatch)

	sres, err, sdir := b.exec(ctx, "", runner.Exec{Route: runner.RouteSync})
	if err != nil || !sres.Complete {
		t.Fatalf("sync route: %v", err)
	}
	// The same request answers the same on both routes (the simulator
	// derives an answer from its body), and its line holds it the same way.
	for id, a := range checkOpenAILines(t, sdir, n, store.RouteSync) {
		if batchAnswers[id] != a {
			t.Fatalf("%s: by sync %s, by batch %s", id, a, batchAnswers[id])
		}
	}
	var syncTotal int64
	seen := map[sim.BodyHash]bool{}
	for _, e := range b.sim.Server.LedgerSince(mark) {
		if e.ServiceTier != "batch" && !seen[e.BodySHA256] {
			seen[e.BodySHA256] = true
			syncTotal += e.CostNanos
		}
	}
	if len(seen) != n || sres.Summary.Cost.TotalNanos != syncTotal {
		t.Fatalf("sync: %d bodies billed, summary %d n$, ledger %d n$", len(seen), sres.Summary.Cost.TotalNanos, syncTotal)
	}
	// Each request's cost is rounded to a whole nano-dollar on each route,
	// so 2 × batch may differ from sync by up to a nano-dollar a request.
	if d := 2*total - syncTotal; d < -int64(n) || d > int64(n) {
		t.Fatalf("sync %d n$, batch %d n$: 2 × batch - sync = %d, more than the %d requests' rounding", syncTotal, total, d, n)
	}
	t.Logf("N=%d GPT judge items over 3 OpenAI orgs: batch %d n$ = ledger, sync %d n$ = ledger; batch/sync = %.6f (2 × batch - sync = %d n$ of rounding)",
		n, total, syncTotal, float64(total)/float64(syncTotal), 2*total-syncTotal)
	if got := cost.Nanos(syncTotal).USD(); br.SyncPriceUSD < got*0.999 || br.SyncPriceUSD > got*1.001 {
		t.Errorf("by_route batch sync_price_usd = %v, the sync route cost %v", br.SyncPriceUSD, got)
	}
}

// checkOpenAILines: every results line of dir is an OpenAI batch output
// line with a 200 response, carried by route. It returns each custom_id's
// answer: the completion's choices and usage, as JSON.
func checkOpenAILines(t *testing.T, dir string, n int, route string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	if len(lines) != n {
		t.Fatalf("%d results lines, want %d", len(lines), n)
	}
	answers := map[string]string{}
	for _, l := range lines {
		var v struct {
			ID       string `json:"id"`
			CustomID string `json:"custom_id"`
			Response *struct {
				StatusCode int            `json:"status_code"`
				RequestID  string         `json:"request_id"`
				Body       map[string]any `json:"body"`
			} `json:"response"`
			Error    any `json:"error"`
			Dispatch struct {
				Route string `json:"route"`
			} `json:"dispatch"`
		}
		if err := jsonUnmarshal(l, &v); err != nil || v.Response == nil || v.Response.StatusCode != 200 || v.Response.Body["object"] != "chat.completion" ||
			v.Error != nil || v.Dispatch.Route != route || v.Response.RequestID == "" {
			t.Fatalf("not an OpenAI batch output line of route %s (%v): %s", route, err, l)
		}
		a, _ := json.Marshal([]any{v.Response.Body["choices"], v.Response.Body["usage"]})
		answers[v.CustomID] = string(a)
	}
	return answers
}

// TestOpenAIBatchLostCreateAdopted: every create's answer is lost (a 500
// after the batch exists, then resets), and the batches stay invisible
// for a while; the route finds each batch in its org's list, proves it
// its own from its input file, and adopts it: nothing is created twice.
func TestOpenAIBatchLostCreateAdopted(t *testing.T) {
	t.Parallel()
	for _, kind := range []sim.FaultKind{sim.FaultBatchCreateLost500, sim.FaultBatchCreateLostReset} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := gptBench(t, 900, 2000, gptLimits, sim.Fault{Kind: kind}, sim.Fault{Kind: sim.FaultBatchNotFound, Window: 30 * time.Second})
			res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
			if err != nil || !res.Complete {
				t.Fatalf("batch route: %v", err)
			}
			b.audit(dir)
			total, billed, twice := batchLedger(b.sim.Server.Ledger())
			bs := res.Summary.Batches
			if billed != 900 || twice != 0 || bs.Adopted != 3 || bs.Created != 3 || res.Summary.Cost.TotalNanos != total {
				t.Fatalf("billed %d (%d twice), %d n$ (summary %d); summary %+v: want 900, 0, 3 adopted", billed, twice, total, res.Summary.Cost.TotalNanos, bs)
			}
		})
	}
}

var _ = batch.MetadataPrefix

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// colleagueOpenAIBatch uploads the request file path (a colleague's job:
// OpenAI batch input lines) with key and creates a batch of it, with
// metadata when not nil, and returns its id.
func colleagueOpenAIBatch(t *testing.T, base, key, path string, metadata map[string]string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "theirs.jsonl")
	fw.Write(data)
	mw.Close()
	post := func(path, ctype string, body []byte) map[string]any {
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", ctype)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v %v", path, resp.StatusCode, v, err)
		}
		return v
	}
	f := post("/v1/files", mw.FormDataContentType(), form.Bytes())
	req := map[string]any{"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
	if metadata != nil {
		req["metadata"] = metadata
	}
	body, _ := json.Marshal(req)
	return post("/v1/batches", "application/json", body)["id"].(string)
}

func isOpenAICreate(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.TrimSuffix(req.URL.Path, "/") == "/v1/batches"
}

// TestOpenAILostCreateAdoptsOursNotColleagues: on one OpenAI org, just
// before our create, colleagues create two batches of the same size with
// the same requests (one without metadata, one naming another prefix);
// ours is created and its answer lost. We adopt our own batch, proven by
// its input file, never theirs: every result line comes from ours, and
// each of our items is billed once. And when our create never reached the
// API, the look-alike is rejected and the record abandoned after the
// API's time to show it; the items go in a new batch.
func TestOpenAILostCreateAdoptsOursNotColleagues(t *testing.T) {
	t.Parallel()
	for _, reached := range []bool{true, false} {
		t.Run(fmt.Sprintf("reached=%v", reached), func(t *testing.T) {
			t.Parallel()
			const n = 300
			b := gptBench(t, n, 200, gptLimits)
			b.orgs = b.orgs[:1]
			key := b.sim.Server.Keys()[b.orgs[0].Name][0]
			var once sync.Once
			var theirs []string
			x := runner.Exec{Route: runner.RouteBatch}
			x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
				if !isOpenAICreate(req) {
					return next.RoundTrip(req)
				}
				lost := false
				once.Do(func() { lost = true })
				if !lost {
					return next.RoundTrip(req)
				}
				theirs = append(theirs, colleagueOpenAIBatch(t, b.sim.URL, key, b.input, nil),
					colleagueOpenAIBatch(t, b.sim.URL, key, b.input, map[string]string{batch.MetadataPrefix: "adnotoursatall"}))
				if !reached {
					return nil, errors.New("connection reset before the request went out")
				}
				resp, err := next.RoundTrip(req)
				if err != nil {
					return resp, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return nil, errors.New("connection reset while reading the answer")
			})
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			res, err, dir := b.exec(ctx, "", x)
			if err != nil || !res.Complete {
				t.Fatalf("batch route: %v", err)
			}
			b.audit(dir)
			if len(theirs) != 2 {
				t.Fatal("the colleagues' batches were never created")
			}
			for id, bid := range resultBatchIDs(t, dir) {
				if slices.Contains(theirs, bid) {
					t.Fatalf("%s: result from a colleague's batch %s", id, bid)
				}
			}
			want := [2]int{1, 0} // adopted, abandoned
			if !reached {
				want = [2]int{0, 1}
			}
			if res.Batch.Adopted != want[0] || res.Batch.Abandoned != want[1] {
				t.Fatalf("batch result %+v: want %d adopted, %d abandoned", res.Batch, want[0], want[1])
			}
			billedOncePerItem(t, b.sim, n, theirs...)
			// Our input files are deleted once nothing needs them (the
			// adopted batch's once harvested, the abandoned record's
			// upload), the colleagues' are left alone.
			if files := b.openaiFiles(); len(files[b.orgs[0].Name]) != 2 || len(files) != 1 || files[b.orgs[0].Name][0] != "theirs.jsonl" || files[b.orgs[0].Name][1] != "theirs.jsonl" {
				t.Fatalf("files of purpose batch left: %v; want the colleagues' two only", files)
			}
		})
	}
}

// TestOpenAIBatchCancelKeepsPartialResults: OpenAI batches stalled after
// 30 % of their requests are left open by a run's stop; --cancel
// cancels them, harvests what they finished (the output file) and leaves
// the rest (batch_cancelled in the error file) pending, none open; the
// next run sends those in new batches. Each custom_id once, each request
// billed once, cost = ledger.
func TestOpenAIBatchCancelKeepsPartialResults(t *testing.T) {
	t.Parallel()
	const n = 600
	b := gptBench(t, n, 200, gptLimits, sim.Fault{ID: "stall", Kind: sim.FaultBatchStall, Fraction: 0.3})
	dir := filepath.Join(t.TempDir(), "run")
	// The first run stops once its three batches are created (a stop
	// leaves open batches running).
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var created atomic.Int32
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && isOpenAICreate(req) && resp.StatusCode == http.StatusOK && created.Add(1) == 3 {
			time.AfterFunc(300*time.Millisecond, stop)
		}
		return resp, err
	})
	res, _, _ := b.exec(ctx, dir, x)
	if res == nil || res.Summary == nil || res.Summary.Batches == nil || res.Summary.Batches.Open != 3 {
		t.Fatalf("at the stop: %+v; want 3 batches left open", res)
	}
	x = runner.Exec{Route: runner.RouteBatch, Batch: batch.Config{Cancel: true}}
	res, err, _ := b.exec(t.Context(), dir, x)
	s := res.Summary
	if err == nil || s.Succeeded == 0 || s.Unfinished == 0 || s.Succeeded+s.Unfinished != n || s.Batches.Open != 0 || s.Batches.Harvested != 3 {
		t.Fatalf("after --cancel (%v): %d succeeded, %d unfinished, batches %+v; want partial results, the rest pending, none open", err, s.Succeeded, s.Unfinished, s.Batches)
	}
	partial := s.Succeeded
	b.sim.Server.ClearFaults("stall")
	res, err, _ = b.exec(t.Context(), dir, runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		t.Fatalf("the run after --cancel: %v", err)
	}
	b.audit(dir)
	nanos, billed, twice := batchLedger(b.sim.Server.Ledger())
	if billed != n || twice != 0 || res.Summary.Cost.TotalNanos != nanos {
		t.Fatalf("billed %d batch requests (%d twice), %d n$; summary %d n$: want %d once each, cost = ledger", billed, twice, nanos, res.Summary.Cost.TotalNanos, n)
	}
	t.Logf("--cancel kept %d of %d results; the next run sent the other %d", partial, n, n-int(partial))
}

// TestOpenAIBatchMaxCost: under --max-cost the batch route reserves each
// OpenAI batch's worst case (at the batch rates) in the spend gate before
// its upload and create, so the ledger never passes the cap; the run stops
// on --max-cost with what did not fit pending, none open.
func TestOpenAIBatchMaxCost(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 1500, 2000, gptLimits)
	const capUSD = 0.10 // about half of what the job costs by batch
	maxCost := cost.Nanos(capUSD * 1e9)
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Sync: dispatch.Config{MaxCost: maxCost}})
	if !errors.Is(err, dispatch.ErrIncomplete) || res == nil || !strings.Contains(res.Stop.Reason, "--max-cost") {
		t.Fatalf("want an incomplete run stopped by --max-cost; got %v (%+v)", err, res)
	}
	s := res.Summary
	total, billed, twice := batchLedger(b.sim.Server.Ledger())
	if cost.Nanos(total) > maxCost || s.Cost.TotalNanos != total || s.Unfinished == 0 || s.Succeeded == 0 || s.Batches.Open != 0 || twice != 0 {
		t.Fatalf("ledger %d n$ (cap %d), summary %d, %d succeeded, %d unfinished, batches %+v", total, maxCost, s.Cost.TotalNanos, s.Succeeded, s.Unfinished, s.Batches)
	}
	c, err := soak.CheckResults(b.input, filepath.Join(dir, rundir.ResultsFile))
	if err != nil || c.Repeated+c.Unknown != 0 || c.Lines != s.Succeeded {
		t.Fatalf("results %+v, %v", c, err)
	}
	t.Logf("cap $%.2f: %d GPT items in %d batches billed $%.6f, %d left pending: %s", capUSD, billed, s.Batches.Created, cost.Nanos(total).USD(), s.Unfinished, res.Stop.Reason)
}

// TestOpenAIBatchQueueTokens: with each org's enqueued-token limit known
// (Config.QueueTokens, here the simulator's: less than an org's even share
// of the job), the route keeps its open batches of the model under it:
// batches are created as earlier ones end, and none fails with
// token_limit_exceeded.
func TestOpenAIBatchQueueTokens(t *testing.T) {
	t.Parallel()
	const n, limit = 3000, 200_000
	lim := gptLimits
	lim.BatchQueueTokens = limit
	b := gptBench(t, n, 2000, lim)
	r := b.sim
	qt := map[string]int64{}
	for _, o := range b.orgs {
		qt[o.Name] = limit
	}
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch, Batch: batch.Config{QueueTokens: qt}})
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	b.audit(dir)
	s := res.Summary
	nanos, billed, twice := batchLedger(r.Server.Ledger())
	if billed != n || twice != 0 || s.Cost.TotalNanos != nanos {
		t.Fatalf("billed %d (%d twice), %d n$; summary %d n$", billed, twice, nanos, s.Cost.TotalNanos)
	}
	// An even share is 1,000 items an org, some 286,000 prompt tokens:
	// more than the limit, so each org's share goes in several batches.
	if s.Batches.Retried != 0 || s.Batches.Created <= 3 {
		t.Fatalf("batches %+v: want more than one an org, none failed (nothing sent again)", s.Batches)
	}
	t.Logf("%d items in %d batches under an enqueued-token limit of %d an org, none failed", n, s.Batches.Created, limit)
}

// TestOpenAIBatchQueueTokensFromLimits: 'run --route batch' with a limits
// file whose batch model says the OpenAI orgs' enqueued-token limit keeps
// its batches under it as TestOpenAIBatchQueueTokens: none fails.
func TestOpenAIBatchQueueTokensFromLimits(t *testing.T) {
	t.Parallel()
	const n, limit = 3000, 200_000
	lim := gptLimits
	lim.BatchQueueTokens = limit
	b := gptBench(t, n, 2000, lim)
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{
		Input: b.input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
		Limits: &plan.Limits{Batch: &plan.BatchModel{QueueTokens: limit}},
		Sync:   dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != n {
		t.Fatalf("exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	if s := out.Summary.Batches; s.Retried != 0 || s.Created <= 3 {
		t.Fatalf("batches %+v: want more than one an org, none failed", s)
	}
	if nanos, billed, twice := batchLedger(b.sim.Server.Ledger()); billed != n || twice != 0 || out.Summary.Cost.TotalNanos != nanos {
		t.Fatalf("billed %d (%d twice), %d n$; summary %d n$", billed, twice, nanos, out.Summary.Cost.TotalNanos)
	}
}

// TestRunMixedFileByBatch: 'run --route batch' of a mixed file sends its
// Claude items in Message Batches on the Anthropic orgs and its GPT items
// in OpenAI batches on the OpenAI org, each once at the batch price; the
// summary's cost is the ledger's, and each results line is its
// provider's.
func TestRunMixedFileByBatch(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 2000, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 60, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 40, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	if err := os.WriteFile(input, append(claude.Bytes(), gpt.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	runDir := filepath.Join(t.TempDir(), "run")
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: runDir, Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1, MaxCost: cost.NanosPerUSD},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 100 {
		t.Fatalf("mixed run by batch: exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	nanos, billed, twice := sim.BatchBilling(r.Server.Ledger())
	if billed != 100 || twice != 0 || out.Summary.Cost.TotalNanos != nanos {
		t.Fatalf("ledger: %d batch requests billed (%d twice), %d n$; summary %d n$", billed, twice, nanos, out.Summary.Cost.TotalNanos)
	}
	byOrg := map[string]int{}
	for _, e := range r.Server.Ledger() {
		if e.ServiceTier != "batch" {
			t.Fatalf("a request billed outside a batch: %+v", e)
		}
		byOrg[e.Org]++
	}
	if byOrg["gpt"] != 40 || len(byOrg) < 2 {
		t.Fatalf("billed by org %v: want the 40 GPT items on gpt, the 60 Claude items on the Anthropic orgs", byOrg)
	}
	data, err := os.ReadFile(filepath.Join(runDir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var oaLines, anLines int
	for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var v struct {
			CustomID string          `json:"custom_id"`
			Response json.RawMessage `json:"response"`
			Result   json.RawMessage `json:"result"`
			Dispatch struct {
				Org, Route string
			} `json:"dispatch"`
		}
		if err := json.Unmarshal(l, &v); err != nil || v.Dispatch.Route != "batch" {
			t.Fatalf("line %s: %v", l, err)
		}
		switch {
		case strings.HasPrefix(v.CustomID, "gpt_judge_") && v.Response != nil && v.Result == nil && v.Dispatch.Org == "gpt":
			oaLines++
		case !strings.HasPrefix(v.CustomID, "gpt_judge_") && v.Result != nil && v.Response == nil && v.Dispatch.Org != "gpt":
			anLines++
		default:
			t.Fatalf("line of the wrong provider's shape or org: %s", l)
		}
	}
	if oaLines != 40 || anLines != 60 {
		t.Fatalf("%d OpenAI lines, %d Anthropic lines; want 40 and 60", oaLines, anLines)
	}
}

// TestRunMixedFileByAuto: 'run --route auto' of a mixed file projects
// both providers' items and buys the cheapest mix that meets the
// deadline for each: here batches would take four API days, so the GPT
// items go by sync as the Claude items do (before, every GPT item went by
// batch whatever the deadline: the router's projection left them out).
// Every item once, no request billed twice, the summary's cost the
// ledger's.
func TestRunMixedFileByAuto(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 60, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 40, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	// GPT items first, then Claude: auto's sync share (the first Claude
	// items) must not take a GPT item.
	if err := os.WriteFile(input, append(gpt.Bytes(), claude.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	runDir := filepath.Join(t.TempDir(), "run")
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: runDir, Prices: cost.Default(), Stderr: &log, Route: runner.RouteAuto,
		// Batches that the router expects to take four API days: under the
		// deadline the Claude items go by sync.
		Deadline: time.Minute, Limits: &plan.Limits{Batch: &plan.BatchModel{QueueWaitS: 400_000}},
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 200, Prices: cost.Default(), SampleEvery: -1},
	})
	if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 100 {
		t.Fatalf("mixed run by auto: exit %d, err %v, log:\n%s", out.Code(), out.Err, log.String())
	}
	// The summary's cost is the ledger's for each body once: a sync
	// request retried after a timeout on a loaded machine may be billed
	// twice (the sync route's possible duplicate billing, counted apart);
	// a GPT item is billed once, in a batch.
	var claudeSync, gptSync int
	var distinct int64
	seen := map[sim.BodyHash]bool{}
	for _, e := range r.Server.Ledger() {
		if e.ServiceTier == "batch" {
			t.Fatalf("an item went by batch under a deadline batches miss: %+v", e)
		}
		if e.Org == "gpt" {
			gptSync++
		} else {
			claudeSync++
		}
		if !seen[e.BodySHA256] {
			seen[e.BodySHA256] = true
			distinct += e.CostNanos
		}
	}
	if len(seen) != 100 || gptSync < 40 || claudeSync < 60 || distinct != out.Summary.Cost.TotalNanos {
		t.Fatalf("ledger: %d bodies, %d GPT and %d Claude sync requests, %d n$ once each; summary %d n$; log:\n%s", len(seen), gptSync, claudeSync, distinct, out.Summary.Cost.TotalNanos, log.String())
	}
	if !strings.Contains(log.String(), "route auto: 0 by batch, 100 by sync") {
		t.Errorf("the router did not send all 100 items by sync; log:\n%s", log.String())
	}
}

// TestRunMixedFileByBatchOpenAIOrgOut: by --route batch, a mixed file whose
// only OpenAI org's key is revoked (its upload answered 401): the Claude
// items complete in Message Batches; the GPT items stay pending, none
// lost, and the run stops naming the first one's line and why its
// provider's org cannot create batches.
func TestRunMixedFileByBatchOpenAIOrgOut(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 2000, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
		c.Faults = []sim.Fault{{Kind: sim.FaultKeyRevoked, Org: "gpt"}}
	})
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 30, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 20, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "mixed.jsonl")
	if err := os.WriteFile(input, append(claude.Bytes(), gpt.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{
		Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 2000, Prices: cost.Default(), SampleEvery: -1},
	})
	s := out.Summary
	if out.Code() != runner.ExitIncomplete || s == nil || s.Succeeded != 30 || s.Unfinished != 20 || !s.DataLoss.Passed {
		t.Fatalf("exit %d, err %v, summary %+v", out.Code(), out.Err, s)
	}
	if !strings.Contains(s.StopReason, "line 31") || !strings.Contains(s.StopReason, "gpt: ") || !strings.Contains(s.StopReason, "401") {
		t.Fatalf("stop reason %q: want it to name line 31 and the gpt org's 401", s.StopReason)
	}
	if led := r.Server.LedgerTotals(); led.Requests != 30 || led.CostNanos != s.Cost.TotalNanos {
		t.Fatalf("ledger %+v, summary %d n$", led, s.Cost.TotalNanos)
	}
}

// 'run --route auto' of a file of GPT items only (150, above the batch
// route's least batch) goes by the OpenAI Batch API, with or without a
// deadline it meets. The campaign's seed 18 (auto, GPT lines only beside
// the Anthropic orgs) found the router reading projected routes such a
// file had none of, before plan projected OpenAI items: a nil
// dereference, exit 2 before anything was sent (the router still sends
// every item by batch when no routes were projected).
func TestRunOpenAIOnlyFileByAuto(t *testing.T) {
	t.Parallel()
	r, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, func(c *sim.Config) {
		c.Orgs = append(c.Orgs, sim.OrgConfig{Name: "gpt", Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: 3000, TPM: 1_000_000}}})
	})
	input := filepath.Join(t.TempDir(), "gpt.jsonl")
	var gpt bytes.Buffer
	if err := workload.GenerateOpenAIJudge(&gpt, 150, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(input, gpt.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, deadline := range []time.Duration{0, time.Minute} {
		before := len(r.Server.Ledger())
		var log bytes.Buffer
		out := runner.Run(t.Context(), runner.Config{
			Input: input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(), Stderr: &log, Route: runner.RouteAuto, Deadline: deadline,
			Sync: dispatch.Config{Orgs: r.Server.AllOrgs(), BaseURL: r.URL, Speed: 200, Prices: cost.Default(), SampleEvery: -1},
		})
		if out.Code() != runner.ExitOK || out.Summary == nil || out.Summary.Succeeded != 150 {
			t.Fatalf("--deadline %s: exit %d, err %v, log:\n%s", deadline, out.Code(), out.Err, log.String())
		}
		var nanos int64
		seen := map[sim.BodyHash]bool{}
		for _, e := range r.Server.Ledger()[before:] {
			if e.ServiceTier != "batch" || seen[e.BodySHA256] {
				t.Fatalf("--deadline %s: a GPT item went by sync, or was billed twice: %+v\n%s", deadline, e, log.String())
			}
			seen[e.BodySHA256] = true
			nanos += e.CostNanos
		}
		if len(seen) != 150 || nanos != out.Summary.Cost.TotalNanos {
			t.Fatalf("--deadline %s: %d items billed, %d n$; summary %d n$", deadline, len(seen), nanos, out.Summary.Cost.TotalNanos)
		}
	}
}
