// Package wirelog writes the headers of HTTP exchanges to a file, for
// debugging what the API said (rate-limit headers, request ids, retry-after)
// without a proxy. Credentials never reach it: x-api-key and Authorization
// are written as the key's fingerprint, cookies as [redacted], and any other
// text that looks like an Anthropic key is replaced by [redacted]. Bodies are
// not written (they hold the user's data; results.jsonl holds the API's
// errors).
package wirelog

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/org"
)

// Log writes HTTP exchanges to one writer. Wrap puts it around a
// transport: each exchange through any wrapped transport becomes one
// block, numbered in the order the exchanges started:
//
//	# 17 2026-12-02T18:40:01.123Z 812ms
//	> POST http://127.0.0.1:8080/v1/messages
//	> X-Api-Key: [key 3f2a9c1d]
//	< 200 OK
//	< Request-Id: req_011C…
//
// Blocks from concurrent exchanges never interleave. After the first failed
// write the Log stops writing (Err returns it) and the wrapped transports
// go on passing requests. It is safe for concurrent use; use New to make
// one.
type Log struct {
	seq atomic.Uint64

	mu  sync.Mutex
	w   io.Writer
	err error
}

// New returns a Log writing to w.
func New(w io.Writer) *Log { return &Log{w: w} }

// Wrap returns a transport that passes every request to base
// (http.DefaultTransport when nil) and writes the exchange's request line
// and headers and the response's status and headers (or the transport
// error) to the Log.
func (l *Log) Wrap(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base, log: l}
}

// Err returns the first write error, or nil.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Log) write(b []byte) {
	l.mu.Lock()
	if l.err == nil {
		_, l.err = l.w.Write(b)
	}
	l.mu.Unlock()
}

type transport struct {
	base http.RoundTripper
	log  *Log
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	n := t.log.seq.Add(1)
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %d %s %s\n", n, start.UTC().Format("2006-01-02T15:04:05.000Z"), time.Since(start).Round(time.Millisecond))
	fmt.Fprintf(&b, "> %s %s\n", req.Method, org.Scrub(req.URL.Redacted()))
	if req.Host != "" && req.Host != req.URL.Host {
		fmt.Fprintf(&b, "> Host: %s\n", org.Scrub(req.Host))
	}
	writeHeader(&b, "> ", req.Header)
	if err != nil {
		fmt.Fprintf(&b, "! %s\n", oneLine(org.Scrub(err.Error())))
	} else {
		fmt.Fprintf(&b, "< %s\n", oneLine(org.Scrub(resp.Status)))
		writeHeader(&b, "< ", resp.Header)
	}
	b.WriteByte('\n')
	t.log.write(b.Bytes())
	return resp, err
}

// CloseIdleConnections closes the base transport's idle connections, so
// that http.Client.CloseIdleConnections reaches them through the wrapper.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// writeHeader writes h sorted by name, one line per value, credentials
// replaced (see Value).
func writeHeader(b *bytes.Buffer, prefix string, h http.Header) {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range h[k] {
			fmt.Fprintf(b, "%s%s: %s\n", prefix, oneLine(k), oneLine(Value(k, v)))
		}
	}
}

// Value returns header value v of header name as the wire log shows it:
// x-api-key as "[key <fingerprint>]", Authorization and
// Proxy-Authorization as their scheme and the credential's fingerprint,
// cookies as "[redacted]", and anything else with key-like text replaced
// (org.Scrub).
func Value(name, v string) string {
	switch http.CanonicalHeaderKey(name) {
	case "X-Api-Key":
		return "[key " + org.Fingerprint(v) + "]"
	case "Authorization", "Proxy-Authorization":
		if scheme, cred, ok := strings.Cut(v, " "); ok {
			return scheme + " [key " + org.Fingerprint(strings.TrimSpace(cred)) + "]"
		}
		return "[key " + org.Fingerprint(v) + "]"
	case "Cookie", "Set-Cookie":
		return "[redacted]"
	}
	return org.Scrub(v)
}

// oneLine keeps a block's line structure: control characters in a value
// (which net/http refuses to send, but an error text may hold) become spaces.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
