//go:build long

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/redis/go-redis/v9"
)

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
	t.Parallel()
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
	t.Parallel()
	redisURL := ownRedis(t)
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

// Issue 28: three kill -9s of 'apidispatch serve', each with requests in
// flight that the API bills though nobody reads their answers (the
// simulator bills abandoned requests), then client alice (max_cost $0.02)
// spends until refused. Every reservation in flight used to die with the
// process, so the restarted gateway let her spend that money again: $0.0351
// billed on the $0.02 cap. Each attempt is now journaled before it is sent
// and a restart counts the open ones at their worst case: the bill stays
// within the cap.
func TestServeKillNineWithRequestsInFlightHoldsMaxCost(t *testing.T) {
	t.Parallel()
	const speed = 50
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) { c.BillAbandoned = true })
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	const alice = "sk-gw-crash-alice-0000001"
	clients := filepath.Join(dir, "clients.toml")
	if err := os.WriteFile(clients, []byte("[[client]]\nname = \"alice\"\ntoken = \""+alice+"\"\nmax_cost = 0.02\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--speed", fmt.Sprint(speed), "--clients", clients, "--state-dir", state}
	body := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i))
	}
	inFlight := func() (n int64) {
		for _, o := range run.Server.Stats().Orgs {
			n += o.InFlight
		}
		return n
	}
	item := 0
	const k = 8
	for round := 1; round <= 3; round++ {
		p, base, _ := startServe(t, run, args...)
		// A fresh gateway sends one request per key until it has seen the
		// key's rate-limit headers: a few quick answers first, so that
		// all k go upstream at once.
		for range 6 {
			item++
			if status, b, err := postGW(base, alice, body(item)); err != nil || status != http.StatusOK {
				t.Fatalf("round %d: warm-up %d %s %v", round, status, b, err)
			}
		}
		// Slow answers (150 API s, 3 s here) keep the requests upstream
		// across the kill.
		if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 150 * time.Second, FromNow: true}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range k {
			item++
			b := body(item)
			wg.Go(func() { postGW(base, alice, b) })
		}
		deadline := time.Now().Add(20 * time.Second)
		for inFlight() < k && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if n := inFlight(); n < k {
			t.Fatalf("round %d: %d requests upstream before the kill, want %d", round, n, k)
		}
		p.Signal(syscall.SIGKILL)
		p.Wait()
		wg.Wait()
		run.Server.ClearFaults("slow")
		// The simulator bills the abandoned requests when their answers
		// are done.
		for end := time.Now().Add(30 * time.Second); inFlight() > 0 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		}
	}
	abandoned := run.Server.LedgerTotals() // the warm-ups' and the abandoned requests' bill
	// Alice spends until the restarted gateway refuses her.
	_, base, _ := startServe(t, run, args...)
	spent, refused := 0, false
	for spent < 200 && !refused {
		item++
		status, b, err := postGW(base, alice, body(item))
		switch {
		case err != nil:
			t.Fatal(err)
		case status == http.StatusBadRequest && strings.Contains(string(b), anthropic.SpendLimitMessagePrefix):
			refused = true
		case status != http.StatusOK:
			t.Fatalf("request %d: %d %s", item, status, b)
		default:
			spent++
		}
	}
	billed := run.Server.LedgerTotals()
	t.Logf("3 kills with %d requests in flight each: %d requests billed %v by then; then %d answers until refused (%v): %d requests billed %v on the $0.02 cap",
		k, abandoned.Requests, cost.Nanos(abandoned.CostNanos), spent, refused, billed.Requests, cost.Nanos(billed.CostNanos))
	if abandoned.Requests < 3*k || !refused {
		t.Fatalf("%d abandoned requests billed, refused %v: the test proves nothing", abandoned.Requests, refused)
	}
	if billed.CostNanos > 20_000_000 {
		t.Errorf("the simulator billed %v, past alice's max_cost $0.02", cost.Nanos(billed.CostNanos))
	}
}

// Issue 27: two 'apidispatch serve' on one Redis (--shared) and one
// clients file, alice (max_cost $0.05) spread over both; one of them is
// killed (-9) with her requests in flight, which the API bills though
// nobody reads their answers, and started again: on its state directory,
// or (the outside attack's case) on a new one, with a fresh ledger and a
// new spend id. Her max_cost is one budget across the gateways and across
// the kill: the reservations the dead gateway left open in Redis stay
// counted while it is down; its restart on its own directory settles each
// at its worst case (none is left open), and on another directory nothing
// settles them, so they stay counted. The simulator's bill stays within
// her max_cost, and (restarted on its own directory) within 95 % of it
// once she has spent until refused.
func TestServeSharedMaxCostAcrossGatewaysAndKillNine(t *testing.T) {
	t.Parallel()
	for _, elsewhere := range []bool{false, true} {
		name := "restart_on_its_state_dir"
		if elsewhere {
			name = "restart_on_a_new_state_dir"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sharedMaxCostKillNine(t, elsewhere)
		})
	}
}

