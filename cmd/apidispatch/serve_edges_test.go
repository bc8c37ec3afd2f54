//go:build unix

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gateway"
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
