package campaign

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/syncbuf"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/sim"
)

var gatewayEveryFlag = flag.Int("gateway-every", 3, "with -seeds, run a gateway scenario for every seed of -first/-seeds divisible by `N` (1: every seed; 0: none); without it, the first 3 seeds (6 with -tags long)")

// gatewayCampaign runs the gateway scenarios of the campaign's seeds (the
// first defaultSeeds; with -seeds those divisible by -gateway-every; or
// -seed alone), two at a time, and
// fails for each seed whose run breaks a promise, printing its scenario,
// its timeline and the command that reruns it alone.
func gatewayCampaign(t *testing.T, defaultSeeds int) {
	if testing.Short() {
		t.Skip("-short: the campaign spawns processes") // CI runs it without -short
	}
	var seeds []int64
	switch {
	case *seedFlag != 0:
		seeds = []int64{*seedFlag}
	case *seedsFlag == 0:
		// The default: the first seeds, each with its gateway scenario.
		for i := range defaultSeeds {
			seeds = append(seeds, *firstFlag+int64(i))
		}
	case *gatewayEveryFlag > 0:
		for i := range *seedsFlag {
			if s := *firstFlag + int64(i); s%int64(*gatewayEveryFlag) == 0 {
				seeds = append(seeds, s)
			}
		}
	}
	runSeeds(t, "gateway seeds", seeds, runGatewaySeed)
}

// runGatewaySeed runs one seed's gateway scenario and checks it.
func runGatewaySeed(t *testing.T, seed int64) {
	sc := drawGateway(seed)
	w := setupGateway(t, sc)
	began := time.Now()
	w.execute()
	reportSeed(t, "TestGatewayCampaign", seed, sc, began, w.log, checkGateway(w))
}

// Bounds of a gateway scenario, in real time.
const (
	// gwClientWindow: the clients stop retrying this long after they
	// started; a well-behaved client's request still unanswered then is a
	// violation (the scenarios' work takes seconds).
	gwClientWindow = 60 * time.Second
	// gwHangAfter: a gateway still running this long after its first
	// SIGTERM/SIGINT is a hang (its drain is 30 s).
	gwHangAfter = 50 * time.Second
	// gwStartTimeout: a gateway not listening this long after its start
	// (or restart attempts) cannot be started.
	gwStartTimeout = 30 * time.Second
	// gwRetryFor is every gateway's --retry-for.
	gwRetryFor = 15 * time.Second
	// gwAttemptTimeoutAPI is a gateway's upstream attempt timeout, in API
	// time (gateway.Config.Timeout's default).
	gwAttemptTimeoutAPI = 10 * time.Minute
)

// gwWorld is one gateway scenario being run.
type gwWorld struct {
	t       testing.TB
	sc      gwScenario
	dir     string
	sim     *sim.Running
	start   time.Time // about the simulator's start (its series' origin)
	redis   *testredis.Server
	gws     []*gwProc
	clients []*gwClientRun
	clFile  string
	// window is how long the clients retry (0: gwClientWindow).
	window time.Duration
	// t0 is when the clients started, since start; deadline when they
	// stop retrying.
	t0       time.Duration
	deadline time.Time
	ending   atomic.Bool // the scenario is over: exited gateways stay down

	mu  sync.Mutex
	log []string
	// silences are the spans a gateway was stopped or cut off from Redis.
	silences []silence
}

// gwProc is one gateway: its address and state directory, and every
// process (incarnation) that served them.
type gwProc struct {
	i        int
	addr     string
	stateDir string
	proxy    *proxy // between it and Redis (--shared)
	// pause makes its stops and partitions one at a time (two drawn close
	// together would otherwise end at the first one's end).
	pause sync.Mutex

	mu   sync.Mutex
	cur  *gwInc // the running incarnation, nil between them
	incs []*gwInc
	// startFailed: the supervisor could not start it within
	// gwStartTimeout (the last output).
	startFailed string
}

// gwInc is one 'apidispatch serve' process of a gateway.
type gwInc struct {
	cmd      *exec.Cmd
	pid      int
	from, to time.Duration // started, and seen to exit, since the simulator started
	served   bool          // it listened
	done     bool          // it exited
	code     int           // exit code; -1 killed by a signal
	out      string
	sigs     []sigAt // signals sent to it
	killed   bool    // SIGKILL
	final    bool    // stopped by the end of the scenario
	hung     string  // still running gwHangAfter after a signal: where its goroutines dump is
	buf      *syncbuf.Buffer
	doneCh   chan struct{}
	waitErr  error
	stopping time.Time // first SIGTERM/SIGINT
}