func sharedMaxCostKillNine(t *testing.T, elsewhere bool) {
	const speed = 50
	rs := testredis.Start(t)
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) { c.BillAbandoned = true })
	dir := t.TempDir()
	const alice = "sk-gw-shared-alice-000001"
	const capN = cost.Nanos(50_000_000)
	clients := filepath.Join(dir, "clients.toml")
	if err := os.WriteFile(clients, []byte("[[client]]\nname = \"alice\"\ntoken = \""+alice+"\"\nmax_cost = 0.05\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	states := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "a2")}
	start := func(i int) (*os.Process, string) {
		p, base, _ := startServe(t, run, "--speed", fmt.Sprint(speed), "--clients", clients, "--state-dir", states[i], "--shared", rs.URL())
		return p, base
	}
	// max_tokens 64: the simulator's answers run to it, so an answer costs
	// about its worst case and the cap can be spent to within a few.
	body := func(i int64) []byte {
		return fmt.Appendf(nil, `{"model":"claude-haiku-4-5","max_tokens":64,"messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]}`, i)
	}
	inFlight := func() (n int64) {
		for _, o := range run.Server.Stats().Orgs {
			n += o.InFlight
		}
		return n
	}
	pa, baseA := start(0)
	_, baseB := start(1)
	var item atomic.Int64
	// A third of her budget through both gateways.
	for billed := int64(0); billed < int64(capN)/3; billed = run.Server.LedgerTotals().CostNanos {
		for _, base := range []string{baseA, baseB} {
			if status, b, err := postGW(base, alice, body(item.Add(1))); err != nil || status != http.StatusOK {
				t.Fatalf("%d %s %v", status, b, err)
			}
		}
	}
	// Slow answers (150 API s, 3 s here) keep k requests upstream across
	// the kill of gateway a.
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 150 * time.Second, FromNow: true}); err != nil {
		t.Fatal(err)
	}
	const k = 8
	var wg sync.WaitGroup
	for range k {
		b := body(item.Add(1))
		wg.Go(func() { postGW(baseA, alice, b) })
	}
	for end := time.Now().Add(20 * time.Second); inFlight() < k && time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
	}
	if n := inFlight(); n < k {
		t.Fatalf("%d requests upstream before the kill, want %d", n, k)
	}
	pa.Signal(syscall.SIGKILL)
	pa.Wait()
	wg.Wait()
	run.Server.ClearFaults("slow")
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	id, err := os.ReadFile(filepath.Join(states[0], "spend-id"))
	if err != nil {
		t.Fatal(err)
	}
	resKey := "apidispatch:v1:spend:{spend}:res:" + strings.TrimSpace(string(id))
	if n := rdb.HLen(context.Background(), resKey).Val(); n < k {
		t.Errorf("%d reservations of the killed gateway open in Redis, want its %d in flight", n, k)
	}
	for end := time.Now().Add(30 * time.Second); inFlight() > 0 && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
	}
	if elsewhere {
		_, baseA = start(2)
		if n := rdb.HLen(context.Background(), resKey).Val(); n < k {
			t.Errorf("%d reservations of the killed gateway open after a restart elsewhere, want its %d still counted", n, k)
		}
	} else {
		_, baseA = start(0)
		if n := rdb.HLen(context.Background(), resKey).Val(); n != 0 {
			t.Errorf("%d reservations of the killed gateway still open after its restart on its state directory", n)
		}
	}
	// Alice spends until both gateways refuse her.
	var answered, refused atomic.Int64
	var inflight atomic.Int64
	var wg2 sync.WaitGroup
	for range 8 {
		wg2.Go(func() {
			streak := 0
			for {
				i := item.Add(1)
				if i > 3000 {
					t.Errorf("3000 requests and no refusal")
					return
				}
				inflight.Add(1)
				status, b, err := postGW([]string{baseA, baseB}[i%2], alice, body(i))
				alone := inflight.Add(-1) == 0
				switch {
				case err != nil:
					t.Errorf("request %d: %v", i, err)
					return
				case status == http.StatusOK:
					answered.Add(1)
					streak = 0
				case status == http.StatusBadRequest && strings.Contains(string(b), anthropic.SpendLimitMessagePrefix):
					refused.Add(1)
					if alone {
						streak++
					}
					if streak >= 5 {
						return
					}
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("request %d: %d %s", i, status, b)
					return
				}
			}
		})
	}
	wg2.Wait()
	billed := cost.Nanos(run.Server.LedgerTotals().CostNanos)
	t.Logf("2 gateways, one killed with %d requests in flight and restarted (elsewhere: %v): then %d answered, %d refused; the simulator billed %s on alice's max_cost %s (%.3f×)",
		k, elsewhere, answered.Load(), refused.Load(), billed, capN, float64(billed)/float64(capN))
	if refused.Load() == 0 {
		t.Fatal("nothing refused: the test proves nothing")
	}
	if billed > capN {
		t.Errorf("billed %s, past alice's max_cost %s", billed, capN)
	}
	if elsewhere {
		return // the dead gateway's worst cases stay held: no floor
	}
	if billed < capN*95/100 {
		t.Errorf("billed %s, under 95 %% of alice's max_cost %s though her work exceeded it", billed, capN)
	}
	if n := rdb.HLen(context.Background(), resKey).Val(); n != 0 {
		t.Errorf("%d reservations of the restarted gateway left open once idle", n)
	}
}
