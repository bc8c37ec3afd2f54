package gateway

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// countTokens serves POST /v1/messages/count_tokens from any usable org.
func (g *Gateway) countTokens(w http.ResponseWriter, r *http.Request, client string) {
	body, ok := readBody(w, r, MaxMessagesBytes)
	if !ok {
		return
	}
	if _, bad := g.parseParams(body, false); bad != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, bad)
		return
	}
	g.forward(w, r, body)
}

// passthrough serves GET /v1/models and /v1/models/{id} from any usable org.
func (g *Gateway) passthrough(w http.ResponseWriter, r *http.Request, client string) {
	g.forward(w, r, nil)
}

// forward sends r (with body) to one usable org after another: a
// retryable answer is retried with back-off for up to RetryFor, an
// upstream key's 401/403 takes its org out of rotation, anything else is
// passed on byte for byte. These endpoints are free and have their own
// limits, so they go through no lane.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	ctx := r.Context()
	deadline := time.Now().Add(g.cfg.RetryFor)
	var last *answer
	for n := 1; ; n++ {
		u := g.usableOrg()
		if u == nil {
			if last != nil {
				passOnPlain(w, last, n-1)
				return
			}
			writeError(w, http.StatusServiceUnavailable, anthropic.ErrAPI, "apidispatch gateway: no usable org (every key is out of rotation)")
			return
		}
		actx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
		req, err := http.NewRequestWithContext(actx, r.Method, g.base+r.URL.Path, bytesReader(body))
		if err != nil {
			cancel()
			writeError(w, http.StatusInternalServerError, anthropic.ErrAPI, "apidispatch gateway: "+err.Error())
			return
		}
		req.URL.RawQuery = r.URL.RawQuery
		copyClientHeaders(req.Header, r.Header)
		req.Header.Set(anthropic.HeaderAPIKey, u.Key.Reveal())
		if body != nil {
			req.Header.Set("content-type", "application/json")
		}
		var a answer
		resp, err := g.client.Do(req)
		if err == nil {
			a.status, a.header = resp.StatusCode, resp.Header
			a.body, err = io.ReadAll(io.LimitReader(resp.Body, maxUpstreamAnswer))
			resp.Body.Close()
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		o := anthropic.Classify(a.status, a.header, a.body, err, time.Now())
		switch {
		case err != nil:
			a = answer{status: http.StatusBadGateway, body: errorBody(anthropic.ErrAPI, "apidispatch gateway: upstream "+o.Reason)}
		case o.Kind == anthropic.LaneFatal || a.status == http.StatusUnauthorized || a.status == http.StatusForbidden:
			g.disableOrg(u, o.Reason)
			continue
		case a.status < 300 || o.Kind == anthropic.Terminal:
			passOnPlain(w, &a, n)
			return
		}
		last = &a
		back := math.Min(8, 0.5*math.Pow(2, float64(n-1)))
		wait := time.Duration(back / g.cfg.Speed * float64(time.Second))
		if o.HasRetryAfter {
			wait = o.RetryAfter
		}
		if time.Now().Add(wait).After(deadline) {
			passOnPlain(w, last, n)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func bytesReader(b []byte) io.Reader {
	if b == nil {
		return nil
	}
	return bytes.NewReader(b)
}

// passOnPlain answers with a as it came (without the org's id).
func passOnPlain(w http.ResponseWriter, a *answer, attempts int) {
	h := w.Header()
	for k, v := range a.header {
		if !hopHeaders[k] {
			h[k] = v
		}
	}
	if h.Get("content-type") == "" {
		h.Set("content-type", "application/json")
	}
	if a.header == nil {
		h.Set(anthropic.HeaderRequestID, newRequestID())
	}
	h.Set(headerAttempts, strconv.Itoa(attempts))
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	w.Write(a.body)
}
