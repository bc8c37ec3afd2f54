package gateway

import (
	"bufio"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// limitedServer serves a handler behind a connLimiter of c: GET /block
// sends on blocked (the connection is active from then) and waits until
// release is closed, anything else answers at once.
func limitedServer(t *testing.T, c ConnLimits) (addr string, lim *connLimiter, blocked, release chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release, blocked = make(chan struct{}), make(chan struct{}, 8)
	lim = newConnLimiter(ln, c)
	srv := &http.Server{ConnState: lim.connState, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/block" {
				blocked <- struct{}{}
				<-release
			}
			io.WriteString(w, "ok")
		})}
	go srv.Serve(lim)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), lim, blocked, release
}

// underWay waits until a request to /block is in its handler: its
// connection is active (a sleep of 50 ms for it raced a loaded machine's
// scheduling, and an idle-looking busy connection would be evicted).
func underWay(t *testing.T, blocked chan struct{}) {
	t.Helper()
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("a request to /block never reached its handler")
	}
}

func dialIdle(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (within 2 s).
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func waitOpen(t *testing.T, lim *connLimiter, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); lim.open() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d connections held, want %d", lim.open(), n)
		}
	}
}

// At the limit a new connection takes the place of the one idle for
// longest; when every connection has a request under way it is closed at
// once; a request under way is never cut. Per IP the same, among the
// connections of that address.
func TestConnLimiterEvictsTheLongestIdle(t *testing.T) {
	addr, lim, blocked, release := limitedServer(t, ConnLimits{Max: 2})
	busy := dialIdle(t, addr)
	io.WriteString(busy, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
	idle := dialIdle(t, addr)
	waitOpen(t, lim, 2)
	underWay(t, blocked)
	third := dialIdle(t, addr)
	if !closedByServer(idle) {
		t.Error("the idle connection was not closed for the new one")
	}
	io.WriteString(third, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
	underWay(t, blocked)
	fourth := dialIdle(t, addr)
	if !closedByServer(fourth) {
		t.Error("every connection busy, yet a new one was held")
	}
	close(release)
	for _, c := range []net.Conn{busy, third} {
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Errorf("a request under way: %q %v", line, err)
		}
	}
	if lim.evicted.Load() != 1 || lim.refused.Load() != 1 {
		t.Errorf("evicted %d, refused %d; want 1, 1", lim.evicted.Load(), lim.refused.Load())
	}

	addr, lim, _, _ = limitedServer(t, ConnLimits{Max: 100, PerIP: 2})
	a, b := dialIdle(t, addr), dialIdle(t, addr)
	waitOpen(t, lim, 2)
	c := dialIdle(t, addr)
	if !closedByServer(a) {
		t.Error("per IP: the longest idle connection of the address was not closed")
	}
	io.WriteString(b, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if line, err := bufio.NewReader(b).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Errorf("per IP: a held connection: %q %v", line, err)
	}
	_ = c
	waitOpen(t, lim, 2)
}

// The default leaves a quarter of the file limit (at least 256) for
// everything but client connections, and a limit above it is refused.
func TestConnLimitsLeaveHeadroom(t *testing.T) {
	for _, c := range []struct {
		files uint64
		want  int
	}{{0, 4096}, {1024, 768}, {2048, 1536}, {20000, 15000}, {300, 44}, {200, 16}} {
		if got := DefaultMaxConns(c.files); got != c.want {
			t.Errorf("file limit %d: %d connections, want %d", c.files, got, c.want)
		}
	}
	if got, err := CheckConnLimits(ConnLimits{}, 2048); err != nil || got.Max != 1536 {
		t.Errorf("default under 2048 files: %+v %v", got, err)
	}
	if _, err := CheckConnLimits(ConnLimits{Max: 2000}, 2048); err == nil || !strings.Contains(err.Error(), "2048") || !errors.Is(err, ErrConfig) {
		t.Errorf("2000 connections under 2048 files: %v", err)
	}
	if _, err := CheckConnLimits(ConnLimits{Max: 1000, PerIP: -1}, 2048); err == nil {
		t.Error("a negative per-IP limit was taken")
	}
}
