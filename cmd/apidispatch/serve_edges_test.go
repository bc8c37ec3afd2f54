//go:build unix

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/syncbuf"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/sim"
)

// serveProc is one 'apidispatch serve' child process.
type serveProc struct {
	cmd         *exec.Cmd
	base, token string
	stderr      *syncbuf.Buffer
	exited      chan struct{}
	exitedAt    time.Time
}

// startServeProc starts 'apidispatch serve' on run with args (and env
// added to the child's environment); its stderr is kept.
func startServeProc(t *testing.T, run *sim.Running, env []string, args ...string) *serveProc {
	t.Helper()
	c := cliCmd(run, append([]string{"serve", "--listen", "127.0.0.1:0", "--base-url", run.URL}, args...)...)
	c.Env = append(c.Env, env...)
	p := &serveProc{cmd: c, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	c.Stderr = p.stderr
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for (p.base == "" || p.token == "") && sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "ANTHROPIC_BASE_URL":
			p.base = v
		case "ANTHROPIC_API_KEY":
			p.token = v
		}
	}
	go func() {
		io.Copy(io.Discard, out)
		c.Wait()
		p.exitedAt = time.Now()
		close(p.exited)
	}()
	if p.base == "" || p.token == "" {
		c.Process.Kill()
		t.Fatalf("serve printed no environment lines: %s", p.stderr)
	}
	t.Cleanup(func() {
		c.Process.Kill()
		<-p.exited
	})
	return p
}

// waitExit waits up to d for the process to exit and returns when it did.
func (p *serveProc) waitExit(t *testing.T, d time.Duration) (time.Time, bool) {
	t.Helper()
	select {
	case <-p.exited:
		return p.exitedAt, true
	case <-time.After(d):
		return time.Time{}, false
	}
}

// gwReply is one client's answer: the status (0: no HTTP answer) and body.
type gwReply struct {
	status int
	body   string
	err    error
	at     time.Time
}

func gwPost(base, token string, body []byte) gwReply {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return gwReply{err: err, at: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return gwReply{status: resp.StatusCode, body: string(b), err: err, at: time.Now()}
}

// upstreamSent is how many requests reached the simulator: those it
// answered and those it is working on.
func upstreamSent(run *sim.Running) (n int64) {
	for _, o := range run.Server.Stats().Orgs {
		n += o.Requests + o.InFlight
	}
	return n
}

func ledgerSum(t *testing.T, path string) (sum int64, abandoned int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var e gateway.Entry
		if len(l) == 0 {
			continue
		}
		if err := json.Unmarshal(l, &e); err != nil {
			t.Fatalf("ledger line %s: %v", l, err)
		}
		sum += int64(e.Cost)
		if e.Abandoned {
			abandoned++
		}
	}
	return sum, abandoned
}

func queuedOf(base, token string) int {
	req, _ := http.NewRequest(http.MethodGet, base+"/apidispatch/status", nil)
	req.Header.Set("x-api-key", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var v gateway.ClientView
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return -1
	}
	return v.Queued
}

