package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
)

// hookTransport hands every request to fn, with the transport beneath.
type hookTransport struct {
	next http.RoundTripper
	fn   func(req *http.Request, next http.RoundTripper) (*http.Response, error)
}

func (h hookTransport) RoundTrip(req *http.Request) (*http.Response, error) { return h.fn(req, h.next) }

func hook(fn func(req *http.Request, next http.RoundTripper) (*http.Response, error)) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper { return hookTransport{next: next, fn: fn} }
}

func isCreate(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.TrimSuffix(req.URL.Path, "/") == "/v1/messages/batches"
}

// colleagueBatch creates, with key, a batch of the requests of the request
// file path (a colleague's job), their custom_ids' "phase6_" replaced by
// rename when it is not empty, and returns its id.
func colleagueBatch(t *testing.T, base, key, path, rename string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rename != "" {
		b = bytes.ReplaceAll(b, []byte(`"custom_id":"phase6_`), []byte(`"custom_id":"`+rename))
	}
	var body bytes.Buffer
	body.WriteString(`{"requests":[`)
	for i, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(l)
	}
	body.WriteString(`]}`)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages/batches", &body)
	req.Header.Set(anthropic.HeaderAPIKey, key)
	req.Header.Set(anthropic.HeaderVersion, anthropic.APIVersion)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out.ID == "" {
		t.Fatalf("the colleague's create: %d, %v", resp.StatusCode, err)
	}
	return out.ID
}

// waitEnded waits until no batch of the simulator is in progress.
func waitEnded(t *testing.T, r *sim.Running) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		busy := 0
		for _, st := range r.Server.BatchStats() {
			busy += st.InProgress
		}
		if busy == 0 {
			return
		}
	}
	t.Fatal("the simulator's batches did not end")
}

// billedOncePerItem checks that every request of ours (the ledger's batch
// entries, less those of the batches in other) was billed exactly once and
// that there are n of them.
func billedOncePerItem(t *testing.T, r *sim.Running, n int, other ...string) {
	t.Helper()
	skip := map[string]bool{}
	for _, id := range other {
		skip[id] = true
	}
	var ours []sim.LedgerEntry
	for _, e := range r.Server.Ledger() {
		if e.ServiceTier == "batch" && !skip[e.BatchID] {
			ours = append(ours, e)
		}
	}
	if _, billed, twice := sim.BatchBilling(ours); billed != n || twice != 0 {
		t.Fatalf("the simulator billed %d of our batch requests (%d twice); want %d, each once", billed, twice, n)
	}
}

