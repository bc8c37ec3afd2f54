package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/soak"
)

// alwaysCut is a batch_results_cut that strikes every results download
// from now on: each read of a results stream breaks at its half.
var alwaysCut = sim.Fault{ID: "cut", Kind: sim.FaultBatchResultsCut, Duration: 1000 * time.Hour, FromNow: true}

// boundedRun runs x on dir under a deadline a run that never ends would
// pass (the test then fails on its error instead of hanging).
func (b *bench) boundedRun(dir string, x runner.Exec) (*runner.Result, error) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.t.Context(), 2*time.Minute)
	defer cancel()
	res, err, _ := b.exec(ctx, dir, x)
	if ctx.Err() != nil {
		b.t.Fatalf("the run did not end within 2 minutes (it retries for ever): %v", err)
	}
	return res, err
}

// resumedOnce runs x on dir to its end as a resume, audits the results and
// checks that the simulator billed each of n batch requests once.
func (b *bench) resumedOnce(dir string, x runner.Exec, n int) *runner.Result {
	b.t.Helper()
	res, err := b.boundedRun(dir, x)
	if err != nil || !res.Complete {
		b.t.Fatalf("the resumed run: %v", err)
	}
	b.audit(dir)
	if _, billed, twice := batchLedger(b.sim.Server.Ledger()); billed != n || twice != 0 {
		b.t.Fatalf("billed %d (%d twice)", billed, twice)
	}
	return res
}

// checkStopMessage checks that err is ErrNeedsPerson naming a batch by
// its local number, its id and its org, and says what failed, without a
// key.
func (b *bench) checkStopMessage(err error, idPrefix string, what ...string) {
	b.t.Helper()
	if !errors.Is(err, batch.ErrNeedsPerson) {
		b.t.Fatalf("the run ended with %v; want ErrNeedsPerson", err)
	}
	msg := err.Error()
	re := regexp.MustCompile(`batch \d+ of this run \(` + idPrefix + `\w+, org \w+\)`)
	if !re.MatchString(msg) {
		b.t.Fatalf("the stop does not name the batch's number, id and org: %s", msg)
	}
	for _, w := range append(what, "stay held", "the same command tries again") {
		if !strings.Contains(msg, w) {
			b.t.Fatalf("the stop does not say %q: %s", w, msg)
		}
	}
	for _, o := range b.sim.Server.AllOrgs() {
		if k := o.Key.Reveal(); k != "" && strings.Contains(msg, k) {
			b.t.Fatalf("the stop holds org %s's key: %s", o.Name, msg)
		}
	}
}

// noResultTwice checks that no custom_id has two results lines and none
// is unknown.
func (b *bench) noResultTwice(dir string) soak.Check {
	b.t.Helper()
	c, err := soak.CheckResults(b.input, filepath.Join(dir, rundir.ResultsFile))
	if err != nil || c.Repeated+c.Unknown != 0 {
		b.t.Fatalf("results %+v, %v", c, err)
	}
	return c
}

// TestBatchResultsAlwaysBrokenNeedsPerson: a Message Batches results
// stream that breaks on every read (at the same place) is read again with
// back-off, but not for ever: after readFailMax reads over 30 API minutes
// without getting further the run stops with ErrNeedsPerson naming the
// batch. The results committed stand, nothing is created or billed again,
// and the run after the fault ends completes each item once. Before, the
// run never ended.
func TestBatchResultsAlwaysBrokenNeedsPerson(t *testing.T) {
	t.Parallel()
	b := newBench(t, 300, 20000, nil)
	if _, err := b.sim.Server.AddFault(alwaysCut); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "run")
	_, stop := b.boundedRun(dir, runner.Exec{Route: runner.RouteBatch})
	b.checkStopMessage(stop, "msgbatch_", "reading its results failed", "without getting further", "results stream broke off")
	c := b.noResultTwice(dir)
	if c.Lines == 0 {
		t.Fatal("no results committed: the first half of each stream should stand")
	}
	if req, created := simCreated(b.sim); created != 3 || req != 300 {
		t.Fatalf("%d batches (%d requests) created: want the 3 first, nothing sent again", created, req)
	}
	b.sim.Server.ClearFaults("cut")
	res, err := b.boundedRun(dir, runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		t.Fatalf("the run after the fault: %v", err)
	}
	b.audit(dir)
	_, billed, twice := batchLedger(b.sim.Server.Ledger())
	if req, created := simCreated(b.sim); billed != 300 || twice != 0 || created != 3 || req != 300 {
		t.Fatalf("billed %d (%d twice), %d batches of %d requests: want 300 once, the 3 first batches only", billed, twice, created, req)
	}
	t.Logf("stopped with %d of 300 results committed: %v", c.Lines, stop)
}

