// Package netproxy is a loopback TCP proxy for tests: it forwards every
// connection to one address and can delay what the target sends back, or
// black-hole the link (nothing passes either way, no connection closes),
// as a network partition does.
package netproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections on Addr to a target. It is safe for
// concurrent use; the test's cleanup closes it and waits for its
// goroutines.
type Proxy struct {
	// Addr is host:port the proxy listens on.
	Addr   string
	target string
	ln     net.Listener
	dark   atomic.Bool
	delay  atomic.Int64 // ns added before each chunk the target sends back
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	gate   chan struct{} // closed and replaced when the link comes back
	closed bool
}

// Start listens on a free loopback port and forwards to target until the
// test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, gate: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// BlackHole cuts (true) or restores (false) the link: while cut, bytes
// wait in the proxy and new connections are accepted but not answered.
func (p *Proxy) BlackHole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dark.Swap(on) && !on {
		close(p.gate)
		p.gate = make(chan struct{})
	}
}

// SetDelay delays every chunk the target sends back by d.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *Proxy) wait() {
	p.mu.Lock()
	g, dark := p.gate, p.dark.Load()
	p.mu.Unlock()
	if dark {
		<-g
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(c net.Conn) {
	p.wait()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	closed := p.closed
	p.mu.Unlock()
	if closed {
		c.Close()
		up.Close()
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(up, c, 0); up.Close() })
	wg.Go(func() { p.pipe(c, up, 1); c.Close() })
	wg.Wait()
}

// pipe copies src to dst chunk by chunk, holding chunks while the link is
// dark and, back from the target (dir 1), for the delay.
func (p *Proxy) pipe(dst io.Writer, src io.Reader, dir int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if d := time.Duration(p.delay.Load()); d > 0 && dir == 1 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.BlackHole(false)
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