// The signal case, from outside: 15 requests on 3 slots (one per
// key), the upstream 20 s slow (the simulator bills what is abandoned);
// SIGTERM at 3 s, SIGTERM again at 5 s. The first signal sends nothing
// more upstream and answers the 12 queued clients at once with the API's
// retryable 529; the second cuts the 3 in flight (a stream ends with the
// API's error event, a plain request gets a 529), records them at their
// worst case as abandoned, and the gateway exits within 3 s of it. Every
// client has an HTTP answer, and the ledger holds at least what the
// simulator billed. It used to ignore the second signal, send 3 queued
// requests upstream 19 s after the first, cut them at its exit 30 s after
// it, leave 12 clients without an answer and the ledger 3 short.
func TestServeSignalsAnswerEveryClientAndExit(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 1, func(c *sim.Config) { c.BillAbandoned = true })
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	p := startServeProc(t, run, nil, "--quiet", "--cap", "sonnet=1", "--token-file", filepath.Join(dir, "token"), "--state-dir", state)
	body := func(i int, stream bool) []byte {
		return fmt.Appendf(nil, `{"model":"claude-sonnet-4-5","max_tokens":512,"stream":%v,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, stream, i)
	}
	// First every key answers once, so the gateway knows each one's
	// organisation (until then a key is capped as if it shared one with
	// the others: one request in flight over the three).
	warm := int64(0)
	for answered := 0; answered < 3; {
		if warm == 12 {
			t.Fatalf("12 warm-up requests reached %d of the 3 keys", answered)
		}
		if r := gwPost(p.base, p.token, body(100+int(warm), false)); r.status != 200 {
			t.Fatalf("warm-up request: %d %.200s", r.status, r.body)
		}
		warm++
		answered = 0
		for _, o := range run.Server.Stats().Orgs {
			if o.Completions > 0 {
				answered++
			}
		}
	}
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	replies := make([]gwReply, 15)
	var wg sync.WaitGroup
	for i := range 3 { // in flight: two streams and a plain request
		wg.Go(func() { replies[i] = gwPost(p.base, p.token, body(i, i < 2)) })
	}
	for end := time.Now().Add(10 * time.Second); upstreamSent(run) < warm+3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("3 requests never reached the upstream: %d", upstreamSent(run)-warm)
		}
	}
	for i := 3; i < 15; i++ { // queued behind them
		wg.Go(func() { replies[i] = gwPost(p.base, p.token, body(i, false)) })
	}
	for end := time.Now().Add(10 * time.Second); queuedOf(p.base, p.token) < 12; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("12 requests never queued: %d", queuedOf(p.base, p.token))
		}
	}
	time.Sleep(time.Until(t0.Add(3 * time.Second)))
	sentBefore := upstreamSent(run)
	first := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(time.Until(t0.Add(5 * time.Second)))
	second := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	exitAt, ok := p.waitExit(t, 40*time.Second)
	if !ok {
		t.Fatalf("still running 40 s after the second signal")
	}
	wg.Wait()
	t.Logf("exit %.2f s after the second signal", exitAt.Sub(second).Seconds())
	if d := exitAt.Sub(second); d > 3*time.Second {
		t.Errorf("exited %.2f s after the second signal, want ≤ 3 s", d.Seconds())
	}
	if sent := upstreamSent(run) - sentBefore; sent != 0 {
		t.Errorf("%d requests sent upstream after the first signal", sent)
	}
	for i, r := range replies {
		switch {
		case r.status == 0:
			t.Errorf("client %d: no HTTP answer: %v", i, r.err)
		case i >= 3 && (r.status != 529 || !strings.Contains(r.body, `"overloaded_error"`) || r.at.Sub(first) > time.Second):
			t.Errorf("queued client %d: %d after %.2f s: %.200s; want the API's 529 at once", i, r.status, r.at.Sub(first).Seconds(), r.body)
		case i < 3 && r.status == 200 && !strings.Contains(r.body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\""):
			t.Errorf("stream %d cut at exit: no error event at its end: ...%s", i, r.body[max(0, len(r.body)-300):])
		case i < 3 && r.status != 200 && (r.status != 529 || !strings.Contains(r.body, `"overloaded_error"`)):
			t.Errorf("request %d cut at exit: %d %.200s; want the API's 529", i, r.status, r.body)
		}
	}
	// The simulator bills the three it was sent when they end upstream.
	for end := time.Now().Add(30 * time.Second); run.Server.LedgerTotals().Requests < warm+3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the simulator billed %d of the 3 requests it was sent", run.Server.LedgerTotals().Requests-warm)
		}
	}
	billed := run.Server.LedgerTotals()
	sum, abandoned := ledgerSum(t, filepath.Join(state, "ledger.jsonl"))
	t.Logf("ledger $%.6f (%d abandoned), simulator billed $%.6f for %d requests", float64(sum)/1e9, abandoned, float64(billed.CostNanos)/1e9, billed.Requests)
	if sum < billed.CostNanos || abandoned != 3 {
		t.Errorf("ledger %d n$ with %d abandoned; the simulator billed %d n$ for %d requests", sum, abandoned, billed.CostNanos, billed.Requests)
	}
	st, err := gateway.ReadStatus(state)
	if err != nil || !st.Stopped || st.Abandoned != 3 || st.Total.Abandoned != 3 {
		t.Errorf("status after exit: stopped %v, abandoned %d (ledger %d): %v", st.Stopped, st.Abandoned, st.Total.Abandoned, err)
	}
}

// Two gateways sharing the cap of 4 per key (--shared); one gets SIGTERM
// while it has work, then a second signal that cuts what it has in flight
// (the simulator finishing and billing what was cut). The slots of the
// requests cut are not handed back while they may still run upstream:
// they come back with the lease and its grace, as after a kill -9. At no
// instant are more than 4 requests in flight on a key. It used to hand
// its slots back at its exit while the requests it cut still ran: 6 on 4.
func TestServeSharedSignalKeepsTheCap(t *testing.T) {
	redisURL := cmdRedis(t)
	const k = 10
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, k, func(c *sim.Config) { c.BillAbandoned = true })
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 25 * time.Second}); err != nil { // 2.5 s real
		t.Fatal(err)
	}
	dir := t.TempDir()
	var gws []*serveProc
	for i := range 2 {
		gws = append(gws, startServeProc(t, run, nil, "--quiet", "--speed", fmt.Sprint(k), "--cap", "sonnet=4", "--shared", redisURL,
			"--token-file", filepath.Join(dir, fmt.Sprint("token", i)), "--state-dir", filepath.Join(dir, fmt.Sprint("state", i))))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var answered, cut atomic.Int64
	for i, gw := range gws {
		for c := range 16 {
			wg.Go(func() {
				for n := 0; !stop.Load(); n++ {
					r := gwPost(gw.base, gw.token, fmt.Appendf(nil, `{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Gateway %d client %d item %d. Provide your evaluation as a JSON object."}]}`, i, c, n))
					switch {
					case r.status == 200:
						answered.Add(1)
					case r.status == 0 && i == 0:
						return // gateway 0 is gone
					default:
						cut.Add(1)
						time.Sleep(50 * time.Millisecond)
					}
				}
			})
		}
	}
	time.Sleep(7 * time.Second) // two rounds of answers: the grace follows them
	gws[0].cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(time.Second)
	second := time.Now()
	gws[0].cmd.Process.Signal(syscall.SIGTERM)
	exitAt, ok := gws[0].waitExit(t, 40*time.Second)
	if !ok {
		t.Fatal("gateway 0 still running 40 s after its second signal")
	}
	if d := exitAt.Sub(second); d > 3*time.Second {
		t.Errorf("gateway 0 exited %.2f s after its second signal, want ≤ 3 s", d.Seconds())
	}
	if _, abandoned := ledgerSum(t, filepath.Join(dir, "state0", "ledger.jsonl")); abandoned == 0 {
		t.Error("the second signal cut nothing: the test proves nothing")
	}
	time.Sleep(8 * time.Second) // gateway 1 takes the whole cap back
	stop.Store(true)
	wg.Wait()
	t.Logf("%d answered, %d refused or cut", answered.Load(), cut.Load())
	for _, o := range run.Server.Stats().Orgs {
		t.Logf("org %s: max in flight %d (cap 4)", o.Name, o.MaxInFlight)
		if o.MaxInFlight > 4 {
			t.Errorf("org %s: %d in flight at once on a cap of 4", o.Name, o.MaxInFlight)
		}
	}
}