// openaiCreates counts the OpenAI batch creates answered 200.
type openaiCreates struct {
	mu sync.Mutex
	n  int
}

func (c *openaiCreates) count(req *http.Request, resp *http.Response) {
	if isOpenAICreate(req) && resp.StatusCode == http.StatusOK {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}

func (c *openaiCreates) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// countingExec is a batch route Exec that counts the creates answered.
func countingExec(c *openaiCreates) runner.Exec {
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil {
			c.count(req, resp)
		}
		return resp, err
	})
	return x
}

// TestOpenAIBatchResultsAlwaysBrokenNeedsPerson: TestBatchResultsAlwaysBrokenNeedsPerson
// for OpenAI batches, whose output file's download breaks on every read.
func TestOpenAIBatchResultsAlwaysBrokenNeedsPerson(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 300, 20000, gptLimits, alwaysCut)
	dir := filepath.Join(t.TempDir(), "run")
	var creates openaiCreates
	_, err := b.boundedRun(dir, countingExec(&creates))
	b.checkStopMessage(err, "batch_", "reading its results failed", "without getting further", "results stream broke off")
	c := b.noResultTwice(dir)
	made := creates.get()
	if c.Lines == 0 || made < 3 {
		t.Fatalf("%d results committed, %d batches: want the first half of each output file to stand, a batch an org", c.Lines, made)
	}
	b.sim.Server.ClearFaults("cut")
	res, err := b.boundedRun(dir, countingExec(&creates))
	if err != nil || !res.Complete {
		t.Fatalf("the run after the fault: %v", err)
	}
	b.audit(dir)
	_, billed, twice := batchLedger(b.sim.Server.Ledger())
	if billed != 300 || twice != 0 || creates.get() != made {
		t.Fatalf("billed %d (%d twice), %d batches created (%d before): want 300 once, none created again", billed, twice, creates.get(), made)
	}
}

// TestOpenAIBatchOutputFile404NeedsPerson: an ended OpenAI batch whose
// output file was deleted (someone on the org, or the file's retention)
// answers 404 on every download while the batch still names the file:
// the run stops after goneConfirm confirmations with ErrNeedsPerson
// naming the batch and the file, its items held (nothing created again,
// nothing billed twice); a resume finds the same. Before, the run never
// ended (an OpenAI batch has no archived_at, so the past-retention path
// never fired).
func TestOpenAIBatchOutputFile404NeedsPerson(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 300, 20000, gptLimits)
	dir := filepath.Join(t.TempDir(), "run")
	var creates openaiCreates
	var mu sync.Mutex
	deleted := map[string]bool{}
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		creates.count(req, resp)
		if req.Method != http.MethodGet || !strings.HasPrefix(req.URL.Path, "/v1/batches/") || resp.StatusCode != http.StatusOK {
			return resp, nil
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var ob struct {
			OutputFileID *string `json:"output_file_id"`
		}
		json.Unmarshal(body, &ob)
		mu.Lock()
		defer mu.Unlock()
		if f := ob.OutputFileID; f != nil && !deleted[*f] {
			// Deleted on the org once the batch has ended, before the
			// route reads it.
			deleted[*f] = true
			del, _ := http.NewRequestWithContext(req.Context(), http.MethodDelete, b.sim.URL+"/v1/files/"+*f, nil)
			del.Header = req.Header.Clone()
			dr, err := next.RoundTrip(del)
			if err != nil || dr.StatusCode != http.StatusOK {
				t.Errorf("deleting %s: %v %v", *f, err, dr)
			} else {
				dr.Body.Close()
			}
		}
		return resp, nil
	})
	_, err := b.boundedRun(dir, x)
	b.checkStopMessage(err, "batch_", "answers 404 not found", "though the batch still names it")
	mu.Lock()
	named := false
	for f := range deleted {
		named = named || strings.Contains(err.Error(), f)
	}
	mu.Unlock()
	if !named {
		t.Fatalf("the stop does not name the file: %v", err)
	}
	made := creates.get()
	_, err = b.boundedRun(dir, x)
	b.checkStopMessage(err, "batch_", "answers 404 not found")
	b.noResultTwice(dir)
	if _, _, twice := batchLedger(b.sim.Server.Ledger()); twice != 0 || creates.get() != made {
		t.Fatalf("%d billed twice, %d batches created (%d before the resume): want none twice, none created again", twice, creates.get(), made)
	}
}

