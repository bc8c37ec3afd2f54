package gateway

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/gate"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// countTokens serves POST /v1/messages/count_tokens from any usable org.
func (g *Gateway) countTokens(w http.ResponseWriter, r *http.Request, client string) {
	body, ok := readBody(w, r, MaxMessagesBytes)
	if !ok {
		return
	}
	p, bad := g.parseParams(body, false)
	if bad != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, bad)
		return
	}
	g.forward(w, r, upstreampkg.Anthropic, body, p.Model)
}

// passthrough serves GET /v1/models and /v1/models/{id} from any usable org.
// A model id is only ever a name: one that is not (an escaped "/", "..",
// "?") is the API's 404 and goes nowhere, so no client can steer the org's
// key to another endpoint (GET /v1/models/..%2Fmessages%2Fbatches would
// list the org's upstream batches behind a proxy that cleans paths).
//
// An OpenAI client's (isOpenAIClient) is served from the OpenAI orgs, in
// OpenAI's list format; an Anthropic client's from the Anthropic orgs.
// Either list is the upstream org's, the same for every client.
func (g *Gateway) passthrough(w http.ResponseWriter, r *http.Request, client string) {
	prov := upstreampkg.Anthropic
	if g.isOpenAIClient(r) {
		prov = upstreampkg.OpenAI
	}
	if id := r.PathValue("id"); id != "" && !validModelID(id) {
		errWriterOf(prov)(w, http.StatusNotFound, anthropic.ErrNotFound, "model: "+id)
		return
	}
	g.forward(w, r, prov, nil, "")
}

// errWriterOf is the error writer of p's API.
func errWriterOf(p *upstreampkg.Provider) errWriter {
	if p == upstreampkg.OpenAI {
		return writeOAError
	}
	return writeError
}

// validModelID reports whether id can be a model's id or alias: letters,
// digits, '-', '.', '_', ':' and '@', not "." or "..".
func validModelID(id string) bool {
	if id == "." || id == ".." || len(id) > 256 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._:@", c) >= 0) {
			return false
		}
	}
	return true
}

// forward sends r (with body, for model) to one usable org after another:
// a retryable answer is retried with back-off for up to RetryFor, an
// upstream key's 401/403 takes its org out of rotation (when a plain probe
// confirms that the key is refused, not what the client asked for: then
// the client gets the answer), anything else is passed on byte for byte.
// These endpoints are free and have their own limits, so they go through
// no lane. Nothing is sent once the gateway stops.
//
// prov is the API r is of: only its orgs are asked, with its headers, and
// its errors are answered in its envelope.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, prov *upstreampkg.Provider, body []byte, model string) {
	writeError := errWriterOf(prov)
	writeDraining := writeDraining
	if prov == upstreampkg.OpenAI {
		writeDraining = writeOADraining
	}
	ctx := r.Context()
	deadline := time.Now().Add(g.cfg.RetryFor)
	var last *answer
	for n := 1; ; n++ {
		if g.life.isDraining() {
			writeDraining(w, msgStopping)
			return
		}
		u := g.usableOrg(prov)
		if u == nil {
			if last != nil {
				passOnPlain(w, last, n-1)
				return
			}
			writeError(w, http.StatusServiceUnavailable, anthropic.ErrAPI, "apidispatch gateway: no usable org (every key is out of rotation)")
			return
		}
		actx, cancel := apihttp.AttemptContext(ctx, g.cfg.Timeout)
		stop := context.AfterFunc(g.life.cutCtx, cancel)
		req, err := http.NewRequestWithContext(actx, r.Method, g.base+r.URL.Path, bytesReader(body))
		if err != nil {
			stop()
			cancel()
			writeError(w, http.StatusInternalServerError, anthropic.ErrAPI, "apidispatch gateway: "+err.Error())
			return
		}
		req.URL.RawQuery = r.URL.RawQuery
		if prov == upstreampkg.Anthropic {
			copyClientHeaders(req.Header, r.Header)
		}
		prov.SetHeaders(req.Header, u.Org, body != nil)
		res := prov.Send(g.client, req, maxUpstreamAnswer, nil)
		stop()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if res.Err != nil && g.life.cutting() {
			writeDraining(w, msgStopping) // free endpoints: nothing billed
			return
		}
		a, o := answer{status: res.Status, header: res.Header, body: res.Body}, res.Outcome
		switch {
		case res.Err != nil:
			// Sending failed, or the answer broke off (a cut 2xx too:
			// these answers are not messages, so only the error tells).
			a = answer{status: http.StatusBadGateway, body: errorBody(anthropic.ErrAPI, "apidispatch gateway: upstream "+o.Reason)}
			if prov == upstreampkg.OpenAI {
				a.body = oaErrorBody(anthropic.ErrAPI, "", "", "apidispatch gateway: upstream "+o.Reason)
			}
		case o.Kind == anthropic.LaneFatal || a.status == http.StatusUnauthorized || a.status == http.StatusForbidden:
			fault := keyRefused // an OpenAI client chooses nothing its key may be refused for
			if prov == upstreampkg.Anthropic {
				fault = g.refusalOf(u, model, o)
			}
			switch fault {
			case keyRefused:
				g.disableOrg(u, o.Reason)
				continue
			case clientRefused:
				passOnPlain(w, &a, n)
				return
			} // the probe could not tell: again, after a back-off
		case a.status < 300 || o.Kind == anthropic.Terminal:
			passOnPlain(w, &a, n)
			return
		}
		last = &a
		// No lane holds for a 429 here: it waits like any retry.
		wait := gate.RetryWait(o, n, g.cfg.Speed, rand.Float64())
		if time.Now().Add(wait).After(deadline) {
			passOnPlain(w, last, n)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-g.life.draining:
			t.Stop()
			writeDraining(w, msgStopping)
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
