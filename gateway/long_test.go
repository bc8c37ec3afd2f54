//go:build long

package gateway

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// checkPolite asserts the simulator never saw more than the cap in flight
// on a key, and that every org took part.
func checkPolite(t *testing.T, run *sim.Running) {
	t.Helper()
	capN := int64(dispatch.DefaultCaps["sonnet"])
	for _, o := range run.Server.Stats().Orgs {
		if o.MaxInFlight > capN {
			t.Errorf("org %s: %d in flight, cap %d", o.Name, o.MaxInFlight, capN)
		}
		if o.Completions == 0 {
			t.Errorf("org %s unused", o.Name)
		}
		t.Logf("org %s: %d completions, max in flight %d (cap %d), %d 429s absorbed by the gateway", o.Name, o.Completions, o.MaxInFlight, capN, o.RateLimited429)
	}
}

// 3,000 requests at concurrency 500 from one client: all 200, never above
// the cap in flight on a key, every org used.
func TestLoad3000AtConcurrency500(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	_, srv := startGW(t, run, nil)
	if f := loadThrough(t, srv.URL, 3000, 500); f != 0 {
		t.Errorf("%d requests failed", f)
	}
	checkPolite(t, run)
}

// The same under a 429 storm on every org shorter than --retry-for: the
// client still sees no 429. The storm (300 API seconds, 3 s here) begins
// once the simulator has billed the load's first request, so it strikes
// the load however slowly a loaded machine starts it (begun with the test,
// it was over before the load came, and no 429 was sent).
func TestLoadThroughA429Storm(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	_, srv := startGW(t, run, nil)
	stop := make(chan struct{})
	added := make(chan error, 1)
	go func() {
		for run.Server.Mark() == 0 {
			select {
			case <-stop:
				added <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		_, err := run.Server.AddFault(sim.Fault{ID: "storm", Kind: sim.FaultRateLimitStorm, FromNow: true, Duration: 300 * time.Second, RetryAfter: 5 * time.Second})
		added <- err
	}()
	f := loadThrough(t, srv.URL, 3000, 500)
	close(stop)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if f != 0 {
		t.Errorf("%d requests failed", f)
	}
	var s429 int64
	for _, o := range run.Server.Stats().Orgs {
		s429 += o.RateLimited429
	}
	if s429 == 0 {
		t.Error("the storm sent no 429: the test proves nothing")
	}
	checkPolite(t, run)
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
