//go:build unix

package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// mockUpstream serves run's simulator behind hook: a request hook answers
// (it returns true) never reaches the simulator. This is the small mock
// of our own the simulator has no fault for: an org's permission refused
// for one beta, a stream of several megabytes.
func mockUpstream(t *testing.T, run *sim.Running, hook func(w http.ResponseWriter, r *http.Request, body []byte) bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !hook(w, r, body) {
			run.Server.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

const forbiddenBeta = "forbidden-beta-2099-01-01"

func writePermissionError(w http.ResponseWriter, msg string) {
	w.Header().Set("content-type", "application/json")
	w.Header().Set("request-id", "req_mock_403")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, `{"type":"error","error":{"type":"permission_error","message":%q}}`, msg)
}

// A client's request that the upstream refuses with 403 because of what
// the client chose (a beta its orgs may not use) is the client's answer,
// not the org's fault: bob gets the API's 403, every org and every lane
// stays in rotation, and alice is served as before. It used to take every
// org out (count_tokens) or the Sonnet pool on every org (messages), and
// bob got 503. The probe that tells the two apart carries no beta. A key
// the upstream refuses whatever is asked still leaves the rotation.
func TestForbiddenBetaLeavesEveryOrgInRotation(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	refused := run.Server.Orgs()[2].Key.Reveal()
	var mu sync.Mutex
	var betaFree int // requests without the forbidden beta that reached the mock
	up := mockUpstream(t, run, func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		beta := strings.Join(r.Header.Values("anthropic-beta"), ",")
		if !strings.Contains(beta, forbiddenBeta) {
			mu.Lock()
			betaFree++
			mu.Unlock()
		}
		switch {
		case r.Header.Get("x-api-key") == refused:
			writePermissionError(w, "This API key does not have permission to use this resource.")
			return true
		case strings.Contains(beta, forbiddenBeta):
			writePermissionError(w, "Your organization does not have access to "+forbiddenBeta+".")
			return true
		}
		return false
	})
	g, srv := startGW(t, run, func(c *Config) { c.BaseURL = up })
	bobBeta := []string{"anthropic-beta", forbiddenBeta}
	for _, c := range []struct {
		name, path string
		body       []byte
	}{
		{"count_tokens", "/v1/messages/count_tokens", judgeBody(1, "")},
		{"messages", "/v1/messages", judgeBody(2, "")},
		{"stream", "/v1/messages", judgeBody(3, `,"stream":true`)},
	} {
		for range 3 { // every org, whichever the round robin picks
			a := postTo(t, srv.URL+c.path, tokB, c.body, bobBeta...)
			if a.status != http.StatusForbidden || !strings.Contains(string(a.body), `"type":"permission_error"`) || !strings.Contains(string(a.body), forbiddenBeta) {
				t.Errorf("bob's %s with a forbidden beta: %d %s, want the API's 403", c.name, a.status, a.body)
			}
		}
	}
	st := g.Status()
	if len(st.Orgs) > 1 || (len(st.Orgs) == 1 && st.Orgs[run.Server.Orgs()[2].Name] == "") {
		t.Errorf("orgs out of rotation after bob's betas: %v", st.Orgs)
	}
	for _, l := range st.Lanes {
		if l.Disabled != "" && l.Org != run.Server.Orgs()[2].Name {
			t.Errorf("lane %s/%s out of rotation after bob's betas: %s", l.Org, l.Pool, l.Disabled)
		}
	}
	// Alice is served by every org but the refused one, which has left.
	for i := range 6 {
		a := postTo(t, srv.URL+"/v1/messages", tokA, judgeBody(10+i, ""))
		if a.status != 200 || a.header.Get(headerOrg) == run.Server.Orgs()[2].Name {
			t.Fatalf("alice's request %d: %d org %s %s", i, a.status, a.header.Get(headerOrg), a.body)
		}
		if a := postTo(t, srv.URL+"/v1/messages/count_tokens", tokA, judgeBody(i, "")); a.status != 200 {
			t.Fatalf("alice's count_tokens %d: %d %s", i, a.status, a.body)
		}
	}
	if r := g.Status().Orgs[run.Server.Orgs()[2].Name]; r == "" {
		t.Errorf("the org whose key is refused is still in rotation: %v", g.Status().Orgs)
	}
	mu.Lock()
	defer mu.Unlock()
	if betaFree == 0 {
		t.Error("no request without the beta reached the upstream: nothing probed the keys")
	}
}

// postTo posts body to url with the client token tok and header's
// name-value pairs, and returns the whole answer.
func postTo(t *testing.T, url, tok string, body []byte, header ...string) gwAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	req.Header.Set("x-api-key", tok)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return gwAnswer{resp.StatusCode, resp.Header, b}
}

// hugeStream answers a streaming request with a valid Messages stream of
// about size bytes, at once.
func hugeStream(w http.ResponseWriter, size int) {
	w.Header().Set("content-type", "text/event-stream")
	w.Header().Set("request-id", "req_mock_huge")
	w.WriteHeader(200)
	bw := bufio.NewWriterSize(w, 64<<10)
	ev := func(name, data string) { fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", name, data) }
	ev("message_start", `{"type":"message_start","message":{"id":"msg_mock","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":1}}}`)
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	chunk := strings.Repeat("lorem ipsum ", 80)
	n := 0
	for written := 0; written < size; written += len(chunk) + 100 {
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+chunk+`"}}`)
		n++
	}
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, min(n, 200)))
	ev("message_stop", `{"type":"message_stop"}`)
	bw.Flush()
}

