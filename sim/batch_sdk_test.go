package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
)

func sdkBatchRequest(id string, maxTokens int64, text string) sdk.MessageBatchNewParamsRequest {
	p := sdkParams("claude-sonnet-4-5", maxTokens, text)
	return sdk.MessageBatchNewParamsRequest{CustomID: id, Params: sdk.MessageBatchNewParamsRequestParams{
		Model: p.Model, MaxTokens: p.MaxTokens, System: p.System, Messages: p.Messages,
	}}
}

// sdkWaitEnded polls with Messages.Batches.Get until the batch has ended.
func sdkWaitEnded(t *testing.T, c *sdk.Client, id string) *sdk.MessageBatch {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := c.Messages.Batches.Get(context.Background(), id, sdk.MessageBatchGetParams{})
		if err != nil {
			t.Fatalf("Get %s: %v", id, err)
		}
		if b.ProcessingStatus == sdk.MessageBatchProcessingStatusEnded {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s", id, b.ProcessingStatus)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The official Go SDK creates, polls, lists (auto-paging), cancels, deletes
// and reads the results of batches on the simulator.
func TestSDKBatchLifecycle(t *testing.T) {
	t.Parallel()
	cfg := batchConfig()
	cfg.Orgs = append(cfg.Orgs, OrgConfig{Name: "slow", Keys: []string{"sk-slow"},
		Limits: map[anthropic.Pool]Limits{AnyPool: {RPM: 600}}, Batch: BatchLimits{QueueWaitS: 3600, CancelS: 1}})
	run := startSim(t, cfg)
	ctx := context.Background()
	var lists atomic.Int64
	count := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if req.Method == http.MethodGet && req.URL.Path == batchesPath {
			lists.Add(1)
		}
		return next(req)
	}
	c := sdkClient(run, soloKey, option.WithMiddleware(count))

	// Five batches; the first holds a request the API refuses only when it
	// processes it (max_tokens 0).
	var ids []string
	for i := range 5 {
		reqs := []sdk.MessageBatchNewParamsRequest{
			sdkBatchRequest(fmt.Sprintf("b%d-judge", i), 256, fmt.Sprintf("Item %d. Provide your evaluation as a JSON object.", i)),
			sdkBatchRequest(fmt.Sprintf("b%d-prose", i), 64, fmt.Sprintf("Write note %d.", i)),
		}
		if i == 0 {
			reqs = append(reqs, sdkBatchRequest("b0-zero", 0, "pre-warm"))
		}
		b, err := c.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: reqs})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if b.ProcessingStatus != sdk.MessageBatchProcessingStatusInProgress || b.RequestCounts.Processing != int64(len(reqs)) ||
			b.CreatedAt.IsZero() || !b.EndedAt.IsZero() || b.ExpiresAt.Sub(b.CreatedAt) != 24*time.Hour/1000 || b.ResultsURL != "" {
			t.Errorf("created batch %+v", b)
		}
		ids = append(ids, b.ID)
	}
	for _, id := range ids {
		b := sdkWaitEnded(t, c, id)
		rc := b.RequestCounts
		if rc.Processing != 0 || rc.Canceled != 0 || rc.Expired != 0 || rc.Succeeded != 2 || b.ResultsURL == "" || b.EndedAt.IsZero() {
			t.Errorf("ended batch %s: %+v", id, b)
		}
		if id == ids[0] && rc.Errored != 1 {
			t.Errorf("first batch errored %d, want 1 (max_tokens 0)", rc.Errored)
		}
	}

	// Auto-paging two at a time: newest first, every batch once, three pages.
	var listed []string
	pager := c.Messages.Batches.ListAutoPaging(ctx, sdk.MessageBatchListParams{Limit: sdk.Int(2)})
	for pager.Next() {
		listed = append(listed, pager.Current().ID)
	}
	if err := pager.Err(); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(listed, want) || lists.Load() != 3 {
		t.Errorf("listed %v in %d pages, want %v in 3", listed, lists.Load(), want)
	}

	// Results of the first batch, by ResultsStreaming.
	stream := c.Messages.Batches.ResultsStreaming(ctx, ids[0], sdk.MessageBatchResultsParams{})
	got := map[string]sdk.MessageBatchIndividualResponse{}
	for stream.Next() {
		r := stream.Current()
		got[r.CustomID] = r
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if len(got) != 3 {
		t.Fatalf("%d results", len(got))
	}
	for _, id := range []string{"b0-judge", "b0-prose"} {
		r := got[id].Result
		if r.Type != "succeeded" || r.Message.Usage.ServiceTier != "batch" || r.Message.Usage.OutputTokens == 0 || len(r.Message.Content) != 1 {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if r := got["b0-zero"].Result; r.Type != "errored" || r.Error.Error.Type != "invalid_request_error" {
		t.Errorf("b0-zero: %+v", r)
	}
	if n := run.Server.LedgerTotals().ByOrg["solo"].Requests; n != 10 {
		t.Errorf("%d billed, want the 10 succeeded", n)
	}

	// Cancel a batch still queued (the slow org waits an API hour), then
	// delete it once it has ended.
	slow := sdkClient(run, "sk-slow")
	b, err := slow.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: []sdk.MessageBatchNewParamsRequest{sdkBatchRequest("only", 64, "hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slow.Messages.Batches.Delete(ctx, b.ID, sdk.MessageBatchDeleteParams{}); err == nil {
		t.Error("deleted a batch in progress")
	}
	cb, err := slow.Messages.Batches.Cancel(ctx, b.ID, sdk.MessageBatchCancelParams{})
	if err != nil || cb.ProcessingStatus != sdk.MessageBatchProcessingStatusCanceling || cb.CancelInitiatedAt.IsZero() {
		t.Fatalf("Cancel: %+v %v", cb, err)
	}
	if e := sdkWaitEnded(t, slow, b.ID); e.RequestCounts.Canceled != 1 {
		t.Errorf("canceled batch counts %+v", e.RequestCounts)
	}
	del, err := slow.Messages.Batches.Delete(ctx, b.ID, sdk.MessageBatchDeleteParams{})
	if err != nil || del.ID != b.ID || string(del.Type) != "message_batch_deleted" {
		t.Fatalf("Delete: %+v %v", del, err)
	}
	_, err = slow.Messages.Batches.Get(ctx, b.ID, sdk.MessageBatchGetParams{})
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || string(apiErr.Type()) != anthropic.ErrNotFound {
		t.Errorf("Get after delete: %v", err)
	}
	// Another org's key cannot see solo's batches.
	if _, err := slow.Messages.Batches.Get(ctx, ids[0], sdk.MessageBatchGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("Get of another org's batch: %v", err)
	}
}

// A results stream cut short is an error the SDK reports, not a short
// success.
func TestSDKBatchResultsCut(t *testing.T) {
	t.Parallel()
	run := startSim(t, batchConfig())
	c := sdkClient(run, soloKey)
	ctx := context.Background()
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 300 {
		reqs = append(reqs, sdkBatchRequest(fmt.Sprintf("r%d", i), 256, fmt.Sprintf("Item %d. Provide your evaluation as a JSON object.", i)))
	}
	b, err := c.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	sdkWaitEnded(t, c, b.ID)
	if _, err := run.Server.AddFault(Fault{Kind: FaultBatchResultsCut}); err != nil {
		t.Fatal(err)
	}
	stream := c.Messages.Batches.ResultsStreaming(ctx, b.ID, sdk.MessageBatchResultsParams{})
	n := 0
	for stream.Next() {
		n++
	}
	if stream.Err() == nil || n >= 300 {
		t.Errorf("%d results and err %v: want fewer than 300 and an error", n, stream.Err())
	}
	stream.Close()
}