// resultBatchIDs reads the results file of dir: custom_id → dispatch.batch_id.
func resultBatchIDs(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.ResultsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Dispatch struct {
				BatchID string `json:"batch_id"`
			} `json:"dispatch"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		out[l.CustomID] = l.Dispatch.BatchID
	}
	return out
}

func countEvents(t *testing.T, dir, substr string) int {
	n := 0
	for _, e := range readEvents(t, dir) {
		if strings.Contains(e.Note, substr) {
			n++
		}
	}
	return n
}

// TestLostCreateWithEndedLookalikeDoesNotWaitForEver (issue #19 case 2):
// the create fails before any batch exists, and the org has an ended
// batch of the same request count (a colleague's). The record must not
// wait for it to "end" for ever, nor read its results again and again: it
// is read once, proven not ours, and the record is abandoned once the API
// has had time to show a batch; the items then go in a new batch, each
// billed once.
func TestLostCreateWithEndedLookalikeDoesNotWaitForEver(t *testing.T) {
	const n = 300
	b := newBench(t, n, 2000, nil)
	b.orgs = b.orgs[:1]
	key := b.sim.Server.Keys()[b.orgs[0].Name][0]
	other := simtest.Judge(t, t.TempDir(), n, 11)
	theirs := colleagueBatch(t, b.sim.URL, key, other, "colleague_")
	waitEnded(t, b.sim)

	var failed atomic.Bool
	var reads atomic.Int64
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if isCreate(req) && failed.CompareAndSwap(false, true) {
			return nil, errors.New("connection reset before the request was sent")
		}
		if strings.Contains(req.URL.Path, theirs+"/results") {
			reads.Add(1)
		}
		return next.RoundTrip(req)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err, dir := b.exec(ctx, "", x)
	if err != nil || !res.Complete {
		t.Fatalf("a lost create beside an ended batch of its size: %v (complete %v); want the run complete", err, res != nil && res.Complete)
	}
	b.audit(dir)
	if testing.Verbose() {
		for _, e := range readEvents(t, dir) {
			if e.Kind == rundir.EventBatch {
				t.Logf("%s: %s", e.Kind, e.Note)
			}
		}
	}
	if got := reads.Load(); got > 1 {
		t.Fatalf("the colleague's results were read %d times; want once at most", got)
	}
	if res.Batch.Abandoned != 1 || res.Batch.Adopted != 0 {
		t.Fatalf("batch result %+v: want the lost record abandoned, nothing adopted", res.Batch)
	}
	billedOncePerItem(t, b.sim, n, theirs)
	for id, bid := range resultBatchIDs(t, dir) {
		if bid == theirs {
			t.Fatalf("%s: result from the colleague's batch", id)
		}
	}
	t.Logf("the colleague's ended batch of %d was read %d time(s) and rejected; the lost record was abandoned after %s of API time and its %d items sent in a new batch, each billed once",
		n, reads.Load(), "5 min", n)
}

// TestLostCreateAdoptsOursNotColleagues (issue #19 case 3): our create's
// answer is lost, and just before it a colleague, on the same org,
// created a batch of the same size with the same custom_ids (every gen
// file starts at phase6_000000), which ends first. We adopt our own batch, never theirs: every result line
// comes from ours, and the simulator billed each of our items once.
func TestLostCreateAdoptsOursNotColleagues(t *testing.T) {
	const n = 300
	// Each batch takes a minute of API time (0.3 s here): the colleague's
	// ends well before ours.
	b := newBench(t, n, 200, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute = 5, n
		}
	})
	b.orgs = b.orgs[:1]
	key := b.sim.Server.Keys()[b.orgs[0].Name][0]
	other := simtest.Judge(t, t.TempDir(), n, 11) // same custom_ids, other params

	var once sync.Once
	var theirs string
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if !isCreate(req) {
			return next.RoundTrip(req)
		}
		lost := false
		once.Do(func() { lost = true })
		if !lost {
			return next.RoundTrip(req)
		}
		// Just before ours, the colleague creates theirs on the org (so
		// it is processed first); ours is created, and its answer lost.
		theirs = colleagueBatch(t, b.sim.URL, key, other, "")
		resp, err := next.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset while reading the answer")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	res, err, dir := b.exec(ctx, "", x)
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	if testing.Verbose() {
		for _, e := range readEvents(t, dir) {
			if e.Kind == rundir.EventBatch {
				t.Logf("%s: %s", e.Kind, e.Note)
			}
		}
	}
	b.audit(dir)
	if theirs == "" {
		t.Fatal("the colleague's batch was never created")
	}
	st, err := sqlite.Open(filepath.Join(dir, rundir.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Batches(t.Context())
	st.Close()
	if err != nil || len(recs) != 1 || recs[0].ID == theirs || recs[0].Status != store.BatchHarvested {
		t.Fatalf("records %+v, %v: want one, harvested, not the colleague's %s", recs, err, theirs)
	}
	ours := recs[0].ID
	for id, bid := range resultBatchIDs(t, dir) {
		if bid != ours {
			t.Fatalf("%s: result from batch %s; want ours, %s (the colleague's is %s)", id, bid, ours, theirs)
		}
	}
	if res.Batch.Adopted != 1 || res.Batch.Created != 0 {
		t.Fatalf("batch result %+v: want ours adopted, none created again", res.Batch)
	}
	billedOncePerItem(t, b.sim, n, theirs)
	var theirsBilled int
	for _, e := range b.sim.Server.Ledger() {
		if e.BatchID == theirs {
			theirsBilled++
		}
	}
	t.Logf("ours %s adopted and harvested (%d result lines, all from it); the colleague's %s (same %d custom_ids) rejected; ledger: our %d items billed once each, the colleague's batch %d (theirs)",
		ours, len(resultBatchIDs(t, dir)), theirs, n, n, theirsBilled)
}

// TestResultsPastRetentionSentAgain (issue #19 case 4): a run stopped
// with its batches open resumes after their results' retention (29 days
// on the API; 120 API seconds here). The batch object says archived_at;
// its items go back to pending, with an event, and are sent again in new
// batches; nothing is retried for ever.
func TestResultsPastRetentionSentAgain(t *testing.T) {
	const n, k = 300, 50
	b := newBench(t, n, k, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.RetentionS = 5, 120
		}
	})
	dir := filepath.Join(t.TempDir(), "run")
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		for ctx.Err() == nil {
			if _, created := simCreated(b.sim); created >= 3 {
				stop()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	first, _, _ := b.exec(ctx, dir, runner.Exec{Route: runner.RouteBatch})
	stop()
	if first == nil || first.Summary == nil || first.Summary.Batches.Open == 0 {
		t.Fatalf("the stopped run: %+v; want batches left open", first)
	}
	time.Sleep(time.Duration(float64(130*time.Second) / k)) // past retention
	rctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	res, err, _ := b.exec(rctx, dir, runner.Exec{Route: runner.RouteBatch})
	if err != nil || !res.Complete {
		for _, e := range readEvents(t, dir) {
			if e.Kind == rundir.EventBatch {
				t.Logf("%s: %s", e.Kind, e.Note)
			}
		}
		t.Fatalf("the resume past retention: %v; want it complete", err)
	}
	b.audit(dir)
	if res.Batch.Archived == 0 || countEvents(t, dir, "past retention") == 0 {
		t.Fatalf("batch result %+v: want the archived batches settled, with an event", res.Batch)
	}
	t.Logf("%d batches past retention; %d results sent again; %d batches in all", res.Batch.Archived, res.Summary.Batches.Retried, res.Summary.Batches.Created)
}

// TestChangedInputNamesOpenBatches (issue #19 case 5): a run directory
// whose batches are still open is refused for a changed input, and the
// refusal names the open batches (ids, orgs) and how to cancel them.
func TestChangedInputNamesOpenBatches(t *testing.T) {
	b := newBench(t, 300, 2000, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS = 3600 // they stay open
		}
	})
	dir := filepath.Join(t.TempDir(), "run")
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		for ctx.Err() == nil {
			if _, created := simCreated(b.sim); created >= 3 {
				time.Sleep(20 * time.Millisecond)
				stop()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	first, _, _ := b.exec(ctx, dir, runner.Exec{Route: runner.RouteBatch})
	stop()
	if first == nil || first.Summary == nil || first.Summary.Batches.Open != 3 {
		t.Fatalf("the stopped run: %+v; want 3 batches open", first)
	}
	st, err := sqlite.Open(filepath.Join(dir, rundir.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := st.Batches(t.Context())
	st.Close()
	// The input changes.
	f, err := os.OpenFile(b.input, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, `{"custom_id":"late_addition","params":{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`)
	f.Close()
	out := runner.Run(t.Context(), runner.Config{Input: b.input, RunDir: dir, Prices: cost.Default(), Route: runner.RouteBatch,
		Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default()}})
	if out.Code() != runner.ExitUsage || out.Err == nil {
		t.Fatalf("a changed input: exit %d, %v; want 1 with a refusal", out.Code(), out.Err)
	}
	msg := out.Err.Error()
	for _, r := range recs {
		if !strings.Contains(msg, r.ID) || !strings.Contains(msg, "org "+r.Org) {
			t.Fatalf("the refusal does not name batch %s on org %s: %s", r.ID, r.Org, msg)
		}
	}
	if !strings.Contains(msg, "--cancel") || !strings.Contains(msg, "--run-dir "+dir) {
		t.Fatalf("the refusal does not say how to cancel them: %s", msg)
	}
	t.Log(msg)
}

// TestBatchEndpointsPacedUnderOrgRPM (issue #19 case 6): many small
// batches on orgs at the lowest tier's batch RPM (50): the simulator's
// count of batch-endpoint requests (create, retrieve, list, results) per
// org in any API minute stays within it, and the run completes.
func TestBatchEndpointsPacedUnderOrgRPM(t *testing.T) {
	const n, k, rpm = 600, 100, 50
	b := newBench(t, n, k, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.RPM, c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.PerMinute = rpm, 10, 6000
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	res, err, dir := b.exec(ctx, "", runner.Exec{Route: runner.RouteBatch, Batch: batch.Config{Size: 10}})
	if err != nil || !res.Complete {
		t.Fatalf("batch route: %v", err)
	}
	b.audit(dir)
	if res.Summary.Batches.Created < 50 {
		t.Fatalf("%d batches: want many small ones", res.Summary.Batches.Created)
	}
	for name, st := range b.sim.Server.BatchStats() {
		t.Logf("org %s: %d batch-endpoint calls, at most %d in an API minute (limit %d), %d refused with 429", name, st.Calls, st.MaxCallsPerMinute, st.RPM, st.RateLimited)
		if st.MaxCallsPerMinute > rpm {
			t.Errorf("org %s: %d batch-endpoint calls in one API minute; its limit is %d", name, st.MaxCallsPerMinute, rpm)
		}
	}
}

// TestForeignResultsNeedAPerson (issue #19, exit 6): a batch whose
// results hold a custom_id it was not given stops the run with exit 6
// "needs a person" (a resume would find the same), not 4.
func TestForeignResultsNeedAPerson(t *testing.T) {
	b := newBench(t, 30, 2000, nil)
	b.orgs = b.orgs[:1]
	sync := dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1}
	sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil || !strings.HasSuffix(req.URL.Path, "/results") || resp.StatusCode != 200 {
			return resp, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The first line's custom_id becomes one nobody sent.
		i := bytes.Index(body, []byte(`"custom_id":"`)) + len(`"custom_id":"`)
		body = append(body[:i:i], append([]byte("someone_else_"), body[i:]...)...)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Del("content-length")
		return resp, nil
	})
	out := runner.Run(t.Context(), runner.Config{Input: b.input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(),
		Route: runner.RouteBatch, Sync: sync})
	if out.Code() != runner.ExitNeedsPerson || !errors.Is(out.Err, batch.ErrNeedsPerson) || !strings.Contains(out.Err.Error(), "someone_else_") {
		t.Fatalf("foreign results: exit %d, %v; want 6 naming the custom_id", out.Code(), out.Err)
	}
}

// TestPilotWithBatchRouteSaysSyncPrice: --pilot with --route batch sends
// the pilot by sync, and the run says so (and at what price).
func TestPilotWithBatchRouteSaysSyncPrice(t *testing.T) {
	b := newBench(t, 60, 2000, nil)
	var log bytes.Buffer
	out := runner.Run(t.Context(), runner.Config{Input: b.input, RunDir: filepath.Join(t.TempDir(), "run"), Prices: cost.Default(),
		Route: runner.RouteBatch, Pilot: 9, Stderr: &log,
		Sync: dispatch.Config{Orgs: b.orgs, BaseURL: b.sim.URL, Speed: b.speed, Prices: cost.Default(), SampleEvery: -1}})
	if out.Code() != runner.ExitOK {
		t.Fatalf("exit %d, %v", out.Code(), out.Err)
	}
	if !strings.Contains(log.String(), "the first 9 items go by sync, at the full (sync) price") {
		t.Fatalf("the run does not say the pilot goes by sync at full price:\n%s", log.String())
	}
	if r := out.Summary.ByRoute[store.RouteSync]; r == nil || r.Items != 9 {
		t.Fatalf("by_route sync %+v: want the 9 pilot items", r)
	}
}

// TestBatchCreateUploadHonoursStop: a stop during a create's upload ends
// the run at once (the upload is cut; the record is reconciled by the
// resume), not when the upload's own timeout passes.
func TestBatchCreateUploadHonoursStop(t *testing.T) {
	b := newBench(t, 30, 1, nil)
	b.orgs = b.orgs[:1]
	started := make(chan struct{}, 1)
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if !isCreate(req) {
			return next.RoundTrip(req)
		}
		select {
		case started <- struct{}{}:
		default:
		}
		// An upload that does not get through (for 30 s at most).
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(30 * time.Second):
			return nil, errors.New("upload timed out")
		}
	})
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		<-started
		stop()
	}()
	t0 := time.Now()
	res, _, dir := b.exec(ctx, "", x)
	if el := time.Since(t0); el > 20*time.Second {
		t.Fatalf("the stop took %s to end the run during a create's upload", el)
	}
	if res == nil || res.Summary == nil || res.Summary.Batches.Open != 1 {
		t.Fatalf("the stopped run: %+v; want the record left open, to reconcile", res)
	}
	_ = dir
}