// unreadRequest sends a raw request on a connection with a small receive
// buffer and never reads the answer.
func unreadRequest(t *testing.T, base, tok string, body []byte) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/messages HTTP/1.1\r\nHost: gw\r\nx-api-key: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s", tok, len(body), body)
	return conn
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

// A client that sends its request body a byte at a time is cut at the
// body deadline, with the API's 408 timeout_error (which the SDKs retry);
// it used to hold its connection (and a goroutine) for as long as it
// liked. The others are served meanwhile.
func TestBodyDribblerIsCutAtTheDeadline(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, func(c *Config) { c.BodyTimeout = time.Second })
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := judgeBody(1, "")
	fmt.Fprintf(conn, "POST /v1/messages HTTP/1.1\r\nHost: gw\r\nx-api-key: %s\r\ncontent-length: %d\r\n\r\n", tokA, len(body))
	closed := make(chan time.Duration, 1)
	var answer []byte
	t0 := time.Now()
	go func() {
		answer, _ = io.ReadAll(conn) // until the gateway answers and closes
		closed <- time.Since(t0)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case d := <-closed:
			if d < 900*time.Millisecond || d > 5*time.Second || !bytes.HasPrefix(answer, []byte("HTTP/1.1 408 ")) || !bytes.Contains(answer, []byte(`"timeout_error"`)) {
				t.Errorf("the dribbler was cut after %v with %q, want the API's 408 at the 1 s deadline", d, answer)
			}
			if a := postMessage(t, srv.URL, tokA, judgeBody(2, "")); a.status != 200 {
				t.Errorf("another client: %d %s", a.status, a.body)
			}
			return
		case <-tick.C:
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("a body dribbler still connected after %v", time.Since(t0))
			}
			conn.Write(body[i%len(body) : i%len(body)+1])
		}
	}
}

// A big body sent steadily is read whole however long it takes beyond the
// body timeout: each MB received buys a second more. 4 MB at 1.6 MB/s
// with a body timeout of 1 s is answered (the upstream's 400 for so long a
// prompt), not cut.
func TestSteadyBigBodyOutlastsTheBodyTimeout(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	_, srv := startGW(t, run, func(c *Config) { c.BodyTimeout = time.Second })
	body := judgeBody(1, `,"metadata":{"user_id":"`+strings.Repeat("x", 4<<20)+`"}`)
	pr, pw := io.Pipe()
	go func() {
		for b := body; len(b) > 0; b = b[min(len(b), 64<<10):] {
			pw.Write(b[:min(len(b), 64<<10)])
			time.Sleep(40 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages/count_tokens", pr)
	req.ContentLength = int64(len(body))
	req.Header.Set("x-api-key", tokA)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(t0), err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusRequestTimeout || time.Since(t0) < 2*time.Second {
		t.Errorf("a steady 4 MB body over %v: %d %.200s", time.Since(t0), resp.StatusCode, b)
	}
}

// An answer that takes longer than the write timeout to come from
// upstream is still written: the timeout bounds each write to the client,
// not the request.
func TestSlowAnswerOutlastsTheWriteTimeout(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 200 * time.Second}); err != nil { // 2 s real
		t.Fatal(err)
	}
	_, srv := startGW(t, run, func(c *Config) { c.WriteTimeout = time.Second })
	for _, extra := range []string{"", `,"stream":true`} {
		for i := range 2 { // the second on a kept-alive connection
			a := postTo(t, srv.URL+"/v1/messages", tokA, judgeBody(i, extra))
			if a.status != 200 || extra != "" && !bytes.Contains(a.body, []byte("event: message_stop")) {
				t.Errorf("a 2 s answer with a 1 s write timeout (%q, %d): %d %.200s", extra, i, a.status, a.body)
			}
		}
	}
}

// A client that hangs up in the middle of its stream: the stream is still
// read to its end upstream, priced in the ledger as abandoned, counted,
// and its lane released (the stream now reaches its client from a queue;
// this held before and must keep holding).
func TestClientGoneMidStreamBilledCountedReleased(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 200 * time.Second}); err != nil { // 2 s real
		t.Fatal(err)
	}
	g, srv := startGW(t, run, nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", bytes.NewReader(judgeBody(1, `,"stream":true`)))
	req.Header.Set("x-api-key", tokA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	resp.Body.Close() // gone, after the first event's first line
	if err != nil || !strings.HasPrefix(line, "event: message_start") {
		t.Fatalf("first line %q %v", line, err)
	}
	for end := time.Now().Add(20 * time.Second); run.Server.LedgerTotals().Requests == 0 || g.Status().Abandoned == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 20 s: %d billed upstream, %d abandoned", run.Server.LedgerTotals().Requests, g.Status().Abandoned)
		}
	}
	waitIdle(t, g)
	g.Ledger().Flush()
	if _, tot := g.Ledger().Totals(); tot.Requests != 1 || tot.Abandoned != 1 || tot.SpentUSD <= 0 {
		t.Errorf("ledger %+v, want the stream priced as abandoned", tot)
	}
}
