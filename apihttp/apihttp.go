// Package apihttp is the one HTTP client set-up of every client that sends
// an API key: the sync engine, the batch route, the probe, the legacy arm
// of 'ab' and the gateway. Its clients ride a tuned transport and refuse
// every redirect: an API key is for the base URL it was given to, and Go
// drops Authorization on a cross-host redirect but not x-api-key, so a
// redirect is an error naming the host it pointed to, and no request
// follows it.
package apihttp

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrRedirect is what every *RedirectError matches with errors.Is.
var ErrRedirect = errors.New("apihttp: the API answered with a redirect, which is never followed")

// RedirectError is a redirect the client refused. It names where the
// redirect pointed (scheme and host only: a path or query could carry
// anything) and never the request's headers.
type RedirectError struct {
	// Status is the redirect's status code (301, 302, 303, 307, 308).
	Status int
	// From is the host that answered with the redirect.
	From string
	// To is the scheme and host it pointed to.
	To string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("apihttp: %s answered %d redirecting to %s: redirects are never followed (no API key leaves for another host); check --base-url", e.From, e.Status, e.To)
}

// Is reports whether target is ErrRedirect.
func (e *RedirectError) Is(target error) bool { return target == ErrRedirect }

// CheckRedirect is the http.Client.CheckRedirect of every API client: it
// refuses every redirect with a *RedirectError, so the request to the
// redirect's target is never sent.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	e := &RedirectError{To: req.URL.Scheme + "://" + req.URL.Host}
	if req.Response != nil {
		e.Status = req.Response.StatusCode
	}
	if len(via) > 0 {
		e.From = via[len(via)-1].URL.Host
	}
	return e
}

// NewTransport returns the tuned transport of API clients: enough idle
// connections for maxConns requests in flight, HTTP/2 when the server
// offers it, TLS verification always on.
func NewTransport(maxConns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxConns
	t.MaxIdleConnsPerHost = maxConns
	t.IdleConnTimeout = 90 * time.Second
	t.ForceAttemptHTTP2 = true
	return t
}

// NewClient returns a client on rt (a new NewTransport(maxConns) when rt
// is nil) with timeout (0: none) that refuses every redirect.
func NewClient(rt http.RoundTripper, maxConns int, timeout time.Duration) *http.Client {
	if rt == nil {
		rt = NewTransport(maxConns)
	}
	return &http.Client{Transport: rt, Timeout: timeout, CheckRedirect: CheckRedirect}
}

// Guard returns a copy of c (its transport, jar and timeout kept) that
// refuses every redirect, whatever c's own CheckRedirect was, for clients
// handed in by a caller. Guard(nil) is nil.
func Guard(c *http.Client) *http.Client {
	if c == nil {
		return nil
	}
	g := *c
	g.CheckRedirect = CheckRedirect
	return &g
}