type sigAt struct {
	sig syscall.Signal
	at  time.Duration
}

func (w *gwWorld) logf(format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%6.2fs ", time.Since(w.start).Seconds())+fmt.Sprintf(format, a...))
}

func (w *gwWorld) since() time.Duration { return time.Since(w.start) }

// latencyReal bounds the real time a request stays in flight at the
// simulator: 15 API seconds (answers of at most 300 tokens), 45 with a
// client asking for long answers (up to 2,400 tokens), plus the largest
// extra latency of a slow fault, over speed.
func (w *gwWorld) latencyReal() time.Duration {
	api := 15 * time.Second
	for _, c := range w.sc.Clients {
		if c.Hostile == hUnread {
			api = 45 * time.Second
		}
	}
	var extra time.Duration
	for _, f := range w.sc.Faults {
		extra = max(extra, f.ExtraLatency)
	}
	return time.Duration(float64(api+extra) / w.sc.Speed)
}

// gwSimConfig is the simulator of a gateway scenario.
func gwSimConfig(sc gwScenario) sim.Config {
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		panic(err)
	}
	cfg = cfg.WithSeed(sc.Seed)
	cfg.Speed = sc.Speed
	cfg.BillAbandoned = sc.BillAbandoned
	cfg.Faults = sc.Faults
	for i := range cfg.Orgs {
		cfg.Orgs[i].Batch.QueueWaitS = 20
		cfg.Orgs[i].Batch.CancelS = 2
	}
	if sc.LowTier {
		lowTierOrgs(&cfg, sc.Burst)
	}
	return cfg
}

// setupGateway writes the clients file and starts the simulator, Redis and
// the proxies; the gateways start in execute.
func setupGateway(t testing.TB, sc gwScenario) *gwWorld {
	w := &gwWorld{t: t, sc: sc, dir: t.TempDir()}
	var cf strings.Builder
	for i, c := range sc.Clients {
		tok := make([]byte, 24)
		rand.Read(tok)
		cr := &gwClientRun{w: w, c: c, idx: i, token: "gw-" + hex.EncodeToString(tok)}
		fmt.Fprintf(&cf, "[[client]]\nname = %q\ntoken = %q\n", c.Name, cr.token)
		if c.MaxCost > 0 {
			fmt.Fprintf(&cf, "max_cost = %s\n", strconv.FormatFloat(c.MaxCost, 'f', 6, 64))
		}
		cr.plan()
		w.clients = append(w.clients, cr)
	}
	w.clFile = filepath.Join(w.dir, "clients.toml")
	if err := os.WriteFile(w.clFile, []byte(cf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if sc.Shared {
		w.redis = testredis.Start(t)
	}
	for i := range sc.Gateways {
		g := &gwProc{i: i, addr: freeAddr(t), stateDir: filepath.Join(w.dir, fmt.Sprintf("gw%d", i))}
		if sc.Shared {
			g.proxy = startProxy(t, w.redis.Addr)
		}
		w.gws = append(w.gws, g)
	}
	w.start = time.Now()
	r, err := sim.Start(gwSimConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w.sim = r
	return w
}

// freeAddr is a loopback address with a port free now; a gateway and each
// of its restarts listen on it.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// args is gateway g's command line.
func (w *gwWorld) args(g *gwProc) []string {
	sc := w.sc
	c := strconv.Itoa(sc.Cap)
	a := []string{"serve", "--listen", g.addr, "--base-url", w.sim.URL,
		"--speed", strconv.FormatFloat(sc.Speed, 'f', -1, 64), "--quiet",
		"--clients", w.clFile, "--state-dir", g.stateDir,
		"--cap", "sonnet=" + c + ",haiku=" + c + ",opus=" + c + ",other=" + c,
		"--retry-for", gwRetryFor.String()}
	if sc.MaxCost > 0 {
		a = append(a, "--max-cost", strconv.FormatFloat(sc.MaxCost, 'f', 6, 64))
	}
	if sc.Shared {
		a = append(a, "--shared", "redis://"+g.proxy.addr()+"/0")
	}
	return a
}

// env is a gateway's environment: the simulator's keys and none of ours.
func (w *gwWorld) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") && !strings.HasPrefix(kv, "APIDISPATCH_") {
			env = append(env, kv)
		}
	}
	return append(env, w.sim.Server.EnvLines()...)
}