// TestBatchResultsBrokenThenRead: a results download that breaks and is
// read again completes the run, each item once: one that breaks 12 times
// (more than readFailMax, in less than 30 API minutes: at K = 100, 4.6 s
// of back-off of the 18 s), and one that breaks 44 times (over more than
// 30 API minutes) but gets a little further each time.
func TestBatchResultsBrokenThenRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		speed  float64
		breaks int
		// at is where the k-th read of a file breaks, of its n bytes.
		at func(k, n int) int
	}{
		{"12 at the half", 100, 12, func(k, n int) int { return n / 2 }},
		{"44 each further", 20000, 44, func(k, n int) int { return (k + 1) * n / 50 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := gptBench(t, 300, tc.speed, gptLimits)
			var mu sync.Mutex
			reads := map[string]int{}
			x := runner.Exec{Route: runner.RouteBatch}
			x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
				resp, err := next.RoundTrip(req)
				if err != nil || req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/content") || resp.StatusCode != http.StatusOK {
					return resp, err
				}
				mu.Lock()
				k := reads[req.URL.Path]
				reads[req.URL.Path]++
				mu.Unlock()
				if k >= tc.breaks {
					return resp, nil
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:tc.at(k, len(body))]), errReader{}))
				return resp, nil
			})
			res, err := b.boundedRun("", x)
			if err != nil || !res.Complete {
				t.Fatalf("a download broken %d times: %v", tc.breaks, err)
			}
			if _, billed, twice := batchLedger(b.sim.Server.Ledger()); billed != 300 || twice != 0 {
				t.Fatalf("billed %d (%d twice)", billed, twice)
			}
			if res.Batch.BrokenDownloads < tc.breaks {
				t.Fatalf("%d broken downloads counted; the hook broke %d a file", res.Batch.BrokenDownloads, tc.breaks)
			}
		})
	}
}

// errReader fails as a connection cut mid-body does.
type errReader struct{}

func (errReader) Read([]byte) (int, error) {
	return 0, fmt.Errorf("%w: the connection was cut", io.ErrUnexpectedEOF)
}

