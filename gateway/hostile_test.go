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
	"time"

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

// Hostile input on every route answers the API's error and sends nothing
// upstream: not one request reaches the simulator (counted in front of it,
// so any path counts, authenticated or not). Beyond
// TestHostileInputSendsNothingUpstream: a wrong token on every route, a
// body over the limit without a Content-Length (chunked), malformed JSON
// on count_tokens and batches, and a model id that would steer the org's
// key to another endpoint.
func TestHostileInputOnEveryRouteReachesNoUpstream(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	up, reached := countingUpstream(t, run)
	_, srv := startGW(t, run, func(c *Config) {
		c.BaseURL = up
		// The 256 MB body is sent and read in this one process: under
		// -race on a loaded machine, slower than the body deadline's
		// pace of a second a MB. The deadline has tests of its own.
		c.BodyTimeout = 10 * time.Minute
	})
	good := `{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	batch := `{"requests":[{"custom_id":"a","params":` + good + `}]}`
	wrong := map[string]string{"x-api-key": "sk-gw-wrong-token-000000000"}
	a := map[string]string{"x-api-key": tokA}
	var calls []hostileCall
	for _, r := range [][2]string{
		{"POST", "/v1/messages"}, {"POST", "/v1/messages/count_tokens"}, {"GET", "/v1/models"},
		{"GET", "/v1/models/claude-sonnet-4-5"}, {"POST", "/v1/messages/batches"}, {"GET", "/v1/messages/batches"},
		{"GET", "/v1/messages/batches/msgbatch_x"}, {"POST", "/v1/messages/batches/msgbatch_x/cancel"},
		{"DELETE", "/v1/messages/batches/msgbatch_x"}, {"GET", "/v1/messages/batches/msgbatch_x/results"},
		{"GET", "/apidispatch/status"}, {"GET", "/v1/complete"},
	} {
		body := good
		if strings.HasSuffix(r[1], "batches") {
			body = batch
		}
		calls = append(calls, hostileCall{name: "wrong token " + r[0] + " " + r[1], method: r[0], path: r[1], body: strings.NewReader(body), hdr: wrong})
	}
	type want struct {
		status int
		typ    string
	}
	wants := map[string]want{}
	for _, c := range calls {
		wants[c.name] = want{401, "authentication_error"}
	}
	add := func(c hostileCall, status int, typ string) {
		calls = append(calls, c)
		wants[c.name] = want{status, typ}
	}
	over := func(n int) io.Reader { return io.LimitReader(zeroes{}, int64(n)) }
	add(hostileCall{name: "messages over 32 MB chunked", method: "POST", path: "/v1/messages", body: over(MaxMessagesBytes + 1), length: -1, hdr: a}, 413, "request_too_large")
	add(hostileCall{name: "count_tokens over 32 MB", method: "POST", path: "/v1/messages/count_tokens", body: over(MaxMessagesBytes + 1), hdr: a}, 413, "request_too_large")
	add(hostileCall{name: "batch over 256 MB chunked", method: "POST", path: "/v1/messages/batches", body: over(MaxBatchBytes + 1), length: -1, hdr: a}, 413, "request_too_large")
	add(hostileCall{name: "stream malformed", method: "POST", path: "/v1/messages", body: strings.NewReader(`{"stream":true,"model":`), hdr: a}, 400, "invalid_request_error")
	add(hostileCall{name: "count_tokens no model", method: "POST", path: "/v1/messages/count_tokens", body: strings.NewReader(`{"messages":[]}`), hdr: a}, 400, "invalid_request_error")
	add(hostileCall{name: "batch requests not a list", method: "POST", path: "/v1/messages/batches", body: strings.NewReader(`{"requests":{"custom_id":"a"}}`), hdr: a}, 400, "invalid_request_error")
	add(hostileCall{name: "batch params not an object", method: "POST", path: "/v1/messages/batches", body: strings.NewReader(`{"requests":[{"custom_id":"a","params":"x"}]}`), hdr: a}, 400, "invalid_request_error")
	add(hostileCall{name: "batch no requests", method: "POST", path: "/v1/messages/batches", body: strings.NewReader(`{"requests":[]}`), hdr: a}, 400, "invalid_request_error")
	for _, id := range []string{"..%2Fmessages%2Fbatches", "%2E%2E%2F%2E%2E%2Fsim%2Fstats", "x%3Flimit%3D1", ".."} {
		add(hostileCall{name: "model id " + id, method: "GET", path: "/v1/models/" + id, hdr: a}, 404, "not_found_error")
	}
	for _, c := range calls {
		status, body := c.do(t, srv.URL)
		w := wants[c.name]
		if status != w.status || !strings.HasPrefix(body, `{"type":"error","error":{"type":"`+w.typ+`"`) {
			t.Errorf("%s: %d %.200s, want %d %s", c.name, status, body, w.status, w.typ)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d requests reached the simulator", n)
	}
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
		case "client", "clients", "queued", "lanes", "orgs_out_of_rotation", "batches":
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