// launch starts one process of g and waits until it listens or exits.
func (w *gwWorld) launch(g *gwProc) *gwInc {
	inc := &gwInc{buf: &syncbuf.Buffer{}, doneCh: make(chan struct{}), from: w.since()}
	c := exec.Command(binary, w.args(g)...)
	c.Env = w.env()
	c.Stdout, c.Stderr = inc.buf, inc.buf
	if err := c.Start(); err != nil {
		w.t.Fatal(err)
	}
	inc.cmd, inc.pid = c, c.Process.Pid
	go func() {
		inc.waitErr = c.Wait()
		close(inc.doneCh)
	}()
	g.mu.Lock()
	g.cur = inc
	g.incs = append(g.incs, inc)
	g.mu.Unlock()
	for giveUp := time.Now().Add(gwStartTimeout); ; {
		select {
		case <-inc.doneCh:
			return inc
		case <-time.After(20 * time.Millisecond):
		}
		// It prints the base URL once it listens. (A dial could reach
		// another process that took the port meanwhile.)
		if strings.Contains(inc.buf.String(), "ANTHROPIC_BASE_URL=") {
			g.mu.Lock()
			inc.served = true
			g.mu.Unlock()
			return inc
		}
		if time.Now().After(giveUp) {
			// Neither listening nor gone: killed, and counted as a
			// start that failed.
			c.Process.Kill()
			<-inc.doneCh
			return inc
		}
	}
}

