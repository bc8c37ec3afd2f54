package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// TestRedirectedBaseURLSendsNoKey is issue 20's case 3, from outside: a
// base URL answering 307 to another loopback host. Every command that
// sends a key (run by both routes, probe) fails naming that host, and no
// request with a key reaches it (Go would forward x-api-key).
func TestRedirectedBaseURLSendsNoKey(t *testing.T) {
	var reached, withKey atomic.Int64
	to := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("x-api-key") != "" {
			withKey.Add(1)
		}
		w.WriteHeader(http.StatusTeapot)
	}))
	defer to.Close()
	// "localhost" is another host than "127.0.0.1" to the HTTP client.
	target := strings.Replace(to.URL, "127.0.0.1", "localhost", 1)
	host := strings.TrimPrefix(target, "http://")
	from := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer from.Close()
	keys := map[string]string{"a": "sk-ant-api03-redirect-test-a-0123456789", "b": "sk-ant-api03-redirect-test-b-0123456789"}
	orgs := orgsFile(t, keys)
	dir := t.TempDir()
	in := filepath.Join(dir, "req.jsonl")
	writeJudge(t, in, 20)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"run", []string{"run", in, "--orgs", orgs, "--base-url", from.URL, "--run-dir", filepath.Join(dir, "sync"), "--quiet"}},
		{"run --route batch", []string{"run", in, "--orgs", orgs, "--base-url", from.URL, "--run-dir", filepath.Join(dir, "batch"), "--route", "batch", "--quiet", "--deadline", "3s"}},
		{"probe", []string{"probe", "--orgs", orgs, "--base-url", from.URL, "--out", filepath.Join(dir, "limits.json")}},
	} {
		code, stdout, stderr := runCLI(tc.args...)
		all := stdout + stderr
		for _, d := range []string{"sync", "batch"} {
			if b, err := os.ReadFile(filepath.Join(dir, d, rundir.EventsFile)); err == nil {
				all += string(b)
			}
		}
		if n := withKey.Load(); n != 0 {
			t.Fatalf("%s: %d requests with a key reached %s (of %d)", tc.name, n, host, reached.Load())
		}
		if code == exitOK || !strings.Contains(all, host) {
			t.Errorf("%s: exit %d; output does not name %s:\n%s", tc.name, code, host, all)
		}
		for _, k := range keys {
			if strings.Contains(all, k) {
				t.Fatalf("%s: a key in the output", tc.name)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached %s", n, host)
	}
}

// TestSharedWithBatchRouteNeedsNoRedis is issue 20's "--shared with
// --route batch demands Redis and never uses it": an unreachable Redis
// does not stop a batch run; the run notes that it does not use it.
func TestSharedWithBatchRouteNeedsNoRedis(t *testing.T) {
	r, input, runDir := simWith(t, 50, 20, func(*sim.Config) {})
	c := cliCmd(r, "run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet", "--route", "batch", "--shared", "redis://127.0.0.1:1/0")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--shared is not used by --route batch") {
		t.Errorf("no note that --shared is unused:\n%s", out)
	}
	requireEachOnce(t, runDir, 20)
}

// twoShared starts two 'apidispatch run' processes of n items each on the
// same simulator keys, sharing Redis: process 0 at url0, process 1 at url1
// (the same server, one of them maybe through a proxy).
func twoShared(t *testing.T, r *sim.Running, n int, url0, url1 string) *sharedFleet {
	t.Helper()
	f := &sharedFleet{r: r, n: n}
	base := t.TempDir()
	for i := range 2 {
		in := filepath.Join(base, fmt.Sprintf("req%d.jsonl", i))
		writeJudge(t, in, n)
		f.ins = append(f.ins, in)
		f.dirs = append(f.dirs, filepath.Join(base, fmt.Sprintf("run%d", i)))
	}
	for i, u := range []string{url0, url1} {
		f.redis = u
		f.cmds = append(f.cmds, f.start(t, i))
	}
	return f
}

// maxInFlightPerKey is the simulator's own highest count of requests in
// flight at once, per key.
func maxInFlightPerKey(r *sim.Running) []int64 {
	var m []int64
	for _, o := range r.Server.Stats().Orgs {
		m = append(m, o.MaxInFlight)
	}
	return m
}

