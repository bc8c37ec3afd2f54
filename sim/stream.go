package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/apidispatch/apidispatch/anthropic"
)

// Streaming (stream: true): the same request, admission, rate-limit
// accounting, latency, content and bill as without streaming, sent as the
// API's server-sent events: message_start, then per content block
// content_block_start, (ping after the first,) content_block_delta
// (text_delta, input_json_delta, thinking_delta and signature_delta) and
// content_block_stop, then message_delta with the stop reason and the final
// usage, and message_stop. The rate-limit headers are those at admission.
// message_start comes after the first-token part of the latency, the rest
// after the remainder. FaultStreamOverloaded ends a stream after its first
// block starts with an overloaded_error event.

// deltaBytes is the size of one text, thinking or JSON delta.
const deltaBytes = 24

var (
	sseType     = []string{"text/event-stream; charset=utf-8"}
	noCache     = []string{"no-cache"}
	hCacheCtl   = "Cache-Control"
	sseOverload = `{"type":"error","error":{"type":"` + anthropic.ErrOverloaded + `","message":"Overloaded"}}`
)

// withoutStreamKey returns body without its top-level "stream" member, so
// that a streamed request and the same request unstreamed hash alike (and
// so get the same answer). A body it cannot read is returned as is.
func withoutStreamKey(body []byte) []byte {
	sc := &jsonScanner{b: body}
	from, to := -2, -1 // the member's span; from -1: it is the first member
	prevEnd := -1      // end of the previous member's value; -1 before the first
	ok := sc.object(func(key string) bool {
		_, ok := sc.value()
		if key == "stream" {
			from, to = prevEnd, sc.i
		}
		prevEnd = sc.i
		return ok
	})
	if !ok || to < 0 {
		return body
	}
	if from >= 0 { // cut from the end of the member before: its comma goes too
		return append(append([]byte{}, body[:from]...), body[to:]...)
	}
	// The first member: cut from after '{' to past the comma that follows.
	open := bytes.IndexByte(body, '{') + 1
	rest := to
	for rest < len(body) && (body[rest] == ' ' || body[rest] == '\t' || body[rest] == '\n' || body[rest] == '\r') {
		rest++
	}
	if rest < len(body) && body[rest] == ',' {
		rest++
	}
	return append(append([]byte{}, body[:open]...), body[rest:]...)
}

// streamBlock is one content block of the rendered message.
type streamBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
}

// sseWriter writes events and flushes each.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func (w *sseWriter) event(name string, data []byte) {
	w.buf = append(w.buf[:0], "event: "...)
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, "\ndata: "...)
	w.buf = append(w.buf, data...)
	w.buf = append(w.buf, "\n\n"...)
	w.w.Write(w.buf)
}

func (w *sseWriter) flush() { w.rc.Flush() }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only values built here
	}
	return b
}

