package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// TestUpstreamRedirectSendsNoKeyElsewhere: an upstream base URL that
// redirects to another host gets the gateway's requests (sync, streaming,
// models, a gateway batch), and the other host gets none of them, so no
// upstream key leaves: the gateway's client and its batch runner refuse
// every redirect (package apihttp). Before, the gateway's default client
// followed a 307 and sent x-api-key to the redirect's target.
func TestUpstreamRedirectSendsNoKeyElsewhere(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, nil)
	var elsewhere, keyed atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		if r.Header.Get("x-api-key") != "" || r.Header.Get("Authorization") != "" {
			keyed.Add(1)
		}
		http.Error(w, "not the API", http.StatusNotFound)
	}))
	defer other.Close()
	var redirected, batchCreates atomic.Int64
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		redirected.Add(1)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/messages/batches" {
			batchCreates.Add(1)
		}
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	g, srv := startGW(t, run, func(c *Config) { c.BaseURL = redirector.URL; c.RetryFor = 2 * time.Second })
	c := sdkClient(srv.URL, tokA)
	ctx := context.Background()
	if _, err := c.Messages.New(ctx, judgeParams(1)); err == nil {
		t.Error("a sync request answered through a redirecting base URL")
	}
	st := c.Messages.NewStreaming(ctx, judgeParams(2))
	for st.Next() {
	}
	if st.Err() == nil {
		t.Error("a stream answered through a redirecting base URL")
	}
	c.Models.List(ctx, sdk.ModelListParams{})
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 3 {
		reqs = append(reqs, batchReq(fmt.Sprintf("x-%d", i), i))
	}
	if _, err := c.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: reqs}); err != nil {
		t.Fatal(err)
	}
	// Give the batch's runner time to try the upstream.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && batchCreates.Load() == 0; {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if redirected.Load() < 3 || batchCreates.Load() == 0 {
		t.Errorf("the redirecting base URL saw %d requests, %d batch creates: want the gateway's and its batch runner's", redirected.Load(), batchCreates.Load())
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests, %d with a key", n, keyed.Load())
	}
	_ = g
}
