package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

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