// supervise keeps gateway g running until the scenario ends: it starts a
// process, waits for its exit (dumping and killing it when it hangs after a
// signal) and starts the next, as a supervisor (systemd's Restart=always)
// would. ready is closed once the first process listens.
func (w *gwWorld) supervise(g *gwProc, ready chan<- struct{}) {
	readyOnce := sync.OnceFunc(func() { close(ready) })
	defer readyOnce()
	var failingSince time.Time
	for !w.ending.Load() {
		inc := w.launch(g)
		if inc.served {
			failingSince = time.Time{}
			readyOnce()
			w.logf("gateway %d started (pid %d)", g.i, inc.pid)
		}
		w.await(g, inc)
		if !inc.served && strings.Contains(inc.out, "address already in use") && !g.everServed() {
			// Another process took the port freeAddr found between its
			// check and this start: the gateway takes another before its
			// clients know it.
			g.addr = freeAddr(w.t)
			w.logf("gateway %d: its port was taken before it started; now %s", g.i, g.addr)
			continue
		}
		if !inc.served {
			// Exited before it listened (Redis cut off at start, say).
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > gwStartTimeout {
				g.mu.Lock()
				g.startFailed = inc.out
				g.mu.Unlock()
				w.logf("gateway %d: cannot be started", g.i)
				return
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// await waits for inc to exit; a process still running gwHangAfter after
// its first SIGTERM/SIGINT has its goroutines dumped and is killed.
func (w *gwWorld) await(g *gwProc, inc *gwInc) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-inc.doneCh:
			done = true
		case <-tick.C:
			g.mu.Lock()
			hung := !inc.stopping.IsZero() && time.Since(inc.stopping) > gwHangAfter && inc.hung == ""
			if hung {
				inc.hung = filepath.Join(os.TempDir(), fmt.Sprintf("campaign-gw-seed%d-gateway%d-pid%d.txt", w.sc.Seed, g.i, inc.pid))
				inc.cmd.Process.Signal(syscall.SIGCONT)
				inc.cmd.Process.Signal(syscall.SIGQUIT)
			}
			g.mu.Unlock()
			if hung {
				select {
				case <-inc.doneCh:
				case <-time.After(10 * time.Second):
					inc.cmd.Process.Kill()
					<-inc.doneCh
				}
				done = true
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	inc.done = true
	inc.to = w.since()
	inc.out = inc.buf.String()
	inc.code = inc.cmd.ProcessState.ExitCode()
	if inc.hung != "" {
		os.WriteFile(inc.hung, []byte(inc.out), 0o644)
	}
	if g.cur == inc {
		g.cur = nil
	}
	if inc.served {
		w.logf("gateway %d (pid %d) exited %d", g.i, inc.pid, inc.code)
	}
}

// signal sends sig to g's running process, if it listens; it returns the
// process, or nil.
func (g *gwProc) signal(w *gwWorld, sig syscall.Signal) *gwInc {
	g.mu.Lock()
	defer g.mu.Unlock()
	inc := g.cur
	if inc == nil || !inc.served || inc.cmd.Process.Signal(sig) != nil {
		return nil
	}
	inc.sigs = append(inc.sigs, sigAt{sig, w.since()})
	switch sig {
	case syscall.SIGKILL:
		inc.killed = true
	case syscall.SIGTERM, syscall.SIGINT:
		if inc.stopping.IsZero() {
			inc.stopping = time.Now()
		}
	}
	return inc
}

// stopFinal sends SIGTERM to g's running process once it listens, unless
// it was sent already, and marks it stopped by the scenario's end.
func (g *gwProc) stopFinal(w *gwWorld) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inc := g.cur
	if inc == nil || !inc.served || inc.final || inc.done {
		return
	}
	inc.final = true
	if inc.cmd.Process.Signal(syscall.SIGTERM) == nil {
		inc.sigs = append(inc.sigs, sigAt{syscall.SIGTERM, w.since()})
		if inc.stopping.IsZero() {
			inc.stopping = time.Now()
		}
	}
}

// disturb carries out d, whose moment has come.
func (w *gwWorld) disturb(d gwDisturbance) {
	g := w.gws[d.Gateway]
	switch d.Kind {
	case gTerm:
		if g.signal(w, syscall.SIGTERM) != nil {
			w.logf("gateway %d: SIGTERM", g.i)
		}
	case gTwice:
		inc := g.signal(w, syscall.SIGTERM)
		if inc == nil {
			return
		}
		w.logf("gateway %d: SIGTERM (first of two)", g.i)
		time.Sleep(d.For)
		g.mu.Lock()
		same := g.cur == inc
		g.mu.Unlock()
		if same && g.signal(w, syscall.SIGINT) != nil {
			w.logf("gateway %d: SIGINT (second signal)", g.i)
		}
	case gKill:
		if g.signal(w, syscall.SIGKILL) != nil {
			w.logf("gateway %d: kill -9", g.i)
		}
	case gStop:
		g.pause.Lock()
		defer g.pause.Unlock()
		from := w.since()
		inc := g.signal(w, syscall.SIGSTOP)
		if inc == nil {
			return
		}
		w.logf("gateway %d: SIGSTOP", g.i)
		time.Sleep(d.For)
		defer w.silent(g.i, from)
		g.mu.Lock()
		if inc.cmd.Process.Signal(syscall.SIGCONT) == nil {
			inc.sigs = append(inc.sigs, sigAt{syscall.SIGCONT, w.since()})
		}
		g.mu.Unlock()
		w.logf("gateway %d: SIGCONT", g.i)
	case gPartition:
		g.pause.Lock()
		defer g.pause.Unlock()
		from := w.since()
		g.proxy.cut(true)
		w.logf("gateway %d partitioned from redis", g.i)
		time.Sleep(d.For)
		g.proxy.cut(false)
		w.logf("gateway %d partition healed", g.i)
		w.silent(g.i, from)
	}
}

// execute runs the scenario: the gateways, then the clients and the
// disturbances together; when the well-behaved clients are done (or
// their window has passed) the hostile ones stop, every gateway is stopped
// with SIGTERM, and the simulator's requests in flight are let end.
func (w *gwWorld) execute() {
	var sup sync.WaitGroup
	for _, g := range w.gws {
		ready := make(chan struct{})
		sup.Go(func() { w.supervise(g, ready) })
		<-ready
	}
	w.t0 = w.since()
	window := w.window
	if window == 0 {
		window = gwClientWindow
	}
	w.deadline = time.Now().Add(window)
	hostileCtx, stopHostile := context.WithCancel(context.Background())
	var good, hostile sync.WaitGroup
	for _, c := range w.clients {
		if c.c.Hostile != "" {
			hostile.Go(func() { c.runHostile(hostileCtx) })
		} else {
			good.Go(c.run)
		}
	}
	var dist sync.WaitGroup
	for _, d := range w.sc.Disturb {
		dist.Go(func() {
			time.Sleep(d.At)
			w.disturb(d)
		})
	}
	good.Wait()
	w.logf("the well-behaved clients are done")
	dist.Wait()
	stopHostile()
	hostile.Wait()
	w.ending.Store(true)
	// Stop every gateway with SIGTERM, the one a supervisor may have been
	// starting at this moment too.
	supDone := make(chan struct{})
	go func() {
		sup.Wait()
		close(supDone)
	}()
	for stopped := false; !stopped; {
		for _, g := range w.gws {
			g.stopFinal(w)
		}
		select {
		case <-supDone:
			stopped = true
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Requests a gateway left at the simulator end within their latency.
	for end := time.Now().Add(w.latencyReal() + 500*time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var n int64
		for _, o := range w.sim.Server.Stats().Orgs {
			n += o.InFlight
		}
		if n == 0 {
			break
		}
	}
}

// --- clients -----------------------------------------------------------

// gwReq is one Messages (or count_tokens) request of a client, with every
// send of it and how it ended.
type gwReq struct {
	k       int
	kind    string // sync, stream, count, unread
	gateway int
	body    []byte
	hash    sim.BodyHash // the simulator's hash of it (without "stream")
	header  [][2]string

	sends   int // sends written whole to a gateway
	tries   int
	noReply int    // sends that got no HTTP answer
	outcome string // success, cap, terminal, unanswered
	status  int    // the last answer's status (0: none)
	errType string // the last answer's error type
	msgID   string
	last    string // the last answer, for the report
	first   time.Duration
	end     time.Duration
}

// gwItem is one request of a client's batch.
type gwItem struct {
	id     string
	params []byte
	hash   sim.BodyHash
}

// gwBatch is one Message Batch of a client.
type gwBatch struct {
	j       int
	gateway int
	route   string
	items   []gwItem
	body    []byte

	creates int // creates written whole
	id      string
	outcome string // ended, cap, terminal, unanswered
	lost404 int    // retrieves of the acknowledged batch answered 404
	results map[string][]gwResult
	last    string
	first   time.Duration
	end     time.Duration
}

type gwResult struct {
	typ   string
	msgID string
}

// gwClientRun is one client while the scenario runs.
type gwClientRun struct {
	w     *gwWorld
	c     gwClient
	idx   int
	token string
	hc    *http.Client

	reqs    []*gwReq
	batches []*gwBatch
	// dribbles: when each dribbler was cut by the gateway (0: never).
	mu       sync.Mutex
	dribbles []time.Duration
}

// plan builds the client's requests: every body carries a marker of its
// own (the seed, the client, the request) in metadata.user_id and in the
// prompt, so the simulator's ledger (by body hash) names its request.
func (c *gwClientRun) plan() {
	sc := c.w.sc
	r := mrand.New(mrand.NewPCG(uint64(sc.Seed), uint64(c.idx)+0xc11e47))
	gw := func(k int) int {
		if c.c.Gateway >= 0 {
			return c.c.Gateway
		}
		return k % sc.Gateways
	}
	for k := range c.c.Requests {
		marker := fmt.Sprintf("gw%d-%s-%d", sc.Seed, c.c.Name, k)
		model, geo := "claude-sonnet-4-5", ""
		if c.c.Geo {
			model, geo = "claude-sonnet-4-6", `,"inference_geo":"us"`
		}
		prompt := "Write a short note about " + marker + "."
		if c.c.Hostile == hUnread {
			prompt = "Write at length about " + marker + "."
		}
		q := &gwReq{k: k, kind: "sync", gateway: gw(k)}
		body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"metadata":{"user_id":%q}%s,"messages":[{"role":"user","content":%q}]}`,
			model, c.c.MaxToks, marker, geo, prompt)
		q.hash = sim.BodyHash(sha256.Sum256([]byte(body)))
		switch {
		case c.c.Hostile == hUnread:
			q.kind = "unread"
		case c.c.Hostile == hBeta && c.c.Count:
			q.kind = "count"
			body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt)
		case c.c.Hostile == "" && r.Float64() < c.c.Stream:
			q.kind = "stream"
		}
		if c.c.Hostile == hBeta {
			q.header = append(q.header, [2]string{"anthropic-beta", forbiddenBeta})
		}
		if q.kind == "stream" || q.kind == "unread" {
			// The simulator hashes a stream request without its "stream"
			// member: the same request unstreamed.
			body = body[:len(body)-1] + `,"stream":true}`
		}
		q.body = []byte(body)
		c.reqs = append(c.reqs, q)
	}
	for j := range c.c.Batches {
		b := &gwBatch{j: j, gateway: gw(j), route: c.c.Route}
		var items []string
		for k := range c.c.BatchSize {
			marker := fmt.Sprintf("gw%d-%s-b%d-%d", sc.Seed, c.c.Name, j, k)
			p := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":%d,"metadata":{"user_id":%q},"messages":[{"role":"user","content":%q}]}`,
				c.c.MaxToks, marker, "Write a short note about "+marker+".")
			it := gwItem{id: fmt.Sprintf("r%d", k), params: []byte(p), hash: sim.BodyHash(sha256.Sum256([]byte(p)))}
			b.items = append(b.items, it)
			items = append(items, fmt.Sprintf(`{"custom_id":%q,"params":%s}`, it.id, p))
		}
		b.body = []byte(`{"requests":[` + strings.Join(items, ",") + `]}`)
		c.batches = append(c.batches, b)
	}
	c.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
}

// answer is what one send got.
type answer struct {
	written atomic.Bool // the request went out whole
	status  int         // 0: no HTTP answer
	header  http.Header
	body    []byte
	err     error
	// A stream's: its message id, whether it reached message_stop, and
	// the type of its error event, if any.
	streamID string
	stopped  bool
	errEvent string
}

// send sends one request to gateway g and reads its whole answer.
func (c *gwClientRun) send(g int, method, path string, body []byte, header [][2]string, stream bool) *answer {
	a := &answer{}
	ctx, cancel := context.WithDeadline(context.Background(), c.w.deadline.Add(5*time.Second))
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			a.written.Store(true)
		}
	}})
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.w.gws[g].addr+path, rd)
	if err != nil {
		c.w.t.Fatal(err)
	}
	req.Header.Set("x-api-key", c.token)
	req.Header.Set("anthropic-version", anthropic.APIVersion)
	if body != nil {
		req.Header.Set("content-type", "application/json")
	}
	for _, h := range header {
		req.Header.Add(h[0], h[1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	if stream && resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
		a.err = readStream(resp.Body, a)
		return a
	}
	a.body, a.err = io.ReadAll(resp.Body)
	return a
}

// readStream reads a Messages stream to its end.
func readStream(r io.Reader, a *answer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			event = ""
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data := []byte(strings.TrimSpace(line[5:]))
			switch event {
			case "message_start":
				var v struct {
					Message struct {
						ID string `json:"id"`
					} `json:"message"`
				}
				if json.Unmarshal(data, &v) == nil {
					a.streamID = v.Message.ID
				}
			case "message_stop":
				a.stopped = true
			case "error":
				var e anthropic.ErrorEnvelope
				json.Unmarshal(data, &e)
				a.errEvent = e.Error.Type
				if a.errEvent == "" {
					a.errEvent = "error"
				}
			}
		}
	}
	return sc.Err()
}

