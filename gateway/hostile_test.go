package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// countingUpstream serves run's simulator through a handler that counts
// every request it receives, whatever its path and whether or not the
// simulator would authenticate it.
func countingUpstream(t *testing.T, run *sim.Running) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		run.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

type hostileCall struct {
	name, method, path string
	body               io.Reader
	length             int64 // -1: chunked, no Content-Length
	hdr                map[string]string
}

func (c hostileCall) do(t *testing.T, base string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, c.body)
	if err != nil {
		t.Fatal(err)
	}
	if c.length != 0 {
		req.ContentLength = c.length
	}
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// zeroes is an endless body of '0' bytes, copied a block at a time (a
// byte at a time, the race detector slowed the 256 MB body below the
// gateway's body rate on a loaded machine).
type zeroes struct{}

var zeroBlock = []byte(strings.Repeat("0", 64<<10))

func (zeroes) Read(p []byte) (int, error) {
	for n := 0; n < len(p); {
		n += copy(p[n:], zeroBlock)
	}
	return len(p), nil
}

// Another client's batch, by every route that names it (retrieve, its
// results_url as its owner was given it, cancel, delete, list cursors), is
// the API's 404 (400 for a cursor): nothing of it is shown, nothing of it
// changes, and nothing is sent upstream. A client's /apidispatch/status
// shows its own spend and batches only, none of another client's nor the
// gateway's totals.
func TestAnotherClientsBatchShowsNothingSendsNothing(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1000, nil)
	up, reached := countingUpstream(t, run)
	g, srv := startGW(t, run, func(c *Config) { c.BaseURL = up })
	ca := sdkClient(srv.URL, tokA)
	ctx := context.Background()
	var reqs []sdk.MessageBatchNewParamsRequest
	for i := range 3 {
		reqs = append(reqs, batchReq("secret-item-"+string(rune('a'+i)), i))
	}
	b, err := ca.Messages.Batches.New(ctx, sdk.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	ended := waitEnded(t, &ca, b.ID)
	if ended.ResultsURL == "" || ended.RequestCounts.Succeeded != 3 {
		t.Fatalf("a's batch: %s", ended.RawJSON())
	}
	// Client a's sync request, so that a has spend by org to hide.
	if _, err := ca.Messages.New(ctx, judgeParams(1)); err != nil {
		t.Fatal(err)
	}
	before := reached.Load()

	bTok := map[string]string{"x-api-key": tokB}
	for _, c := range []struct {
		call   hostileCall
		status int
		typ    string
	}{
		{hostileCall{name: "retrieve", method: "GET", path: "/v1/messages/batches/" + b.ID, hdr: bTok}, 404, "not_found_error"},
		{hostileCall{name: "results_url", method: "GET", path: strings.TrimPrefix(ended.ResultsURL, srv.URL), hdr: bTok}, 404, "not_found_error"},
		{hostileCall{name: "results_url bearer", method: "GET", path: strings.TrimPrefix(ended.ResultsURL, srv.URL), hdr: map[string]string{"Authorization": "Bearer " + tokB}}, 404, "not_found_error"},
		{hostileCall{name: "cancel", method: "POST", path: "/v1/messages/batches/" + b.ID + "/cancel", hdr: bTok}, 404, "not_found_error"},
		{hostileCall{name: "delete", method: "DELETE", path: "/v1/messages/batches/" + b.ID, hdr: bTok}, 404, "not_found_error"},
		{hostileCall{name: "list after_id", method: "GET", path: "/v1/messages/batches?after_id=" + b.ID, hdr: bTok}, 400, "invalid_request_error"},
		{hostileCall{name: "list before_id", method: "GET", path: "/v1/messages/batches?before_id=" + b.ID, hdr: bTok}, 400, "invalid_request_error"},
	} {
		status, body := c.call.do(t, srv.URL)
		if status != c.status || !strings.HasPrefix(body, `{"type":"error","error":{"type":"`+c.typ+`"`) || strings.Contains(body, "secret-item") {
			t.Errorf("client b %s of a's batch: %d %.300s, want %d %s", c.call.name, status, body, c.status, c.typ)
		}
	}
	status, body := hostileCall{name: "list", method: "GET", path: "/v1/messages/batches", hdr: bTok}.do(t, srv.URL)
	if status != 200 || strings.Contains(body, b.ID) {
		t.Errorf("client b lists: %d %.300s", status, body)
	}
	// b's status: its own (empty) spend and batches; nothing of a's, no totals.
	status, body = hostileCall{name: "status", method: "GET", path: "/apidispatch/status", hdr: bTok}.do(t, srv.URL)
	var st ClientView
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &st); status != 200 || err != nil || json.Unmarshal([]byte(body), &fields) != nil {
		t.Fatalf("b's status: %d %v %.300s", status, err, body)
	}
	for k := range fields {
		switch k {
		case "client", "clients", "queued", "queues", "lanes", "orgs_out_of_rotation", "batches": // queues: its own rows only
		default:
			t.Errorf("client b's status has %q", k)
		}
	}
	if st.Client != "b" || len(st.Clients) != 1 || st.Clients[0].Client != "b" || st.Clients[0].SpentUSD != 0 ||
		len(st.Batches) != 0 || strings.Contains(body, `"a"`) {
		t.Errorf("client b's status shows another client's: %s", body)
	}
	if n := reached.Load() - before; n != 0 {
		t.Errorf("client b's requests sent %d requests upstream", n)
	}
	// a's batch is as it was: not canceled, not deleted, its results whole.
	again, err := ca.Messages.Batches.Get(ctx, b.ID, sdk.MessageBatchGetParams{})
	if err != nil || again.RequestCounts.Succeeded != 3 || !again.CancelInitiatedAt.IsZero() {
		t.Errorf("a's batch after b: %v %v", again, err)
	}
	rs := ca.Messages.Batches.ResultsStreaming(ctx, b.ID, sdk.MessageBatchResultsParams{})
	n := 0
	for rs.Next() {
		n++
	}
	if rs.Err() != nil || n != 3 {
		t.Errorf("a's results after b: %d, %v", n, rs.Err())
	}
	// a's own status shows its spend, by org too, and its batch.
	status, body = hostileCall{name: "status", method: "GET", path: "/apidispatch/status", hdr: map[string]string{"x-api-key": tokA}}.do(t, srv.URL)
	if err := json.Unmarshal([]byte(body), &st); status != 200 || err != nil || len(st.Clients) != 1 || st.Clients[0].SpentUSD <= 0 ||
		st.Clients[0].ByOrg[OrgGatewayBatches] <= 0 || len(st.Clients[0].ByOrg) != 2 || st.Batches[statusEnded] != 1 {
		t.Errorf("a's status: %d %v %s", status, err, body)
	}
	// The whole gateway's status (apidispatch status --gateway) has both.
	if full := g.Status(); len(full.Clients) != 2 || full.Total.SpentUSD != full.Clients[0].SpentUSD+full.Clients[1].SpentUSD {
		t.Errorf("gateway status: %+v", full)
	}
}
