package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults of the gateway's edges toward its clients.
const (
	// DefaultBodyTimeout bounds reading a request's body.
	DefaultBodyTimeout = time.Minute
	// DefaultWriteTimeout bounds each write of an answer to a client.
	DefaultWriteTimeout = time.Minute
)

// checkEdges checks the fields of cfg that face the clients and fills in
// their defaults.
func (cfg *Config) checkEdges() error {
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	switch cfg.CacheScope {
	case "", CacheScopeClient, CacheScopeShared:
	default:
		return fmt.Errorf("%w: cache scope %q: want %q or %q", ErrConfig, cfg.CacheScope, CacheScopeClient, CacheScopeShared)
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "" {
			return fmt.Errorf("%w: public URL %q: want http(s)://host[:port], the base URL clients reach the gateway at", ErrConfig, cfg.PublicURL)
		}
		cfg.PublicURL = u.Scheme + "://" + u.Host
	}
	return nil
}

// publicBase is the gateway's base URL as r's client reached it, for the
// URLs the gateway hands out (results_url): PublicURL when configured,
// else the scheme and local address of r's connection (the listener's
// own address: what the client connected to, whatever Host it claims).
func (g *Gateway) publicBase(r *http.Request) string {
	if g.cfg.PublicURL != "" {
		return g.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return scheme + "://" + a.String()
	}
	return scheme + "://localhost" // no connection: a handler called directly
}

// guard is the gateway's edge toward its clients, around every route:
// a request's body must arrive within BodyTimeout (a client that dribbles
// it is cut at the deadline); each write of an answer must be taken within
// WriteTimeout (a client that stops reading is cut then; the lanes never
// wait for it: upstream answers are read to their end whatever the client
// reads); and every request is counted, for Close to wait for.
func (g *Gateway) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.life.enter()
		defer g.life.leave()
		rc := http.NewResponseController(w)
		// No deadline left over from the connection's previous request
		// (say, while the body is read with Expect: 100-continue).
		rc.SetWriteDeadline(time.Time{})
		// The server's own last writes after the handler have one too,
		// from the handler's end.
		defer func() { rc.SetWriteDeadline(time.Now().Add(g.cfg.WriteTimeout)) }()
		if r.Body != nil && r.Body != http.NoBody {
			b := &bodyReader{ReadCloser: r.Body, rc: rc, until: time.Now().Add(g.cfg.BodyTimeout)}
			rc.SetReadDeadline(b.until)
			r.Body = b
		}
		h.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc, d: g.cfg.WriteTimeout}, r)
	})
}

// bodyReader holds a body to its deadline: BodyTimeout from the header,
// and a second more for each MB received (bodyRate), so that a big body
// sent steadily is read whole while one dribbled is cut. It lifts the
// deadline once the whole body has been read, so that the server's watch
// for the client going away (a read on the same connection) is not cut by
// it; a body cut by the deadline keeps it: the server gives up on the
// rest and closes the connection. It is read by one goroutine.
type bodyReader struct {
	io.ReadCloser
	rc       *http.ResponseController
	until    time.Time
	read     int64 // bytes so far
	credited int64 // bytes the deadline was extended for
	done     bool  // read to its end: the deadline lifted
}

// bodyRate is the pace a big body is allowed beyond BodyTimeout.
const bodyRate = 1 << 20 // bytes a second

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if b.read-b.credited >= bodyRate {
		more := (b.read - b.credited) / bodyRate
		b.credited += more * bodyRate
		b.until = b.until.Add(time.Duration(more) * time.Second)
		b.rc.SetReadDeadline(b.until)
	}
	if err == io.EOF && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// deadlineWriter gives every write to the client its own deadline, d from
// its start, in pieces of at most writePiece bytes: a client that reads
// slowly but steadily is served, one that stops is cut.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

const writePiece = 64 << 10

func (w *deadlineWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		p := b[:min(len(b), writePiece)]
		w.rc.SetWriteDeadline(time.Now().Add(w.d))
		k, err := w.ResponseWriter.Write(p)
		n += k
		if err != nil {
			return n, err
		}
		b = b[len(p):]
	}
	return n, nil
}

// FlushError flushes with a deadline (http.ResponseController uses it).
func (w *deadlineWriter) FlushError() error {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.rc.Flush()
}

// Unwrap is the client's ResponseWriter, for http.ResponseController.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