// retryable reports whether an SDK retries the answer (docs/design.md §17:
// a connection error, x-should-retry, or 408, 409, 429
// and 5xx), and how long it waits first (retry-after-ms, retry-after, else
// a back-off, scaled down for the scenario: min(0.25 s·2^n, 2 s) less up
// to a quarter).
func retryable(a *answer, n int) (bool, time.Duration) {
	back := time.Duration(math.Min(0.25*math.Pow(2, float64(n)), 2) * (1 - 0.25*mrand.Float64()) * float64(time.Second))
	if a.status == 0 {
		return true, back
	}
	retry := a.status == 408 || a.status == 409 || a.status == 429 || a.status >= 500
	switch a.header.Get("x-should-retry") {
	case "true":
		retry = true
	case "false":
		retry = false
	}
	if !retry {
		return false, 0
	}
	if v, err := strconv.ParseFloat(a.header.Get("retry-after-ms"), 64); err == nil && v > 0 && v <= 60000 {
		return true, time.Duration(v * float64(time.Millisecond))
	}
	if v, err := strconv.ParseFloat(a.header.Get("retry-after"), 64); err == nil && v > 0 && v <= 60 {
		return true, time.Duration(v * float64(time.Second))
	}
	return true, back
}

// capRefusal reports whether a is the gateway refusing a request for a
// spend cap (a client's max_cost or the gateway's --max-cost).
func capRefusal(a *answer) bool {
	if a.status != http.StatusBadRequest {
		return false
	}
	var e anthropic.ErrorEnvelope
	return json.Unmarshal(a.body, &e) == nil && strings.HasPrefix(e.Error.Message, anthropic.SpendLimitMessagePrefix)
}

