package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// refusal is whose doing an upstream refusal (401, 403) is.
type refusal int

const (
	// refusalUnknown: the probe could not tell (no answer, 429, 5xx).
	refusalUnknown refusal = iota
	// keyRefused: the org's key itself is refused; it leaves the rotation.
	keyRefused
	// clientRefused: the key is fine; what the client chose (a beta, a
	// header, a parameter) was refused, and the client gets the answer.
	clientRefused
)

// probeFresh is how long a probe that found a key fine is believed.
const probeFresh = 30 * time.Second

// prober remembers the probes of the keys: the last one that found a key
// fine, per (org, pool), and the probes under way, so that many refused
// requests at once send one probe. Its zero value is ready.
type prober struct {
	mu      sync.Mutex
	fine    map[probeKey]time.Time
	flights map[probeKey]*probeFlight
}

type probeKey struct {
	org  string
	pool anthropic.Pool // "" for a probe without a model
}

type probeFlight struct {
	done chan struct{}
	r    refusal
}

// refusalOf judges the LaneFatal outcome o of a request sent with u's key
// for model ("" for a request without one). A 401 or 403 may be the
// client's doing (a beta its orgs may not use takes no org out): a plain
// probe with u's key, without anything the client chose, tells. Anything
// else lane-fatal (402, the spend limit, a redirect) is the org's.
func (g *Gateway) refusalOf(u *upstream, model string, o anthropic.Outcome) refusal {
	if o.Status != http.StatusUnauthorized && o.Status != http.StatusForbidden {
		return keyRefused
	}
	k := probeKey{org: u.Name}
	if model != "" {
		k.pool = anthropic.PoolOf(model)
	}
	p := &g.probes
	p.mu.Lock()
	if p.fine == nil {
		p.fine, p.flights = map[probeKey]time.Time{}, map[probeKey]*probeFlight{}
	}
	if at, ok := p.fine[k]; ok && time.Since(at) < probeFresh {
		p.mu.Unlock()
		return clientRefused
	}
	if f := p.flights[k]; f != nil {
		p.mu.Unlock()
		<-f.done
		return f.r
	}
	f := &probeFlight{done: make(chan struct{})}
	p.flights[k] = f
	p.mu.Unlock()
	f.r = g.probe(u, model)
	p.mu.Lock()
	delete(p.flights, k)
	if f.r == clientRefused {
		p.fine[k] = time.Now()
	}
	p.mu.Unlock()
	close(f.done)
	if f.r == clientRefused {
		g.log.Info("an upstream refusal of a client's request, its org's key found fine by a plain probe: the client gets the answer, the org stays in rotation",
			"org", u.Name, "key", u.Key.Fingerprint(), "reason", o.Reason)
	}
	return f.r
}

// probeTimeout bounds a probe.
const probeTimeout = 30 * time.Second

// probe asks the upstream, with u's key and nothing a client chose (no
// beta, the gateway's API version), for something free that the key may
// do: count_tokens of one word with model, or the first model of the list
// without one.
func (g *Gateway) probe(u *upstream, model string) refusal {
	ctx, cancel := context.WithTimeout(g.life.cutCtx, min(probeTimeout, g.cfg.Timeout))
	defer cancel()
	var req *http.Request
	var err error
	if model != "" {
		body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "ping"}}})
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, g.base+"/v1/messages/count_tokens", strings.NewReader(string(body)))
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, g.base+"/v1/models?limit=1", nil)
	}
	if err != nil {
		return refusalUnknown
	}
	anthropic.SetHeaders(req.Header, u.Key, model != "")
	resp, err := g.client.Do(req)
	if err != nil {
		return refusalUnknown
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return clientRefused
	case s == http.StatusUnauthorized, s == http.StatusPaymentRequired, s == http.StatusForbidden:
		return keyRefused
	}
	return refusalUnknown
}
