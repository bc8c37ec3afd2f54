package upstream

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/ratelimit"
)

// The attempt: one request sent upstream, its answer read (at most a
// limit's bytes) and classified, and what may have been billed. It exists
// once, under every route (the engine of run and ab, the gateway's
// Messages requests and its free endpoints); each route adds what is its
// own (the journal, the lane, the ledger) around it.

// Result is one attempt's answer, classified. The zero value is no
// answer and no outcome.
type Result struct {
	Status int         // 0: no answer came
	Header http.Header // nil: no answer came
	Body   []byte      // at most the limit's bytes
	// Err is the error of sending, or of reading the answer's body. A 2xx
	// whose body broke off keeps its error here but is classified as
	// truncated (Outcome), not as a transport error: the reason says what
	// happened, and it may have been billed.
	Err     error
	Outcome anthropic.Outcome
	// Usage is a success's usage, as its provider reported it (nil: none
	// reported, or no success).
	Usage *Usage
	// Wrote: the whole request went out (net/http/httptrace's
	// WroteRequest without an error).
	Wrote bool
	// MayHaveBilled is MayHaveBilled(Outcome, Wrote).
	MayHaveBilled bool
	// At is when the answer was read (the clock of Outcome's retry-after);
	// Latency is from the sending to At.
	At      time.Time
	Latency time.Duration
}

// Call is one request on its way: Begin sends it, Finish reads and
// classifies its answer. A route that takes an answer of its own kind (a
// stream) reads Resp itself and uses Finish only for any other answer.
// Wrote may be called from any goroutine.
type Call struct {
	// Resp is the answer's head; nil when Err is set (Begin closed any
	// answer a refused redirect left).
	Resp  *http.Response
	Err   error
	start time.Time
	wrote atomic.Bool
	p     *Provider // whose classifier reads the answer (nil: Anthropic)
}

// Begin sends req with client and returns once the answer's head came,
// or the sending failed. The request's context ends the attempt; a trace
// already on it still sees every event. onWrote (nil: none) is called
// once, when the whole request has been written to the connection (from
// the transport's goroutine), before Wrote reports it: a route journals
// there that the request went out.
func Begin(client *http.Client, req *http.Request, onWrote func()) *Call {
	return Anthropic.Begin(client, req, onWrote)
}

// Begin is the package's Begin for a request to p's API: Finish
// classifies its answer with p's classifier.
func (p *Provider) Begin(client *http.Client, req *http.Request, onWrote func()) *Call {
	c := &Call{p: p}
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err != nil || c.wrote.Load() {
			return
		}
		if onWrote != nil {
			onWrote()
		}
		c.wrote.Store(true)
	}})
	c.start = time.Now()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		// A non-nil answer with an error is a refused redirect, its body
		// already closed: not an answer.
		c.Err = err
		return c
	}
	c.Resp = resp
	return c
}

// Wrote reports whether the whole request went out.
func (c *Call) Wrote() bool { return c.wrote.Load() }

// Finish reads the answer's body, at most limit bytes (more is left
// unread, and the connection closed), closes it and classifies the
// attempt. A 2xx whose body broke off is classified as truncated.
func (c *Call) Finish(limit int64) Result {
	r := Result{Err: c.Err}
	if c.Resp != nil {
		r.Status, r.Header = c.Resp.StatusCode, c.Resp.Header
		r.Body, r.Err = io.ReadAll(io.LimitReader(c.Resp.Body, limit))
		c.Resp.Body.Close()
	}
	r.At = time.Now()
	r.Latency = r.At.Sub(c.start)
	classifyErr := r.Err
	if r.Status >= 200 && r.Status < 300 {
		// A 2xx whose body broke off: classified as truncated, not as a
		// transport error, so the reason says what happened.
		classifyErr = nil
	}
	p := c.p
	if p == nil {
		p = Anthropic
	}
	r.Outcome, r.Usage = p.Classify(r.Status, r.Header, r.Body, classifyErr, r.At)
	r.Wrote = c.Wrote()
	r.MayHaveBilled = MayHaveBilled(r.Outcome, r.Wrote)
	return r
}

// Send is one attempt whole: Begin, then Finish with limit.
func Send(client *http.Client, req *http.Request, limit int64, onWrote func()) Result {
	return Begin(client, req, onWrote).Finish(limit)
}

// Send is the package's Send for a request to p's API.
func (p *Provider) Send(client *http.Client, req *http.Request, limit int64, onWrote func()) Result {
	return p.Begin(client, req, onWrote).Finish(limit)
}

// NotSent is an attempt that failed before it went out, err saying why:
// Finish classifies it as a transport error, never billed.
func NotSent(err error) *Call {
	return &Call{Err: err, start: time.Now()}
}

// MayHaveBilled is the one rule of every route for an attempt that failed:
// it may have been billed although no usable answer came back when its
// answer was cut or unreadable after a 2xx, or when the connection was
// lost (or timed out) after the whole request went out (wrote). A refused
// dial or a broken write cannot have been billed, nor can any answer the
// API classified itself.
func MayHaveBilled(o anthropic.Outcome, wrote bool) bool {
	switch o.ErrorType {
	case anthropic.ErrTypeTruncated, anthropic.ErrTypeNotMessage:
		return true
	case anthropic.ErrTypeConnection:
		return wrote
	}
	return false
}

// Feedback is what an attempt with outcome o teaches its lane: the rate
// limits of its answer's headers h (none without an answer) and, for an
// answer billed with usage u (nil: none known), the tokens it used against
// the limits and its cost c. Each route prices u itself.
func Feedback(o anthropic.Outcome, h http.Header, u *anthropic.Usage, c cost.Nanos) gate.Feedback {
	fb := gate.Feedback{Outcome: o}
	if h != nil {
		fb.Limits = anthropic.ParseRateLimits(h)
	}
	if u != nil {
		fb.Billed = true
		fb.Actual = ratelimit.Need{Requests: 1, Input: float64(u.InputTokens + u.CacheCreationInputTokens), Output: float64(u.OutputTokens)}
		fb.Cost = c
	}
	return fb
}