func describe(a *answer) string {
	if a.status == 0 {
		return fmt.Sprintf("no answer (%v)", a.err)
	}
	s := fmt.Sprintf("%d", a.status)
	if a.errEvent != "" {
		s += " stream error event " + a.errEvent
	}
	if len(a.body) > 0 {
		s += " " + strings.TrimSpace(string(a.body[:min(len(a.body), 200)]))
	}
	return s
}

// run is a well-behaved client: its requests Conc at once, its batches one
// after the other beside them.
func (c *gwClientRun) run() {
	var wg sync.WaitGroup
	next := make(chan *gwReq)
	start := time.Now()
	for range max(1, c.c.Conc) {
		wg.Go(func() {
			for q := range next {
				time.Sleep(time.Until(start.Add(c.c.Span * time.Duration(q.k) / time.Duration(len(c.reqs)))))
				c.do(q, 0)
			}
		})
	}
	wg.Go(func() {
		time.Sleep(c.c.Span / 3)
		for _, b := range c.batches {
			c.doBatch(b)
		}
	})
	for _, q := range c.reqs {
		next <- q
	}
	close(next)
	wg.Wait()
}

// do sends q until it has a final answer, retrying as an SDK does (up to
// maxAnswers HTTP answers, a gateway's answers, not connection errors while
// it restarts; 0: until the client's window ends).
func (c *gwClientRun) do(q *gwReq, maxAnswers int) {
	q.first = c.w.since()
	defer func() { q.end = c.w.since() }()
	path := "/v1/messages"
	if q.kind == "count" {
		path = "/v1/messages/count_tokens"
	}
	for n := 0; ; n++ {
		if time.Now().After(c.w.deadline) || (maxAnswers > 0 && q.tries-q.noReply >= maxAnswers) {
			switch {
			case q.tries == 0:
				q.outcome = "never sent in the window"
			case q.outcome == "" || q.outcome == "retrying":
				q.outcome = "unanswered"
			}
			return
		}
		a := c.send(q.gateway, http.MethodPost, path, q.body, q.header, q.kind == "stream")
		q.tries++
		if a.written.Load() {
			q.sends++
		}
		if a.status == 0 {
			q.noReply++
		}
		q.status, q.last = a.status, describe(a)
		q.errType = ""
		if a.status != http.StatusOK {
			var e anthropic.ErrorEnvelope
			if json.Unmarshal(a.body, &e) == nil {
				q.errType = e.Error.Type
			}
		}
		switch {
		case a.status == http.StatusOK && q.kind == "stream":
			if a.stopped && a.err == nil {
				q.outcome, q.msgID = "success", a.streamID
				return
			}
			// Cut, or an error event: a script retries it.
			q.outcome = "retrying"
		case a.status == http.StatusOK && a.err == nil:
			var m struct {
				ID          string `json:"id"`
				InputTokens *int64 `json:"input_tokens"`
			}
			if json.Unmarshal(a.body, &m) == nil && (m.ID != "" || (q.kind == "count" && m.InputTokens != nil)) {
				q.outcome, q.msgID = "success", m.ID
				return
			}
			q.outcome = "retrying"
		case capRefusal(a):
			q.outcome = "cap"
			return
		}
		retry, wait := retryable(a, n)
		if a.status == http.StatusOK {
			retry, wait = true, 100*time.Millisecond
		}
		if !retry {
			q.outcome = "terminal"
			return
		}
		q.outcome = "retrying"
		time.Sleep(wait)
	}
}

