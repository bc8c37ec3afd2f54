package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// ErrNotLoopback is returned by StartOn for an address that is not on the
// loopback interface: the simulator's keys and admin endpoints are not meant
// for a network.
var ErrNotLoopback = errors.New("sim: listen address must be on loopback (127.0.0.1, ::1 or localhost)")

// Running is a simulator served over HTTP on a real listener, from Start or
// StartOn. Its Close is safe to call more than once and from any goroutine.
type Running struct {
	// URL is the API root, e.g. "http://127.0.0.1:41234"; point a client's
	// base URL at it.
	URL string
	// Server is the simulator behind it.
	Server *Server

	srv       *http.Server
	done      chan error
	closeOnce sync.Once
	closeErr  error
}

// Start builds a simulator from cfg and serves it on 127.0.0.1 at a free
// port. Close it when done.
func Start(cfg Config) (*Running, error) {
	return StartOn("127.0.0.1:0", cfg)
}

// StartOn is Start on addr, which must be a loopback address ("127.0.0.1:8080",
// "[::1]:0", "localhost:9000").
func StartOn(addr string, cfg Config) (*Running, error) {
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	r, err := serveOn(addr, s)
	if err != nil {
		s.Close()
		return nil, err
	}
	return r, nil
}

// serve serves an existing simulator on 127.0.0.1 at a free port.
func serve(s *Server) (*Running, error) { return serveOn("127.0.0.1:0", s) }

func serveOn(addr string, s *Server) (*Running, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: listen: %w", err)
	}
	r := &Running{
		URL:    "http://" + ln.Addr().String(),
		Server: s,
		srv: &http.Server{
			Handler:           s,
			ReadHeaderTimeout: 30 * time.Second,
			IdleTimeout:       5 * time.Minute,
			// Resets and truncated bodies are deliberate; keep the log quiet.
			ErrorLog: log.New(io.Discard, "", 0),
		},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

// Close stops serving (waiting up to 5 s for requests in progress, then
// cutting them), then closes the simulator, flushing its ledger file.
// Idempotent.
func (r *Running) Close() error {
	r.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.srv.Shutdown(ctx); err != nil {
			r.srv.Close()
		}
		if err := <-r.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.closeErr = err
		}
		if err := r.Server.Close(); err != nil && r.closeErr == nil {
			r.closeErr = err
		}
	})
	return r.closeErr
}

// CheckLoopback returns ErrNotLoopback unless addr (host:port) names a
// loopback host.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("sim: listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: got %q", ErrNotLoopback, addr)
	}
	return nil
}
