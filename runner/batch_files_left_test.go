package runner_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/runner"
)

// TestOpenAIBatchUploadLeftByAStopIsDeleted: a run that stops (or dies)
// after an OpenAI upload is answered and before its batch create is
// answered leaves a record whose create may have made a batch; the
// resume finds none and abandons the record, so the upload is a file
// nothing will read. It is deleted: after the resumed run completes the
// orgs hold no input file of the run, and none is counted left. Before,
// the upload's id was known only to the process that stopped, and the
// file stayed on the org (1 left, 0 counted).
func TestOpenAIBatchUploadLeftByAStopIsDeleted(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 300, 2000, gptLimits)
	b.orgs = b.orgs[:1]
	dir := filepath.Join(t.TempDir(), "run")
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var once sync.Once
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPost && req.URL.Path == "/v1/batches" {
			// The upload was answered; the process dies as it sends the
			// create (nothing of the create reaches the API).
			cut := false
			once.Do(func() { cut = true })
			if cut {
				stop()
				return nil, errors.New("the process died")
			}
		}
		return next.RoundTrip(req)
	})
	b.exec(ctx, dir, x)
	if files := b.openaiFiles(); len(files["gpt_a"]) != 1 {
		t.Fatalf("after the stop the orgs hold %v; want the one upload", files)
	}
	x.Sync.WrapTransport = nil
	res := b.resumedOnce(dir, x, 300)
	if files := b.openaiFiles(); len(files) != 0 || res.Batch.FilesLeft != 0 {
		t.Fatalf("input files left on the orgs after the resumed run: %v (%d counted)", files, res.Batch.FilesLeft)
	}
}

// TestOpenAIBatchUploadAnswerLostIsDeleted: an upload the API stored whose
// answer was lost (a 500 here) makes no batch, and the route sends its
// items again in another; the stored file is one nothing will read, and
// it is deleted: after the run the org holds no input file of the run,
// and a colleague's batch file on the same org is left alone. Before, the
// lost upload's id was never known and it stayed on the org (1 left, 0
// counted).
func TestOpenAIBatchUploadAnswerLostIsDeleted(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 300, 2000, gptLimits)
	b.orgs = b.orgs[:1]
	colleagueOpenAIBatch(t, b.sim.URL, b.sim.Server.Keys()["gpt_a"][0], b.input, nil)
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = loseFirstUpload()
	res, err := b.boundedRun("", x)
	if err != nil || !res.Complete {
		t.Fatalf("the run: %v", err)
	}
	if files := b.openaiFiles(); len(files) != 1 || len(files["gpt_a"]) != 1 || files["gpt_a"][0] != "theirs.jsonl" || res.Batch.FilesLeft != 0 {
		t.Fatalf("files on the orgs after the run: %v (%d counted left); want the colleague's theirs.jsonl only", files, res.Batch.FilesLeft)
	}
}