// chunks splits s into pieces of about n bytes on rune boundaries.
func chunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		i := n
		for i < len(s) && !utf8.RuneStart(s[i]) {
			i++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// streamMessage answers an admitted stream request: it sleeps, settles and
// bills exactly as the unstreamed path does, and writes the events.
func (s *Server) streamMessage(c *call, ks *keyState, req request, lim *poolLimiter, reserved int64,
	sum [32]byte, u usage, out output, lat time.Duration, admitted limitView) {
	o, pool := ks.org, req.model.pool
	sctx := c.r.Context()
	if s.cfg.BillAbandoned {
		sctx = context.WithoutCancel(sctx)
	}
	// The first-token share of the latency comes before message_start.
	first := s.firstTokenShare(lat, out.tokens)
	abandon := func() {
		now := time.Since(s.start)
		if lim != nil {
			lim.settle(now, s.faults.Load().colleague(o.idx, pool, s.api(now)), 0, reserved)
		}
		o.mu.Lock()
		o.inFlight--
		o.pointLocked(now, s.speed).InFlight = o.inFlight
		o.mu.Unlock()
	}
	if !sleep(sctx, s.real(first)) {
		abandon()
		s.count(o, 499)
		return
	}

	msgID := s.newID("msg_", c.n, 0x3c6ef372fe94f82b)
	var msg struct {
		Content      []streamBlock              `json:"content"`
		StopReason   *string                    `json:"stop_reason"`
		StopSequence *string                    `json:"stop_sequence"`
		Usage        map[string]json.RawMessage `json:"usage"`
	}
	u.output = out.tokens
	full := appendMessage(nil, msgID, req.model.id, out, u)
	var top map[string]json.RawMessage
	if json.Unmarshal(full, &top) != nil || json.Unmarshal(full, &msg) != nil {
		panic("sim: rendered message does not decode") // a bug of appendMessage
	}
	// message_start: the message without content, stop or final output.
	top["content"] = json.RawMessage(`[]`)
	top["stop_reason"] = json.RawMessage(`null`)
	top["stop_sequence"] = json.RawMessage(`null`)
	startUsage := map[string]json.RawMessage{}
	for k, v := range msg.Usage {
		startUsage[k] = v
	}
	startUsage["output_tokens"] = json.RawMessage(mustJSON(min(out.tokens, 1)))
	top["usage"] = mustJSON(startUsage)

	s.rateHeaders(c.h, admitted)
	c.h[hContentType] = sseType
	c.h[hCacheCtl] = noCache
	c.w.WriteHeader(http.StatusOK)
	w := &sseWriter{w: c.w, rc: http.NewResponseController(c.w)}
	w.event("message_start", mustJSON(map[string]any{"type": "message_start", "message": top}))
	w.flush()

	now := time.Since(s.start)
	api := s.api(now)
	fs := s.faults.Load()
	if fs.match(FaultStreamOverloaded, o.idx, pool, ks.fp, api, &c.rng) != nil {
		if len(msg.Content) > 0 {
			w.event("content_block_start", blockStart(0, msg.Content[0]))
			w.event("ping", []byte(`{"type": "ping"}`))
		}
		w.event("error", []byte(sseOverload))
		w.flush()
		abandon()
		s.count(o, 529)
		return
	}
	if !sleep(sctx, s.real(lat-first)) {
		abandon()
		s.count(o, 499)
		return
	}

	wall := time.Now()
	now = wall.Sub(s.start)
	api = s.api(now)
	fs = s.faults.Load()
	if lim != nil {
		lim.settle(now, fs.colleague(o.idx, pool, api), out.tokens, reserved)
	}
	delivery := DeliveryOK
	if fs.match(FaultConnectionReset, o.idx, pool, ks.fp, api, &c.rng) != nil {
		delivery = DeliveryReset
	} else if fs.match(FaultTruncatedBody, o.idx, pool, ks.fp, api, &c.rng) != nil {
		delivery = DeliveryTruncated
	}
	cost := req.model.cost(u)
	s.bill(o, ks, &LedgerEntry{
		RequestID: c.rid, MessageID: msgID, Org: o.name, KeyFingerprint: ks.fp, Model: req.model.id,
		BodySHA256: sum, InputTokens: u.input, OutputTokens: u.output, CacheWrite5m: u.write5m,
		CacheWrite1h: u.write1h, CacheRead: u.read, CostNanos: cost, CostUSD: nanosToUSD(cost),
		Time: wall, APISeconds: float64(api.Microseconds()) / 1e6, Status: http.StatusOK, Delivery: delivery,
		USGeo: u.geoUS,
	}, now)
	if delivery == DeliveryReset {
		panic(http.ErrAbortHandler) // the connection drops mid-stream
	}

	for i, b := range msg.Content {
		w.event("content_block_start", blockStart(i, b))
		if i == 0 {
			w.event("ping", []byte(`{"type": "ping"}`))
		}
		delta := func(d map[string]any) {
			w.event("content_block_delta", mustJSON(map[string]any{"type": "content_block_delta", "index": i, "delta": d}))
		}
		switch b.Type {
		case "text":
			for _, p := range chunks(b.Text, deltaBytes) {
				delta(map[string]any{"type": "text_delta", "text": p})
			}
		case "thinking":
			for _, p := range chunks(b.Thinking, deltaBytes) {
				delta(map[string]any{"type": "thinking_delta", "thinking": p})
			}
			delta(map[string]any{"type": "signature_delta", "signature": b.Signature})
		case "tool_use":
			for _, p := range chunks(string(b.Input), deltaBytes) {
				delta(map[string]any{"type": "input_json_delta", "partial_json": p})
			}
		}
		if delivery == DeliveryTruncated {
			w.flush()
			panic(http.ErrAbortHandler) // half a stream, then the connection closes
		}
		w.event("content_block_stop", mustJSON(map[string]any{"type": "content_block_stop", "index": i}))
	}
	if len(msg.Content) == 0 {
		w.event("ping", []byte(`{"type": "ping"}`))
		if delivery == DeliveryTruncated {
			w.flush()
			panic(http.ErrAbortHandler)
		}
	}
	final := map[string]json.RawMessage{}
	for _, k := range []string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens", "server_tool_use"} {
		if v, ok := msg.Usage[k]; ok {
			final[k] = v
		}
	}
	w.event("message_delta", mustJSON(map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": msg.StopReason, "stop_sequence": msg.StopSequence}, "usage": final}))
	w.event("message_stop", []byte(`{"type":"message_stop"}`))
	w.flush()
}

// blockStart is the content_block_start event of block b: the block with
// its streamed parts empty.
func blockStart(i int, b streamBlock) []byte {
	var cb any
	switch b.Type {
	case "thinking":
		cb = map[string]any{"type": "thinking", "thinking": "", "signature": ""}
	case "tool_use":
		cb = map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": map[string]any{}}
	default:
		cb = map[string]any{"type": "text", "text": ""}
	}
	return mustJSON(map[string]any{"type": "content_block_start", "index": i, "content_block": cb})
}
