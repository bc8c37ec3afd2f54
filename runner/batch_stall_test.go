package runner_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/runner"
)

// loseFirstUpload is a transport hook under which the API stores the
// first OpenAI upload but its answer is lost (a 500): the route takes it
// for an upload that made nothing.
func loseFirstUpload() func(http.RoundTripper) http.RoundTripper {
	var once sync.Once
	return hook(func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err != nil || req.Method != http.MethodPost || req.URL.Path != "/v1/files" || resp.StatusCode != http.StatusOK {
			return resp, err
		}
		lose := false
		once.Do(func() { lose = true })
		if lose {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			resp.StatusCode, resp.Status = http.StatusInternalServerError, "500 Internal Server Error"
			resp.Body = io.NopCloser(strings.NewReader(`{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`))
		}
		return resp, nil
	})
}

// TestBatchCreateAbandonedWithNothingOpenGoesOn: a create abandoned while
// submitting (here an upload whose answer was lost, the org resting 5 API
// seconds), when no other batch is open, is followed by a new create once
// the org's rest ends. Before, the loop noticed a batch settled only by
// the steps after the submit, and skipped an org's rest that had ended by
// the time it looked (5 API s are 2.5 ms at K = 2,000): it slept its
// default hour, and a run of 300 items made nothing more (stopped at 2
// min).
func TestBatchCreateAbandonedWithNothingOpenGoesOn(t *testing.T) {
	t.Parallel()
	b := gptBench(t, 300, 2000, gptLimits)
	b.orgs = b.orgs[:1]
	x := runner.Exec{Route: runner.RouteBatch}
	x.Sync.WrapTransport = loseFirstUpload()
	t0 := time.Now()
	res, err := b.boundedRun("", x)
	if err != nil || !res.Complete {
		t.Fatalf("a run whose one upload lost its answer: %v", err)
	}
	t.Logf("done in %.1f s", time.Since(t0).Seconds())
	if _, billed, twice := batchLedger(b.sim.Server.Ledger()); billed != 300 || twice != 0 || res.Batch.Abandoned != 1 {
		t.Fatalf("billed %d (%d twice), %d abandoned: want 300 once, the one upload abandoned", billed, twice, res.Batch.Abandoned)
	}
}