// TestSharedPausedProcessStaysUnderTheCap is issue 20's case 1 from
// outside: two shared processes on the same three keys; one is stopped
// (SIGSTOP) in the middle of its run until the other has taken its slots
// (the simulator counts more than one process's share in flight on a key,
// which Redis grants only once the paused one's lease and grace are over),
// then continued (SIGCONT). The simulator's own maximum in flight per key
// stays at or under the cap of 100, and both runs write every custom_id
// once. Before the fence, the continued process admitted on its old grant
// on top of the other's whole cap; before the grace covered the longest
// request, the paused process's last requests were still running on the
// server when the other took their slots; before the send-time check, a
// request admitted just before the pause went out after it.
func TestSharedPausedProcessStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := envInt("APIDISPATCH_FENCE_N", 6000)
	r, _, _ := simWith(t, 4, 1, func(*sim.Config) {})
	u := cmdRedis(t)
	f := twoShared(t, r, n, u, u)
	waitBilled(t, r, n/2)
	if err := f.cmds[0].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	before := r.Server.LedgerTotals().Requests
	// Wait until the other process has reclaimed the paused one's slots
	// on every lane (one live lease left in Redis), then a second more for
	// it to fill them.
	took := waitReclaimed(t, u, paused, 40*time.Second, func() { f.cmds[0].Process.Signal(syscall.SIGCONT) })
	time.Sleep(time.Second)
	pausedFor := time.Since(paused)
	during := r.Server.LedgerTotals().Requests - before
	if err := f.cmds[0].Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.wait(t)
	maxIn := maxInFlightPerKey(r)
	t.Logf("paused %v mid-run (the other took its slots after %v); %d requests billed meanwhile (by the other); max in flight per key %v (cap 100)",
		pausedFor.Round(time.Millisecond), took.Round(time.Millisecond), during, maxIn)
	for i, m := range maxIn {
		if m > 100 {
			t.Errorf("key %d: %d in flight at once, cap 100", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, n)
	}
}

// waitReclaimed waits until every shared lane in Redis at redisURL has
// one lease left (another process reclaimed the silent one's slots) and
// reports how long after since that was; past limit it calls undo and
// fails.
func waitReclaimed(t *testing.T, redisURL string, since time.Time, limit time.Duration, undo func()) time.Duration {
	t.Helper()
	o, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	for {
		if time.Since(since) > limit {
			undo()
			t.Fatalf("%v and the other process never reclaimed the silent one's slots", limit)
		}
		time.Sleep(50 * time.Millisecond)
		keys, err := c.Keys(t.Context(), "apidispatch:v1:lane:*:exp").Result()
		if err != nil {
			undo()
			t.Fatal(err)
		}
		left := 0
		for _, k := range keys {
			left = max(left, int(c.ZCard(t.Context(), k).Val()))
		}
		if len(keys) > 0 && left <= 1 {
			return time.Since(since)
		}
	}
}

// TestSharedCutOffProcessStaysUnderTheCap is issue 20's case 2 from
// outside: two shared processes on the same three keys; process 0 reaches
// Redis through a proxy that goes dark for 10 s in the middle of its run,
// while process 1 keeps Redis (and both keep the API). The simulator's
// own maximum in flight per key stays at or under the cap of 100, and both
// runs write every custom_id once. Before the fence, the cut-off process
// went on on a local share of its own while Redis gave its slots away.
func TestSharedCutOffProcessStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := envInt("APIDISPATCH_FENCE_N", 6000)
	r, _, _ := simWith(t, 4, 1, func(*sim.Config) {})
	u := cmdRedis(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	px := netproxy.Start(t, pu.Host)
	viaProxy := *pu
	viaProxy.Host = px.Addr
	f := twoShared(t, r, n, viaProxy.String(), u)
	waitBilled(t, r, n/2)
	px.BlackHole(true)
	before := r.Server.LedgerTotals().Requests
	time.Sleep(10 * time.Second)
	during := r.Server.LedgerTotals().Requests - before
	px.BlackHole(false)
	f.wait(t)
	maxIn := maxInFlightPerKey(r)
	t.Logf("process 0 cut off from Redis for 10 s mid-run; %d requests billed meanwhile; max in flight per key %v (cap 100)", during, maxIn)
	for i, m := range maxIn {
		if m > 100 {
			t.Errorf("key %d: %d in flight at once, cap 100", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, n)
	}
	ev, _ := os.ReadFile(filepath.Join(f.dirs[0], rundir.EventsFile))
	if !strings.Contains(string(ev), "stopped answering") || !strings.Contains(string(ev), "rejoined") {
		t.Errorf("process 0's events lack the outage and the rejoin")
	}
}

// TestSharedBatchRoutePilotStaysUnderTheCap pins campaign seed 142: with
// --route batch, --shared was dropped (the batch route holds no request
// slots), but --pilot sends its first items by sync, so every process's
// pilot took the whole cap of each key on its own (10 in flight on a cap
// of 6 with three processes). The pilot now shares the key's budget.
func TestSharedBatchRoutePilotStaysUnderTheCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	r, _, _ := simWith(t, 10, 1, func(c *sim.Config) {
		for i := range c.Orgs {
			c.Orgs[i].Batch.QueueWaitS, c.Orgs[i].Batch.CancelS = 20, 2
		}
	})
	f := startFleet(t, r, 2, 200, cmdRedis(t), "--route", "batch", "--pilot", "150", "--cap", "sonnet=3,haiku=3,opus=3,other=3")
	f.wait(t)
	for i, m := range maxInFlightPerKey(r) {
		if m > 3 {
			t.Errorf("key %d: %d in flight at once during the pilots, cap 3", i, m)
		}
	}
	for _, d := range f.dirs {
		requireEachOnce(t, d, 200)
	}
}