// 20,000 idle connections that send nothing (the flood; here as
// many as this process's file limit allows) against a gateway whose own
// file limit is 2,048: the gateway keeps its connections under its limit,
// with headroom, by closing the oldest idle ones, so the others' p99 stays
// within 2× of what it was and status.json is still written. It used to
// run out of file descriptors: accepts failed and were retried with
// back-off (others waited ~20 s) and status.json writes failed with
// EMFILE.
func TestServeIdleConnectionFloodHarmsNoOne(t *testing.T) {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Max < 30000 { // root may raise it; elsewhere use what there is
		raised := syscall.Rlimit{Cur: 30000, Max: 30000}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	flood := min(20000, int(lim.Cur)-1000)
	if flood < 4000 {
		t.Fatalf("a file limit of %d leaves room for only %d connections: not a flood", lim.Cur, flood)
	}
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 30 * time.Second}); err != nil { // 0.3 s real
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	p := startServeProc(t, run, []string{envTestNoFile + "=2048"}, "--speed", "100", "--token-file", filepath.Join(dir, "token"), "--state-dir", state)
	others := func() time.Duration {
		var lat []time.Duration
		for i := range 20 {
			t0 := time.Now()
			r := gwPost(p.base, p.token, fmt.Appendf(nil, `{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i))
			lat = append(lat, time.Since(t0))
			if r.status != 200 {
				t.Errorf("another client's request %d: %d %v %.200s", i, r.status, r.err, r.body)
			}
		}
		slices.Sort(lat)
		return lat[len(lat)-1]
	}
	before := others()
	addr := strings.TrimPrefix(p.base, "http://")
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next, failed atomic.Int64
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(flood) {
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	t.Logf("%d idle connections opened in %.1f s (%d dials failed)", len(conns), time.Since(start).Seconds(), failed.Load())
	during := others()
	t.Logf("others' p99: %v before, %v with the flood", before, during)
	if during > 2*before {
		t.Errorf("others' p99 %v with %d idle connections, over 2× the %v before", during, len(conns), before)
	}
	time.Sleep(2 * gateway.StatusEvery)
	st, err := gateway.ReadStatus(state)
	if err != nil || time.Since(st.At) > 3*gateway.StatusEvery {
		t.Errorf("status.json last written %v ago: %v", time.Since(st.At), err)
	}
	if s := p.stderr.String(); strings.Contains(s, "too many open files") || strings.Contains(s, "status file") {
		t.Errorf("the gateway ran out of file descriptors:\n%.2000s", s)
	}
}

// envTestNoFile, set in a child's environment, is the file limit that
// child (this test binary run as the command) sets on itself before it
// runs: a gateway with a small file limit, the test's own left as it is.
const envTestNoFile = "APIDISPATCH_TEST_NOFILE"

func init() {
	if v := os.Getenv(envTestNoFile); v != "" && os.Getenv("APIDISPATCH_AS_CLI") == "1" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			panic(envTestNoFile + ": " + err.Error())
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
			panic(err)
		}
	}
}

// cmdRedis is the test Redis for this package's tests: database 1 of the
// shared test server, emptied first. The simulator's keys are the same in
// every test, so a lane state left by an earlier test must not linger.
func cmdRedis(t *testing.T) string {
	t.Helper()
	return testredis.EmptyDB(t, 1)
}
