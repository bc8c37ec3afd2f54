package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/promptcache"
	"github.com/apidispatch/apidispatch/spend"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// answer is an upstream response kept to pass on.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// readBody reads at most limit bytes of r's body, answering 413 (the API's
// request_too_large) above it.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	return readBodyAs(w, r, limit, writeError)
}

// readBodyAs is readBody answering its errors with writeError.
func readBodyAs(w http.ResponseWriter, r *http.Request, limit int64, writeError errWriter) ([]byte, bool) {
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, anthropic.ErrRequestTooLarge, "Request exceeds the maximum allowed number of bytes.")
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if int64(len(b)) > limit {
		writeError(w, http.StatusRequestEntityTooLarge, anthropic.ErrRequestTooLarge, "Request exceeds the maximum allowed number of bytes.")
		return nil, false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		writeError(w, http.StatusRequestTimeout, anthropic.ErrTimeout, "the request body was not received within the gateway's body timeout")
		return nil, false
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, "could not read the request body")
		return nil, false
	}
	return b, true
}

// msgParams is what the gateway reads of a Messages body.
type msgParams struct {
	Model     string `json:"model"`
	MaxTokens *int64 `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

const invalidJSON = "There was an error parsing the body of your request: invalid JSON"

// parseParams checks a Messages body as far as the gateway must (valid
// JSON, model, max_tokens) and returns its fields. Whether the model is
// known is the upstream's to say (unknown.go).
func (g *Gateway) parseParams(body []byte, needMax bool) (msgParams, string) {
	var p msgParams
	if err := json.Unmarshal(body, &p); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return p, fmt.Sprintf("%s: Input should be a valid %s", te.Field, te.Value)
		}
		return p, invalidJSON
	}
	if p.Model == "" {
		return p, "model: Field required"
	}
	if needMax && p.MaxTokens == nil {
		return p, "max_tokens: Field required"
	}
	if p.MaxTokens != nil && *p.MaxTokens < 0 {
		return p, "max_tokens: Input should be greater than or equal to 0"
	}
	return p, ""
}

// messages serves POST /v1/messages, streaming or not.
func (g *Gateway) messages(w http.ResponseWriter, r *http.Request, client string) {
	g.stats.requests.Add(1)
	body, ok := readBody(w, r, MaxMessagesBytes)
	if !ok {
		return
	}
	p, bad := g.parseParams(body, true)
	if bad != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, bad)
		return
	}
	class, ok := g.classOf(w, r, client)
	if !ok {
		return
	}
	price, estimated, refused := g.priceFor(client, p.Model)
	if refused != "" {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, refused)
		return
	}
	tk, answered := g.fromCache(w, r, client, body, p)
	if answered {
		return
	}
	var success *won
	defer func() { tk.finish(success) }()
	est := workload.EstimateInputTokens(body)
	// At the price the answer will be recorded at: the model's own, or for
	// a model without one its pool's dearest known model's.
	worst := worstAt(price, p.Model, body, *p.MaxTokens, false)
	hold, err := g.reserve(client, worst)
	if err != nil {
		g.stats.refusedCap.Add(1)
		writeCapError(w, err)
		return
	}
	g.discover() // the first work to send: learn the keys' organisations
	x := &exchange{g: g, w: w, r: r, client: client, class: class, body: body, p: p, price: price, estimated: estimated, hold: hold, worst: worst,
		prov: upstreampkg.Anthropic, item: upstreampkg.Item{Model: p.Model, EstInput: est, Length: int64(len(body)), MaxTokens: *p.MaxTokens},
		demand: gate.Demand{EstInput: est, MaxTokens: *p.MaxTokens}, pre: prefixOf(p.Model, body)}
	x.run()
	success = x.success
}

// classOf is the class of r: client's own, or lower if its
// x-apidispatch-priority header says bulk. The header never raises a
// request above its client's class: a client the operator marked bulk
// would otherwise be admitted before every bulk client by saying
// interactive. A header that names no class is answered 400 (false).
func (g *Gateway) classOf(w http.ResponseWriter, r *http.Request, client string) (Class, bool) {
	return g.classOfAs(w, r, client, writeError)
}

// classOfAs is classOf answering its error with writeError.
func (g *Gateway) classOfAs(w http.ResponseWriter, r *http.Request, client string, writeError errWriter) (Class, bool) {
	own := g.lanes.classOf(client)
	v := r.Header.Get(headerPriority)
	if v == "" {
		return own, true
	}
	c, err := ParseClass(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest, headerPriority+": "+err.Error())
		return 0, false
	}
	return max(c, own), true // Bulk > Interactive: the later class wins
}

// writeCapError answers a request refused by a spend cap: 400
// invalid_request_error (which no SDK retries), worded as the API words a
// self-set spend limit, naming the cap.
//
// A cap that cannot be judged (the shared spend budget's Redis is out of
// reach) is answered 529 overloaded_error, which SDKs retry: the request
// is refused, never sent past the cap, and may pass once Redis answers.
func writeCapError(w http.ResponseWriter, err error) {
	if errors.Is(err, spend.ErrUnavailable) {
		writeError(w, 529, anthropic.ErrOverloaded, "apidispatch gateway: the request was not sent: a spend cap applies to it and cannot be checked now: "+err.Error())
		return
	}
	writeError(w, http.StatusBadRequest, anthropic.ErrInvalidRequest,
		anthropic.SpendLimitMessagePrefix+" API usage limits on this gateway: "+err.Error())
}

// exchange is one client request through the gateway: a Messages
// request, or a chat completion of an OpenAI client (chat.go). What is
// the API's own (the endpoint and its headers, the classifier, usage and
// cost, the pool, the stream's events, the error envelope) comes from
// prov; everything else (admission, reservation, the journal, the
// attempts, settling) is one.
type exchange struct {
	g      *Gateway
	prov   *upstreampkg.Provider
	item   upstreampkg.Item // what the upstream layer reads of it
	chat   *chatParams      // an OpenAI request's own (nil: Anthropic)
	w      http.ResponseWriter
	r      *http.Request
	client string
	class  Class // its priority class in the lanes' queue
	body   []byte
	p      msgParams
	hold   *hold
	worst  cost.Nanos // one attempt's worst case, reserved in hold
	id     int64      // the exchange's id in the spend journal (0: none yet)
	// call is the current attempt's request (nil: none went out).
	call     *upstreampkg.Call
	demand   gate.Demand
	attempts int
	settled  bool
	success  *won // the upstream success of a non-streaming request, for the cache
	// pre is the prompt-cache prefix the request marks (nil: none); note
	// the current attempt's record of it (affinity.go).
	pre  *promptcache.Prefix
	note *cacheNote
	// price prices its answers; estimated: it is borrowed (unknown.go).
	price     *cost.Price
	estimated bool
}

func (x *exchange) settle(e Entry) {
	if !x.settled {
		x.settled = true
		e.Model = x.p.Model
		e.Route = "sync"
		e.Estimated = x.estimated && e.Cost > 0
		x.hold.Settle(e)
	}
}

// run sends the request until it has a final answer, the client goes away
// or RetryFor passes.
func (x *exchange) run() {
	g := x.g
	defer x.settle(Entry{})
	ctx := x.r.Context()
	deadline := time.Now().Add(g.cfg.RetryFor)
	var last *answer
	transient := 0
	for {
		gr, err := g.lanes.admit(ctx, deadline, x.prov, x.p.Model, x.demand, x.pre, x.client, x.class)
		x.note = gr.note
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return // the client went away before anything was sent
			case errors.Is(err, ErrDraining):
				x.draining(msgStopping)
			case last != nil:
				x.passOn(last, nil, 0)
			case errors.Is(err, ErrNoUsableOrg):
				x.fail(http.StatusServiceUnavailable, anthropic.ErrAPI, "apidispatch gateway: no org can serve model "+x.p.Model+" now (every key is out of rotation)")
			default:
				x.rateLimited()
			}
			return
		}
		x.attempts++
		if !x.journalSent(gr) {
			return
		}
		g.stats.upstreamAttempts.Add(1)
		var o anthropic.Outcome
		var a *answer
		var done bool
		if x.p.Stream {
			o, a, done = x.stream(gr)
		} else {
			o, a, done = x.sync(gr)
		}
		unread := o.Kind == anthropic.Retryable && x.mayHaveBilled(o)
		if unread {
			// Billed without an answer: its worst case is counted for good
			// (its cost cannot be known), whether the client waits for a
			// retry or went away.
			x.settle(Entry{Cost: x.worst, Unread: x.worst, Org: gr.lane.up.Name, Abandoned: ctx.Err() != nil})
		}
		g.journal.ended(x.id, int64(x.attempts)) // after its ledger entry
		if done {
			return
		}
		if o.Kind == anthropic.LaneFatal {
			if fault := x.refusal(gr.lane.up, o); fault != keyRefused {
				// Not the key's fault: the org stays in rotation.
				if fault == clientRefused {
					x.passOn(a, gr.lane, 0)
					return
				}
				o.Kind = anthropic.Retryable // the probe could not tell: again, after a back-off
			}
		}
		switch o.Kind {
		case anthropic.LaneFatal:
			// The upstream key's problem, not the client's: out of rotation.
			g.lanes.disable(gr.lane, o.Scope, o.Reason)
			if o.Scope == anthropic.ScopeOrg {
				g.log.Warn("org out of rotation", "org", gr.lane.up.Name, "key", gr.lane.up.Key.Fingerprint(), "reason", o.Reason)
			}
			continue
		case anthropic.Retryable:
			if unread {
				// The retry needs room of its own under the caps.
				hold, err := g.reserve(x.client, x.worst)
				if err != nil {
					g.stats.refusedCap.Add(1)
					x.capError(err)
					return
				}
				x.hold, x.settled = hold, false
			}
			g.stats.retries.Add(1)
			if o.RateLimited {
				g.stats.rateLimited.Add(1)
			}
			last = a
			if ctx.Err() != nil {
				return
			}
			var wait time.Duration
			if !gate.Congested(o) { // a 429 or 529 holds its lane; others may take it now
				transient++
				wait = gate.RetryWait(o, transient, g.cfg.Speed, rand.Float64())
			}
			if time.Now().Add(wait).After(deadline) {
				x.passOn(last, nil, 0)
				return
			}
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-g.life.draining:
					t.Stop()
					x.draining(msgStopping)
					return
				case <-t.C:
				}
			}
		}
	}
}

// journalSent journals the attempt about to be sent on gr (the spend
// journal, journal.go), durably, before anything goes out. When the
// journal cannot be written the request is not sent: the client gets the
// API's 503 (its spend could not be kept safe from a crash) and false.
func (x *exchange) journalSent(gr grant) bool {
	g := x.g
	if x.id == 0 {
		x.id = g.journal.next.Add(1)
	}
	err := g.journal.sent(x.id, int64(x.attempts), x.worst, spendTag{Client: x.client, Org: gr.lane.up.Name, Model: x.p.Model, MaxTokens: maxTokensOf(x.p)})
	if err == nil {
		return true
	}
	g.lanes.release(gr, gate.Feedback{})
	g.log.Error("not sent: the spend journal cannot be written", "error", err)
	x.fail(http.StatusServiceUnavailable, anthropic.ErrAPI, "apidispatch gateway: the request was not sent: its spend could not be journaled ("+err.Error()+")")
	return false
}

// errLeaseEnded: the shared lease the attempt was admitted on ended
// before it went out (see gate.Permit.Until); it is not sent.
var errLeaseEnded = errors.New("not sent: the shared lease ended before the request went out")

// errDraining: the gateway began to stop after the attempt was admitted
// and before it went out; it is not sent.
var errDraining = errors.New("not sent: the gateway is stopping")

// newUpstream builds the upstream request of one attempt. Its context is
// not the client's: a request sent is let finish and billed even when the
// client goes away (only Abort cuts it). An attempt whose lease has ended,
// or admitted just before the gateway began to stop, is not built.
func (x *exchange) newUpstream(ctx context.Context, gr grant) (*http.Request, error) {
	l := gr.lane
	x.call = nil
	if gr.permit.Lapsed(time.Now()) {
		return nil, errLeaseEnded
	}
	if x.g.life.isDraining() {
		return nil, errDraining
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.g.base+x.prov.Endpoint(), bytes.NewReader(x.body))
	if err != nil {
		return nil, err
	}
	if x.prov == upstreampkg.Anthropic {
		copyClientHeaders(req.Header, x.r.Header)
	}
	x.prov.SetHeaders(req.Header, l.up.Org, true)
	return req, nil
}

// copyClientHeaders passes the client's API headers on (version, betas),
// never its token.
func copyClientHeaders(dst, src http.Header) {
	v := src.Get(anthropic.HeaderVersion)
	if v == "" {
		v = upstreamVersion
	}
	dst.Set(anthropic.HeaderVersion, v)
	if b := src.Values("anthropic-beta"); len(b) > 0 {
		dst["Anthropic-Beta"] = b
	}
}

// feedback is what an attempt with usage u (nil: none known) teaches its
// lane (upstream.Provider.Feedback), and its cost: a Messages answer's at
// x.price (which may be an estimate, unknown.go), another's at its
// provider's price.
func (x *exchange) feedback(o anthropic.Outcome, h http.Header, u *upstreampkg.Usage) (gate.Feedback, cost.Nanos) {
	var au *anthropic.Usage
	if u != nil {
		au = u.Anthropic
	}
	x.noteCache(o, au)
	var c cost.Nanos
	switch {
	case au != nil:
		c, _ = x.price.Cost(*au, false)
	case u != nil:
		c, _ = x.prov.Cost(x.g.cfg.Prices, x.p.Model, u, false)
	}
	return x.prov.Feedback(o, h, time.Now(), u, x.item, c), c
}

// send sends req, built by newUpstream (err: why it was not), as the
// current attempt x.call, and waits for its answer's head.
func (x *exchange) send(req *http.Request, err error) *upstreampkg.Call {
	if err != nil {
		x.call = upstreampkg.NotSent(err)
	} else {
		x.call = x.prov.Begin(x.g.client, req, nil)
	}
	return x.call
}

// sync is one non-streaming attempt. done reports that the exchange is
// over (answered, or the client is gone and the answer billed).
func (x *exchange) sync(gr grant) (anthropic.Outcome, *answer, bool) {
	g := x.g
	ctx, cancel := apihttp.AttemptContext(g.life.cutCtx, g.cfg.Timeout)
	defer cancel()
	r := x.send(x.newUpstream(ctx, gr)).Finish(maxUpstreamAnswer)
	status, hdr, rb, o := r.Status, r.Header, r.Body, r.Outcome
	if o.Kind == anthropic.Retryable && g.life.cutting() {
		return x.cutAtExit(gr, o, hdr)
	}
	usage := r.Usage
	fb, c := x.feedback(o, hdr, usage)
	g.lanes.release(gr, fb)
	if hdr != nil {
		g.rl.note(gr.lane.pool, gr.lane.up, fb.Limits)
	}
	a := &answer{status: status, header: hdr, body: rb}
	if status == 0 {
		a = &answer{status: http.StatusBadGateway, body: x.errorBody(anthropic.ErrAPI, "apidispatch gateway: upstream "+o.Reason)}
	}
	gone := x.r.Context().Err() != nil
	switch o.Kind {
	case anthropic.Success:
		if usage != nil && usage.Anthropic != nil {
			x.success = &won{body: rb, cost: c, usage: *usage.Anthropic, org: gr.lane.up.Name, requestID: x.prov.RequestID(hdr), simulated: simulated(hdr)}
		}
		x.settle(Entry{Cost: c, Org: gr.lane.up.Name, RequestID: x.prov.RequestID(hdr), Abandoned: gone})
		if gone {
			g.stats.abandoned.Add(1)
			return o, nil, true
		}
		x.passOn(a, gr.lane, c)
		return o, a, true
	case anthropic.Terminal:
		x.passOn(a, gr.lane, 0)
		return o, a, true
	}
	if gone {
		return o, a, true
	}
	return o, a, false
}

// errorBody is an API error envelope.
func errorBody(typ, msg string) []byte {
	b, _ := json.Marshal(anthropic.ErrorEnvelope{Type: "error", Error: anthropic.ErrorDetail{Type: typ, Message: msg}, RequestID: newRequestID()})
	return b
}

// hopHeaders are not passed on from upstream.
var hopHeaders = map[string]bool{
	"Content-Length": true, "Connection": true, "Keep-Alive": true, "Transfer-Encoding": true,
	"Anthropic-Organization-Id": true, "Openai-Organization": true, "Openai-Project": true, "Trailer": true, "Upgrade": true, "Proxy-Connection": true,
}

// writeHead writes the headers of an answer passed on: upstream's (the
// request-id, retry-after, content-type…), the aggregate rate limits and
// the gateway's own.
func (x *exchange) writeHead(a *answer, l *lane, c cost.Nanos) {
	h := x.w.Header()
	for k, v := range a.header {
		if !hopHeaders[k] {
			h[k] = v
		}
	}
	if h.Get("content-type") == "" {
		h.Set("content-type", "application/json")
	}
	if l != nil {
		x.writeLimits(h, l.pool)
		h.Set(headerOrg, l.up.Name)
	} else {
		// An answer passed on after the last attempt: the pool's
		// aggregate, not the last org's own headers.
		x.writeLimits(h, x.prov.PoolOf(x.p.Model))
	}
	h.Set(headerAttempts, strconv.Itoa(x.attempts))
	h.Set(headerCost, strconv.FormatFloat(c.USD(), 'f', -1, 64))
}

// passOn answers the client with a, byte for byte.
func (x *exchange) passOn(a *answer, l *lane, c cost.Nanos) {
	x.writeHead(a, l, c)
	if a.header == nil {
		x.w.Header().Set(x.requestIDHeader(), newRequestID())
	}
	x.w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	x.w.WriteHeader(a.status)
	x.w.Write(a.body)
}

// stream is one streaming attempt. Until the first byte reaches the
// client a failure is retryable; after it, an upstream error is forwarded
// as the API's SSE error event and the exchange is over.
func (x *exchange) stream(gr grant) (anthropic.Outcome, *answer, bool) {
	g := x.g
	ctx, cancel := apihttp.AttemptContext(g.life.cutCtx, g.cfg.Timeout)
	defer cancel()
	call := x.send(x.newUpstream(ctx, gr))
	resp := call.Resp
	if resp == nil || resp.StatusCode != http.StatusOK || !isEventStream(resp.Header) {
		// Not a stream: classify as a plain answer.
		r := call.Finish(maxUpstreamAnswer)
		status, hdr, rb, o := r.Status, r.Header, r.Body, r.Outcome
		if o.Kind == anthropic.Retryable && g.life.cutting() {
			return x.cutAtExit(gr, o, hdr)
		}
		if o.Kind == anthropic.Success {
			// A 200 JSON message to a stream request: pass it on as is.
			fb, c := x.feedback(o, hdr, r.Usage)
			g.lanes.release(gr, fb)
			x.settle(Entry{Cost: c, Org: gr.lane.up.Name, RequestID: x.prov.RequestID(hdr), Abandoned: x.r.Context().Err() != nil})
			x.passOn(&answer{status: status, header: hdr, body: rb}, gr.lane, c)
			return o, nil, true
		}
		fb, _ := x.feedback(o, hdr, nil)
		g.lanes.release(gr, fb)
		a := &answer{status: status, header: hdr, body: rb}
		if status == 0 {
			a = &answer{status: http.StatusBadGateway, body: x.errorBody(anthropic.ErrAPI, "apidispatch gateway: upstream "+o.Reason)}
		}
		if o.Kind == anthropic.Terminal {
			x.passOn(a, gr.lane, 0)
			return o, a, true
		}
		return o, a, x.r.Context().Err() != nil
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	first, rerr := br.ReadSlice('\n')
	if rerr != nil {
		// Nothing reached the client: retryable, as a truncated body.
		o := anthropic.Outcome{Kind: anthropic.Retryable, Status: resp.StatusCode, ErrorType: anthropic.ErrTypeTruncated, Reason: "stream ended before its first event"}
		if g.life.cutting() {
			return x.cutAtExit(gr, o, resp.Header)
		}
		fb, _ := x.feedback(o, resp.Header, nil)
		g.lanes.release(gr, fb)
		return o, &answer{status: http.StatusBadGateway, body: x.errorBody(anthropic.ErrAPI, "apidispatch gateway: upstream stream ended before its first event")}, x.r.Context().Err() != nil
	}
	g.rl.note(gr.lane.pool, gr.lane.up, x.prov.Limits(resp.Header, time.Now()))
	x.writeHead(&answer{header: resp.Header}, gr.lane, 0)
	h := x.w.Header()
	h.Del(headerCost)
	h.Set("Trailer", headerCost)
	x.w.WriteHeader(http.StatusOK)
	// The client is written to from a queue: the upstream answer is read
	// to its end, and its lane freed, whatever the client reads.
	cw := newClientWriter(x.w)
	write := cw.write
	sc := x.newStreamState()
	line := first
	for {
		if out, ok := sc.pass(line); ok {
			write(out)
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			cw.flush()
		}
		line, rerr = br.ReadSlice('\n')
		if rerr == bufio.ErrBufferFull {
			// A long line: pass it on in pieces.
			for rerr == bufio.ErrBufferFull {
				sc.partial(line)
				write(line)
				line, rerr = br.ReadSlice('\n')
			}
		}
		if rerr != nil {
			if out, ok := sc.pass(line); len(line) > 0 && ok {
				write(out)
			}
			break
		}
	}
	st := sc.end()
	var o anthropic.Outcome
	var usage *upstreampkg.Usage
	atExit := false
	switch {
	case st.done:
		o = anthropic.Outcome{Kind: anthropic.Success, Status: 200}
		usage = st.usage
	case st.errType != "":
		o = anthropic.Outcome{Kind: anthropic.Retryable, Status: 200, ErrorType: st.errType, RateLimited: st.rateLimited, Overloaded: st.overloaded, Reason: "error event mid-stream"}
	case g.life.cutting():
		// Cut by Abort: ended with the API's retryable error event.
		o = anthropic.Outcome{Kind: anthropic.Retryable, Status: 200, ErrorType: anthropic.ErrTypeTruncated, Reason: "stream cut at the gateway's exit"}
		write(x.streamError(anthropic.ErrOverloaded, "apidispatch gateway: "+msgCut))
		atExit = true
	default:
		o = anthropic.Outcome{Kind: anthropic.Retryable, Status: 200, ErrorType: anthropic.ErrTypeTruncated, Reason: "stream cut before its end"}
		write(x.streamError(anthropic.ErrAPI, "apidispatch gateway: the upstream stream was cut before its end ("+sc.endName()+")"))
	}
	cw.flush()
	rid := x.prov.RequestID(resp.Header)
	if atExit {
		x.settle(Entry{Cost: x.worst, Unread: x.worst, Org: gr.lane.up.Name, RequestID: rid, Abandoned: true})
		g.stats.abandoned.Add(1)
		cw.finish() // the permit is kept, not released: see Abort
		h.Set(headerCost, strconv.FormatFloat(x.worst.USD(), 'f', -1, 64))
		return o, nil, true
	}
	fb, c := x.feedback(o, resp.Header, usage)
	gone := cw.failed() || x.r.Context().Err() != nil
	if gone {
		g.stats.abandoned.Add(1)
	}
	switch {
	case usage != nil:
		x.settle(Entry{Cost: c, Org: gr.lane.up.Name, RequestID: rid, Abandoned: gone})
	case st.begun:
		// Ended after message_start without message_stop (cut, reset, or
		// an error event): the API may have billed the whole answer, and
		// what message_start said is only its start. Counted at its worst
		// case, as a non-streaming answer cut after its headers is. (Cut
		// before it, the attempt is unread all the same: run counts it.)
		c = x.worst
		x.settle(Entry{Cost: c, Unread: c, Org: gr.lane.up.Name, RequestID: rid, Abandoned: gone})
	}
	// An error event before message_start ends a stream the API did not
	// start: nothing to price.
	g.lanes.release(gr, fb) // after the ledger: a lane idle means every answer is priced
	cw.finish()
	h.Set(headerCost, strconv.FormatFloat(c.USD(), 'f', -1, 64))
	return o, nil, true
}

func isEventStream(h http.Header) bool {
	ct := h.Get("content-type")
	return len(ct) >= 17 && ct[:17] == "text/event-stream"
}

// streamState follows an upstream stream, line by line, for its usage and
// its end: sseState a Messages stream, oaStreamState a chat completion's.
type streamState interface {
	// pass reads one whole line (or the last piece of a long one) and
	// returns what of it is passed on to the client (false: nothing).
	pass(b []byte) ([]byte, bool)
	// partial reads a piece of a long line (always passed on).
	partial(b []byte)
	end() streamEnd
	// endName names the event that ends the stream whole.
	endName() string
}

// streamEnd is how a stream ended.
type streamEnd struct {
	done  bool               // it ended whole, with its usage
	usage *upstreampkg.Usage // when done
	// begun: the API started the answer (it may have billed it).
	begun bool
	// errType is the type of an error event ("": none); rateLimited and
	// overloaded classify it.
	errType                 string
	rateLimited, overloaded bool
}

func (x *exchange) newStreamState() streamState {
	if x.chat != nil {
		return &oaStreamState{strip: !x.chat.clientUsage}
	}
	return &sseState{}
}

// sseState follows a Messages stream for its usage and its end.
type sseState struct {
	event            string
	usage            anthropic.Usage
	started, stopped bool // message_start read (with its usage), message_stop seen
	begun            bool // a message_start event came, readable or not
	errType          string
	skip             bool // inside a long line already judged
}

func (s *sseState) partial([]byte) { s.skip = true }

func (s *sseState) endName() string { return "message_stop" }

func (s *sseState) pass(b []byte) ([]byte, bool) { return b, s.line(b) }

func (s *sseState) end() streamEnd {
	e := streamEnd{done: s.stopped, begun: s.begun, errType: s.errType,
		rateLimited: s.errType == anthropic.ErrRateLimit, overloaded: s.errType == anthropic.ErrOverloaded}
	if s.stopped {
		u := s.usage
		e.usage = &upstreampkg.Usage{Input: u.InputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens,
			Output: u.OutputTokens, Anthropic: &u}
	}
	return e
}

// line reads one line of the stream; every line is passed on.
func (s *sseState) line(b []byte) bool {
	if s.skip {
		s.skip = false
		return true
	}
	b = bytes.TrimRight(b, "\r\n")
	switch {
	case len(b) == 0:
		s.event = ""
	case bytes.HasPrefix(b, []byte("event:")):
		s.event = string(bytes.TrimSpace(b[6:]))
	case bytes.HasPrefix(b, []byte("data:")):
		data := bytes.TrimSpace(b[5:])
		switch s.event {
		case "message_start":
			s.begun = true
			var v struct {
				Message struct {
					Usage anthropic.Usage `json:"usage"`
				} `json:"message"`
			}
			if json.Unmarshal(data, &v) == nil {
				s.usage, s.started = v.Message.Usage, true
			}
		case "message_delta":
			var v struct {
				Usage *struct {
					OutputTokens             int64  `json:"output_tokens"`
					InputTokens              *int64 `json:"input_tokens"`
					CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
					CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(data, &v) == nil && v.Usage != nil {
				s.usage.OutputTokens = v.Usage.OutputTokens
				if v.Usage.InputTokens != nil {
					s.usage.InputTokens = *v.Usage.InputTokens
				}
				if v.Usage.CacheCreationInputTokens != nil {
					s.usage.CacheCreationInputTokens = *v.Usage.CacheCreationInputTokens
				}
				if v.Usage.CacheReadInputTokens != nil {
					s.usage.CacheReadInputTokens = *v.Usage.CacheReadInputTokens
				}
			}
		case "message_stop":
			s.stopped = true
		case "error":
			var v anthropic.ErrorEnvelope
			if json.Unmarshal(data, &v) == nil && v.Error.Type != "" {
				s.errType = v.Error.Type
			} else {
				s.errType = anthropic.ErrAPI
			}
		}
	}
	return true
}

// mayHaveBilled reports whether a failed attempt may have been billed
// (upstream.MayHaveBilled, the rule of every route).
func (x *exchange) mayHaveBilled(o anthropic.Outcome) bool {
	return upstreampkg.MayHaveBilled(o, x.call != nil && x.call.Wrote())
}

// maxTokensOf is p's max_tokens (0 when it has none).
func maxTokensOf(p msgParams) int64 {
	if p.MaxTokens == nil {
		return 0
	}
	return *p.MaxTokens
}
