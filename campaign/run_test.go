package campaign

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/sim"
)

// Exit codes of 'apidispatch run' (docs/design.md §10, §13).
const (
	exitComplete   = 0
	exitIncomplete = 4
	exitDataLoss   = 5
)

// passTimeout bounds one pass of one process; a pass that runs longer is a
// hang, reported as a violation (the scenarios last seconds).
const passTimeout = 2 * time.Minute

// pass is one invocation of 'apidispatch run' for one process.
type pass struct {
	runDir  string
	code    int  // exit code; -1 killed by a signal
	crashed bool // killed -9 or stopped by a full disk: possible duplicates
	// diskFull: the scenario filled this pass's disk (its writes, the
	// cache file's too, fail past a size).
	diskFull bool
	hung     string // the pass did not end within passTimeout: where its goroutines dump is
	// noRedis: exit 1 because Redis could not be reached at start (a
	// partition or a Redis restart of the scenario): resumed.
	noRedis    bool
	out        string
	cachePass  bool // the second pass of process 0 on the cache
	ledgerFrom int64
	// from and to are when the pass started and was seen to end, since
	// the simulator started.
	from, to time.Duration
}

// proc is one process of a scenario: its items, run directory and passes.
type proc struct {
	i      int
	input  string
	runDir string
	passes []*pass

	mu  sync.Mutex
	cmd *exec.Cmd // the running pass, nil between passes
	// proxy stands between the process and Redis (partitions).
	proxy *proxy
}

// world is one scenario being run.
type world struct {
	t     testing.TB
	sc    Scenario
	dir   string
	sim   *sim.Running
	start time.Time // about the simulator's start (its series' origin)
	redis *testredis.Server
	// redisMu makes Redis outages one at a time: two drawn close together
	// (seed 231: 240 ms apart) ran at once, and the first one's restart
	// found the port taken by the second's.
	redisMu sync.Mutex
	procs   []*proc
	cache   string

	mu      sync.Mutex
	windows []window // exempt from the in-flight check
	// away are the spans during which a process's --cap may be missing
	// from Redis (it was stopped or cut off past its lease, or Redis
	// restarted empty), until it has renewed and the others' requests
	// admitted meanwhile have ended.
	away []absence
	log  []string
}

// absence is a span during which process proc (-1: every process) may not
// hold the key's cap down to its own --cap.
type absence struct {
	proc     int
	from, to time.Duration
}

// window is a span of real time since the simulator started during which
// the in-flight bound is exempt (requests in flight when a process was cut
// off end within their latency: docs/design.md §13, promise 3).
type window struct {
	from, to time.Duration
	why      string
}

// latencyReal bounds the real time a request stays in flight at the
// simulator: 10 API seconds (a judge item's median is 1.5 s; the latency
// model's tail past 10 s is below 1e-4), divided by speed.
func (w *world) latencyReal() time.Duration {
	return time.Duration(float64(10*time.Second) / w.sc.Speed)
}

func (w *world) exempt(at, span time.Duration, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.windows = append(w.windows, window{at, at + span, why})
}

func (w *world) absent(proc int, from time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Back: a renewal (a few per second, a new connection after a
	// partition) and the others' requests in flight ending.
	w.away = append(w.away, absence{proc, from, time.Since(w.start) + 2*time.Second + w.latencyReal()})
}

func (w *world) logf(format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%6.2fs ", time.Since(w.start).Seconds())+fmt.Sprintf(format, a...))
}

// simConfig is the simulator of a scenario.
func simConfig(sc Scenario) sim.Config {
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		panic(err)
	}
	cfg = cfg.WithSeed(sc.Seed)
	cfg.Speed = sc.Speed
	cfg.BillAbandoned = sc.BillAbandoned
	cfg.Faults = sc.Faults
	for i := range cfg.Orgs {
		// Batches start within seconds of API time, so that a batch or
		// auto scenario lasts about as long as a sync one.
		cfg.Orgs[i].Batch.QueueWaitS = 20
		cfg.Orgs[i].Batch.CancelS = 2
	}
	if sc.LowTier {
		lowTierOrgs(&cfg, sc.Burst)
	}
	cfg.Orgs = append(cfg.Orgs, sc.OpenAI.oaOrgs()...)
	return cfg
}