// doBatch creates b, polls it until it ends and reads its results,
// retrying what is retryable until the client's window ends.
func (c *gwClientRun) doBatch(b *gwBatch) {
	b.first = c.w.since()
	defer func() { b.end = c.w.since() }()
	hdr := [][2]string{{"x-apidispatch-route", b.route}}
	if b.route == "auto" {
		hdr = append(hdr, [2]string{"x-apidispatch-deadline", "20s"})
	}
	for n := 0; b.id == ""; n++ {
		if time.Now().After(c.w.deadline) {
			b.outcome = "unanswered"
			return
		}
		a := c.send(b.gateway, http.MethodPost, "/v1/messages/batches", b.body, hdr, false)
		if a.written.Load() {
			b.creates++
		}
		b.last = describe(a)
		if a.status == http.StatusOK {
			var v struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(a.body, &v) == nil && v.ID != "" {
				b.id = v.ID
				c.w.logf("client %s: batch %d created as %s", c.c.Name, b.j, b.id)
				break
			}
		}
		if capRefusal(a) {
			b.outcome = "cap"
			return
		}
		retry, wait := retryable(a, n)
		if !retry {
			b.outcome = "terminal"
			return
		}
		time.Sleep(wait)
	}
	// Poll until it ends.
	for {
		if time.Now().After(c.w.deadline) {
			b.outcome = "unanswered"
			return
		}
		time.Sleep(250 * time.Millisecond)
		a := c.send(b.gateway, http.MethodGet, "/v1/messages/batches/"+b.id, nil, nil, false)
		b.last = describe(a)
		if a.status == http.StatusNotFound {
			b.lost404++
		}
		var v struct {
			Status string `json:"processing_status"`
		}
		if a.status == http.StatusOK && json.Unmarshal(a.body, &v) == nil && v.Status == "ended" {
			break
		}
	}
	for {
		if time.Now().After(c.w.deadline) {
			b.outcome = "unanswered"
			return
		}
		a := c.send(b.gateway, http.MethodGet, "/v1/messages/batches/"+b.id+"/results", nil, nil, false)
		b.last = describe(a)
		if a.status == http.StatusOK && a.err == nil {
			res, err := parseResults(a.body)
			if err == nil {
				b.results, b.outcome = res, "ended"
				return
			}
			b.last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func parseResults(body []byte) (map[string][]gwResult, error) {
	out := map[string][]gwResult{}
	for line := range bytes.SplitSeq(bytes.TrimSpace(body), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type    string `json:"type"`
				Message struct {
					ID string `json:"id"`
				} `json:"message"`
			} `json:"result"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("results line %q: %v", line, err)
		}
		out[r.CustomID] = append(out[r.CustomID], gwResult{r.Result.Type, r.Result.Message.ID})
	}
	return out, nil
}

// runHostile is a hostile client, until ctx ends (the well-behaved ones
// are done).
func (c *gwClientRun) runHostile(ctx context.Context) {
	var wg sync.WaitGroup
	switch c.c.Hostile {
	case hBeta:
		// A script with the SDK's default of two retries.
		for _, q := range c.reqs {
			c.do(q, 3)
		}
		return
	case hUnread:
		for _, q := range c.reqs {
			wg.Go(func() { c.unread(ctx, q) })
		}
	case hDribble:
		c.dribbles = make([]time.Duration, c.c.Requests)
		for i := range c.c.Requests {
			wg.Go(func() { c.dribble(ctx, i) })
		}
	}
	wg.Wait()
}

// dialSmall connects to gateway g with a receive buffer as small as the
// kernel allows, so that an answer not read fills it at once.
func (c *gwClientRun) dialSmall(g int) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
		})
		return errors.Join(err, serr)
	}}
	return d.Dial("tcp", c.w.gws[g].addr)
}

// rawRequest is an HTTP/1.1 request's head for path with the client's
// token and a body of n bytes.
func (c *gwClientRun) rawRequest(g int, path string, n int) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nanthropic-version: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n",
		path, c.w.gws[g].addr, c.token, anthropic.APIVersion, n)
}

// unread opens q's stream and never reads a byte of it; it hangs up when
// ctx ends.
func (c *gwClientRun) unread(ctx context.Context, q *gwReq) {
	q.first = c.w.since()
	q.tries = 1
	for time.Now().Before(c.w.deadline) {
		conn, err := c.dialSmall(q.gateway)
		if err != nil {
			// The gateway is restarting: try again.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
				continue
			}
		}
		if _, err := io.WriteString(conn, c.rawRequest(q.gateway, "/v1/messages", len(q.body))+string(q.body)); err == nil {
			q.sends++
		}
		<-ctx.Done()
		conn.Close()
		q.outcome, q.end = "hung up", c.w.since()
		return
	}
}

// dribble sends a Messages request's head and then its body one byte
// every 200 ms, never the last byte, until ctx ends or the gateway cuts
// it; dribbles[i] says when the gateway cut it (0: never).
func (c *gwClientRun) dribble(ctx context.Context, i int) {
	g := c.c.Gateway
	body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"dribble %d %s"}]}`, i, strings.Repeat("x", 4096))
	var conn net.Conn
	for conn == nil {
		var err error
		if conn, err = c.dialSmall(g); err == nil {
			if _, err = io.WriteString(conn, c.rawRequest(g, "/v1/messages", len(body))); err != nil {
				conn.Close()
				conn = nil
			}
		}
		if conn == nil {
			// The gateway is restarting: try again.
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	defer conn.Close()
	from := c.w.since()
	for k := 0; k < len(body)-1; k++ {
		select {
		case <-ctx.Done():
			c.w.logf("dribbler %s/%d still connected after %s", c.c.Name, i, (c.w.since() - from).Round(time.Second))
			return
		case <-time.After(200 * time.Millisecond):
		}
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte{body[k]}); err != nil {
			c.mu.Lock()
			c.dribbles[i] = c.w.since()
			c.mu.Unlock()
			c.w.logf("dribbler %s/%d cut by the gateway after %s", c.c.Name, i, (c.w.since() - from).Round(100*time.Millisecond))
			return
		}
	}
}

// everServed reports whether a process of g has listened.
func (g *gwProc) everServed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, inc := range g.incs {
		if inc.served {
			return true
		}
	}
	return false
}

// silence is a span of real time (since the simulator started) during
// which gateway gw was stopped or cut off from Redis.
type silence struct {
	gw       int
	from, to time.Duration
}

// silent records that gateway gw was silent from from until now.
func (w *gwWorld) silent(gw int, from time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.silences = append(w.silences, silence{gw, from, w.since()})
}
