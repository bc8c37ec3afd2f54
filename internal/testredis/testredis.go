// Package testredis gives tests a real Redis: the shared server CI starts
// (APIDISPATCH_TEST_REDIS_URL), or a private redis-server a test starts and
// stops itself. Under CI a missing redis-server fails the test; elsewhere it
// skips, naming what to install.
package testredis

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvURL names the variable holding the shared test server's URL.
const EnvURL = "APIDISPATCH_TEST_REDIS_URL"

func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI installs and starts redis-server in .ci/run)", what)
	}
	t.Skipf("%s; set %s or install redis-server", what, EnvURL)
}

// URL returns the shared test server's URL; when EnvURL is not set, that
// of a private redis-server started for the test (Start), so a machine with
// redis-server on its PATH runs the Redis tests without being told to.
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return Start(t).URL()
}

// Server is a private redis-server on a free loopback port.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	t    testing.TB
}

// Start starts a private redis-server (no persistence); it stops with the test.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(t, "redis-server is not installed")
	}
	_ = bin
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &Server{Addr: addr, t: t}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Stop kills the server (as a crash would: no goodbye to clients).
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts the server again on the same port (empty: no persistence).
func (s *Server) Restart() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				for sc.Scan() {
				}
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		s.t.Fatal(fmt.Sprintf("redis-server on %s did not start", s.Addr))
	}
}

// EmptyDB returns the URL of database db of the test server (URL), emptied
// first: tests that use the simulator's keys, which are the same in every
// test, must not find a lane state an earlier test left there.
func EmptyDB(t testing.TB, db int) string {
	t.Helper()
	pu, err := url.Parse(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/" + strconv.Itoa(db)
	u := pu.String()
	o, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return u
}