// setup writes the inputs and starts the simulator, Redis and the proxies.
func setup(t testing.TB, sc Scenario) *world {
	w := &world{t: t, sc: sc, dir: t.TempDir()}
	w.cache = filepath.Join(w.dir, "cache.db")
	for i := range sc.Procs {
		p := &proc{i: i, input: filepath.Join(w.dir, fmt.Sprintf("req%d.jsonl", i)), runDir: filepath.Join(w.dir, fmt.Sprintf("run%d", i))}
		f, err := os.Create(p.input)
		if err != nil {
			t.Fatal(err)
		}
		prefix := fmt.Sprintf("p%d_", i)
		if sc.SameIDs {
			prefix = ""
		}
		// The judge prompts depend on the index only: a max_tokens of
		// its own makes every process's bodies distinct.
		err = writeItems(f, sc, i, prefix)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		w.procs = append(w.procs, p)
	}
	if sc.Shared {
		w.redis = testredis.Start(t)
		for _, p := range w.procs {
			p.proxy = startProxy(t, w.redis.Addr)
		}
	}
	w.start = time.Now()
	r, err := sim.Start(simConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w.sim = r
	return w
}

// args is the command line of process p's pass into runDir.
func (w *world) args(p *proc, runDir string) []string {
	sc := w.sc
	c := strconv.Itoa(w.capOf(p.i))
	a := []string{"run", p.input, "--run-dir", runDir, "--base-url", w.sim.URL,
		"--speed", strconv.FormatFloat(sc.Speed, 'f', -1, 64), "--quiet",
		"--cap", "sonnet=" + c + ",haiku=" + c + ",opus=" + c + ",other=" + c +
			",gpt=" + c + ",gpt-mini=" + c + ",o-series=" + c + ",openai-other=" + c,
		"--route", sc.Route, "--give-up-after", "1m", "--grace", "5s"}
	if sc.Deadline > 0 {
		a = append(a, "--deadline", (time.Duration(float64(sc.Deadline) / sc.Speed)).String())
	}
	if sc.Batch > 0 {
		a = append(a, "--batch-size", strconv.Itoa(sc.Batch))
	}
	if sc.MaxCost > 0 {
		a = append(a, "--max-cost", strconv.FormatFloat(sc.MaxCost, 'f', 6, 64))
	}
	if sc.Shared {
		a = append(a, "--shared", "redis://"+p.proxy.addr()+"/0")
	}
	if sc.Fallback {
		a = append(a, "--shared-fallback", "local")
	}
	if sc.Cache {
		a = append(a, "--cache", w.cache)
	}
	if sc.Pilot > 0 {
		a = append(a, "--pilot", strconv.Itoa(sc.Pilot))
	}
	return a
}

// capOf is the --cap of process i: every other process asks for CapStep
// more than the smallest.
func (w *world) capOf(i int) int { return w.sc.Cap + i%2*w.sc.CapStep }

// env is a child's environment: the simulator's keys and none of ours
// (only its OpenAI orgs' keys when the scenario runs on them alone).
func (w *world) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ANTHROPIC_") && !strings.HasPrefix(kv, "OPENAI_") && !strings.HasPrefix(kv, "APIDISPATCH_") {
			env = append(env, kv)
		}
	}
	for _, kv := range w.sim.Server.EnvLines() {
		if !w.sc.OpenAI.Only || strings.HasPrefix(kv, "OPENAI_") {
			env = append(env, kv)
		}
	}
	return env
}

// runPass runs one pass of p into runDir to its end (or passTimeout).
func (w *world) runPass(p *proc, runDir string, cachePass bool) *pass {
	ps := &pass{runDir: runDir, cachePass: cachePass, ledgerFrom: w.sim.Server.LedgerTotals().Requests, from: time.Since(w.start)}
	c := exec.Command(binary, w.args(p, runDir)...)
	c.Env = w.env()
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		w.t.Fatal(err)
	}
	p.mu.Lock()
	p.cmd = c
	p.passes = append(p.passes, ps)
	p.mu.Unlock()
	w.logf("process %d pass %d started (pid %d)", p.i, len(p.passes), c.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(passTimeout):
		// A hang: dump its goroutines (SIGQUIT), then kill it.
		c.Process.Signal(syscall.SIGCONT)
		c.Process.Signal(syscall.SIGQUIT)
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			c.Process.Kill()
			err = <-done
		}
		ps.crashed = true
		ps.hung = filepath.Join(os.TempDir(), fmt.Sprintf("campaign-seed%d-proc%d-pass%d.txt", w.sc.Seed, p.i, len(p.passes)))
		os.WriteFile(ps.hung, out.Bytes(), 0o644)
	}
	p.mu.Lock()
	p.cmd = nil
	ps.to = time.Since(w.start)
	ps.out = out.String()
	ps.code = c.ProcessState.ExitCode()
	ps.noRedis = ps.code == 1 && strings.Contains(ps.out, "shared: Redis is unreachable")
	if err != nil && ps.code == -1 {
		ps.crashed = true
	}
	p.mu.Unlock()
	w.logf("process %d pass %d exited %d", p.i, len(p.passes), ps.code)
	return ps
}

// signal sends sig to p's running pass, if any; it reports whether it did.
func (p *proc) signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return false
	}
	if sig == syscall.SIGKILL && len(p.passes) > 0 {
		p.passes[len(p.passes)-1].crashed = true
	}
	return p.cmd.Process.Signal(sig) == nil
}