// openaiFiles lists, per OpenAI org of b, the filenames of its files of
// purpose batch (the batches' input files).
func (b *bench) openaiFiles() map[string][]string {
	b.t.Helper()
	out := map[string][]string{}
	for _, o := range b.orgs {
		req, _ := http.NewRequest(http.MethodGet, b.sim.URL+"/v1/files?purpose=batch", nil)
		req.Header.Set("Authorization", "Bearer "+b.sim.Server.Keys()[o.Name][0])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.t.Fatal(err)
		}
		var page struct {
			Data []struct {
				Filename string `json:"filename"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.t.Fatalf("listing org %s's files: %d %v", o.Name, resp.StatusCode, err)
		}
		for _, f := range page.Data {
			out[o.Name] = append(out[o.Name], f.Filename)
		}
	}
	return out
}

// TestOpenAIBatchDeletesInputFiles: once an OpenAI batch is harvested its
// input file is deleted, also for a batch whose create's answer was lost
// and that was adopted (the file proved it ours first): after the run the
// orgs hold no input file of it. Before, every input file stayed (3 of 3).
func TestOpenAIBatchDeletesInputFiles(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 900, 2000, gptLimits, sim.Fault{Kind: sim.FaultBatchCreateLost500})
	res, err, dir := b.exec(t.Context(), "", runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	b.audit(dir)
	if _, billed, twice := batchLedger(b.sim.Server.Ledger()); billed != 900 || twice != 0 || res.Batch.Adopted != 3 {
		t.Fatalf("billed %d (%d twice), batch result %+v: want 900 once, 3 adopted", billed, twice, res.Batch)
	}
	if files := b.openaiFiles(); len(files) != 0 || res.Batch.FilesLeft != 0 {
		t.Fatalf("input files left on the orgs after the run: %v (%d counted)", files, res.Batch.FilesLeft)
	}
}

// TestOpenAIBatchInsufficientQuota: an OpenAI org out of quota answers the
// batch create with 429 insufficient_quota, a billing refusal and not a
// rate limit: the org creates no more batches (one create refused, never
// tried again) and its upload is deleted. With another org able to take
// them, its items go there and the run completes, each once; with every
// org out of quota, the run stops at once (exit 4, incomplete) saying the
// quota is used up, every item pending, nothing billed, no batch open.
func TestOpenAIBatchInsufficientQuota(t *testing.T) {
	t.Parallel()
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all=%v", all), func(t *testing.T) {
			t.Parallel()
			f := sim.Fault{Kind: sim.FaultSpendCap, Org: "gpt_a"}
			if all {
				f.Org = ""
			}
			b := gptBench(t, 300, 2000, gptLimits, f)
			var mu sync.Mutex
			refused := map[string]int{}
			x := runner.Exec{Route: runner.RouteBatch}
			x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
				resp, err := next.RoundTrip(req)
				if err == nil && isOpenAICreate(req) && resp.StatusCode == http.StatusTooManyRequests {
					mu.Lock()
					refused[req.Header.Get("Authorization")]++
					mu.Unlock()
				}
				return resp, err
			})
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			dir := filepath.Join(t.TempDir(), "run")
			var log bytes.Buffer
			out := runner.Run(ctx, runner.Config{
				Input: b.input, RunDir: dir, Prices: cost.Default(), Stderr: &log, Route: runner.RouteBatch,
				Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1, WrapTransport: x.Sync.WrapTransport},
			})
			if ctx.Err() != nil {
				t.Fatalf("the run did not end: %v", out.Err)
			}
			mu.Lock()
			orgsRefused, creates := len(refused), 0
			for _, n := range refused {
				creates += n
			}
			mu.Unlock()
			want := 1
			if all {
				want = 3
			}
			if orgsRefused != want || creates != want {
				t.Fatalf("%d creates refused over %d orgs: want one an org out of quota (%d), none tried again", creates, orgsRefused, want)
			}
			_, billed, twice := batchLedger(b.sim.Server.Ledger())
			if files := b.openaiFiles(); len(files) != 0 {
				t.Fatalf("input files left: %v", files)
			}
			s := out.Summary
			if !all {
				if out.Code() != runner.ExitOK || s == nil || s.Succeeded != 300 || billed != 300 || twice != 0 {
					t.Fatalf("exit %d (%v), billed %d (%d twice); log:\n%s", out.Code(), out.Err, billed, twice, log.String())
				}
				b.audit(dir)
				return
			}
			if out.Code() != runner.ExitIncomplete || s == nil || s.Unfinished != 300 || s.Batches.Open != 0 || billed != 0 ||
				!strings.Contains(out.Stop.Reason, "quota is used up") || !strings.Contains(out.Stop.Reason, "billing") {
				t.Fatalf("exit %d, stop %q (%v), summary %+v, billed %d; want exit 4 saying the quota is used up, 300 pending, nothing billed", out.Code(), out.Stop.Reason, out.Err, s, billed)
			}
			t.Logf("stop: %s", out.Stop.Reason)
		})
	}
}

// batchFiles records, from the batch objects the route retrieves, each
// OpenAI batch's status and output and error files.
type batchFiles struct {
	mu             sync.Mutex
	status         map[string]string // batch id → status
	output, errors map[string]bool   // file ids
}

func newBatchFiles() *batchFiles {
	return &batchFiles{status: map[string]string{}, output: map[string]bool{}, errors: map[string]bool{}}
}

// see reads a batch object answered to req.
func (f *batchFiles) see(req *http.Request, resp *http.Response) {
	if req.Method != http.MethodGet || !strings.HasPrefix(req.URL.Path, "/v1/batches/") || resp.StatusCode != http.StatusOK {
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var ob struct {
		ID           string  `json:"id"`
		Status       string  `json:"status"`
		OutputFileID *string `json:"output_file_id"`
		ErrorFileID  *string `json:"error_file_id"`
	}
	if json.Unmarshal(body, &ob) != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[ob.ID] = ob.Status
	if ob.OutputFileID != nil {
		f.output[*ob.OutputFileID] = true
	}
	if ob.ErrorFileID != nil {
		f.errors[*ob.ErrorFileID] = true
	}
}

func (f *batchFiles) failed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.status {
		if s == "failed" {
			n++
		}
	}
	return n
}

// fileOf is the file id of a content download, "" for another request.
func fileOf(req *http.Request) string {
	if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/content") {
		return ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(req.URL.Path, "/v1/files/"), "/content")
}

// TestOpenAIBatchLearntQueueTokensKept: a batch that fails for its
// model's enqueued-token limit teaches the route what the org takes; a
// run stopped just after it, resumed, keeps what it learnt (the batch's
// record holds it) and does not overrun the limit again. Before, the
// resume sent the same too-big batch first, and it failed again (1).
func TestOpenAIBatchLearntQueueTokensKept(t *testing.T) {
	t.Parallel()
	lim := gptLimits
	lim.BatchQueueTokens = 50_000
	b := gptBench(t, 300, 2000, lim)
	b.orgs = b.orgs[:1]
	dir := filepath.Join(t.TempDir(), "run")
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	first := newBatchFiles()
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPost && req.URL.Path == "/v1/files" && first.failed() > 0 {
			// The next upload after the failure: the run stops there
			// (nothing of it sent).
			stop()
			return nil, errors.New("stopped before the upload")
		}
		resp, err := next.RoundTrip(req)
		if err == nil {
			first.see(req, resp)
		}
		return resp, err
	})
	res, _, _ := b.exec(ctx, dir, x)
	if first.failed() != 1 || res == nil || res.Batch.Retried != 300 {
		t.Fatalf("the first run: %d batches failed, %+v; want the one, its 300 items pending again", first.failed(), res)
	}
	again := newBatchFiles()
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil {
			again.see(req, resp)
		}
		return resp, err
	})
	b.resumedOnce(dir, x, 300)
	if n := again.failed(); n != 0 {
		t.Fatalf("the resumed run overran the enqueued-token limit again: %d batches failed for it; want 0", n)
	}
}

// TestOpenAIBatchResumeSkipsReadOutput: an OpenAI batch that expires half
// done has an output file (its finished requests) and an error file
// (batch_expired lines). The output file is read to its end and its
// results committed; the error file's downloads all break, and the run
// stops (ErrNeedsPerson). The resume reads only the error file: the
// output file, read already, is not downloaded again (before: 1 download
// of 100 lines again), and the run completes each item once.
func TestOpenAIBatchResumeSkipsReadOutput(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 200, 20000, gptLimits, sim.Fault{ID: "stall", Kind: sim.FaultBatchStall, Fraction: 0.5})
	b.orgs = b.orgs[:1]
	dir := filepath.Join(t.TempDir(), "run")
	first := newBatchFiles()
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		first.see(req, resp)
		first.mu.Lock()
		cut := first.errors[fileOf(req)]
		first.mu.Unlock()
		if cut && resp.StatusCode == http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:len(body)/2]), errReader{}))
		}
		return resp, nil
	})
	_, err := b.boundedRun(dir, x)
	b.checkStopMessage(err, "batch_", "reading its results failed")
	if c := b.noResultTwice(dir); c.Lines != 100 || len(first.output) != 1 {
		t.Fatalf("the first run committed %d results from %d output files; want the 100 the batch finished, from its one output file", c.Lines, len(first.output))
	}
	b.sim.Server.ClearFaults("stall")
	var mu sync.Mutex
	downloads := map[string]int{}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if f := fileOf(req); f != "" {
			mu.Lock()
			downloads[f]++
			mu.Unlock()
		}
		return next.RoundTrip(req)
	})
	b.resumedOnce(dir, x, 200)
	mu.Lock()
	defer mu.Unlock()
	for f := range first.output {
		if downloads[f] != 0 {
			t.Fatalf("the resume downloaded the output file %s, read to its end before, %d times; want 0", f, downloads[f])
		}
	}
	for f := range first.errors {
		if downloads[f] != 1 {
			t.Fatalf("the resume downloaded the error file %s %d times; want 1", f, downloads[f])
		}
	}
}