// disturb carries out d, whose moment has come.
func (w *world) disturb(d Disturbance) {
	p := w.procs[d.Proc]
	now := time.Since(w.start)
	// A process stopped, killed or cut off from Redis leaves its slots
	// held in Redis for its lease and a grace longer than its longest
	// recent request, so its requests in flight end before another takes
	// their slots, and it sends nothing admitted before on a lease that
	// has ended: no window is exempt. Only Redis restarted empty forgets
	// who holds what, and a process killed without --shared leaves no
	// record of its requests in flight for its resume: requests in flight
	// then end within their latency (the exceptions of promise 3).
	cut := w.latencyReal() + time.Second/2
	switch d.Kind {
	case dStop:
		if !p.signal(syscall.SIGSTOP) {
			return
		}
		w.logf("process %d stopped", p.i)
		time.Sleep(d.For)
		p.signal(syscall.SIGCONT)
		w.logf("process %d continued", p.i)
		w.absent(p.i, now)
	case dKill:
		if !p.signal(syscall.SIGKILL) {
			return
		}
		w.logf("process %d killed", p.i)
		if !w.sc.Shared {
			// Alone and without Redis, the resumed pass cannot know what
			// the dead one had in flight: those requests run on at the
			// server, overlapping the new pass's, within their latency.
			w.exempt(now, cut, fmt.Sprintf("process %d killed (not --shared)", p.i))
		}
	case dDiskFull:
		p.mu.Lock()
		if p.cmd != nil {
			limit := uint64(largestFile(p.passes[len(p.passes)-1].runDir) + 64<<10)
			if setFileLimit(p.cmd.Process.Pid, limit) == nil {
				p.passes[len(p.passes)-1].crashed = true
				p.passes[len(p.passes)-1].diskFull = true
				w.logf("process %d: disk full at %d bytes", p.i, limit)
			}
		}
		p.mu.Unlock()
	case dRedis:
		w.redisMu.Lock()
		defer w.redisMu.Unlock()
		now = time.Since(w.start)
		w.redis.Stop()
		w.logf("redis stopped")
		w.exempt(now, cut, "redis down")
		time.Sleep(d.For)
		w.redis.Restart()
		w.logf("redis restarted empty")
		w.absent(-1, now)
		w.exempt(time.Since(w.start), cut, "redis restarted empty")
	case dPartition:
		p.proxy.cut(true)
		w.logf("process %d partitioned from redis", p.i)
		time.Sleep(d.For)
		p.proxy.cut(false)
		w.logf("process %d partition healed", p.i)
		w.absent(p.i, now)
	}
}

func largestFile(dir string) int64 {
	var largest int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				largest = max(largest, fi.Size())
			}
		}
		return nil
	})
	return largest
}

// maxPasses bounds the clean resumes after the disturbed first pass.
const maxPasses = 5

// execute runs the scenario: the first pass of every process together with
// the disturbances, then clean resumes of every process until it completes
// (or stops at --max-cost), then the cache pass.
func (w *world) execute() {
	var wg sync.WaitGroup
	for _, p := range w.procs {
		wg.Go(func() {
			ps := w.runPass(p, p.runDir, false)
			unreachable := 0 // passes refused at start for want of Redis
			for len(p.passes)-unreachable < maxPasses && ps.code != exitComplete && ps.code != exitDataLoss {
				if ps.noRedis && unreachable < 30 {
					// Redis is cut off by the scenario: wait for it.
					unreachable++
					time.Sleep(500 * time.Millisecond)
				}
				if ps.code == exitIncomplete && !ps.crashed && len(p.passes) > 1 && w.sc.MaxCost > 0 {
					break // stopped at --max-cost: the rest stays pending
				}
				if ps.code != exitIncomplete && !ps.crashed && !ps.noRedis {
					break // an error: reported by the checker
				}
				ps = w.runPass(p, p.runDir, false)
			}
		})
	}
	var dwg sync.WaitGroup
	stop := make(chan struct{})
	for _, d := range w.sc.Disturb {
		dwg.Go(func() {
			select {
			case <-time.After(d.At):
				w.disturb(d)
			case <-stop:
			}
		})
	}
	wg.Wait()
	close(stop)
	dwg.Wait()
	if w.sc.Cache {
		p := w.procs[0]
		if last := p.passes[len(p.passes)-1]; last.code == exitComplete {
			w.runPass(p, p.runDir+"-cache", true)
		}
	}
}

// proxy is a TCP proxy to Redis that can blackhole its connections (a
// network partition: nothing arrives, nothing is refused).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn // forwarded connections, both ends
	holes  []net.Conn // blackholed connections
}

func startProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.cut(true)
		p.cut(false)
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// cut starts (true) or ends (false) the partition. Starting it drops every
// connection silently: their bytes go nowhere.
func (p *proxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
		return
	}
	for _, c := range p.holes {
		c.Close()
	}
	p.holes = nil
}

func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	down := p.down
	if down {
		p.holes = append(p.holes, c)
	} else {
		p.conns = append(p.conns, c)
	}
	p.mu.Unlock()
	if down {
		// Blackholed: read and drop until the client gives up.
		io.Copy(io.Discard, c)
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}
