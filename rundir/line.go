package rundir

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
)

// Dispatch is the "dispatch" object of a results line (docs/design.md §3 and
// §12): which org and route carried the item, and what it took. Every
// writer of results.jsonl (the sync engine, the cache's hits, the batch
// route, A/B's legacy arm) fills one in and builds its line with
// ResultLine.
type Dispatch struct {
	Org string
	// Route is store.RouteSync or store.RouteBatch: the API that carried
	// the request. A cache hit names the sync route, which sent the
	// request it is answered by.
	Route string
	// BatchID is the Message Batches id the item came back in; a line of
	// the batch route always has one.
	BatchID   string
	Attempts  int64
	LatencyMs int64
	// Cost is what the answer cost from its usage (for a cache hit, what
	// it cost when it was sent).
	Cost cost.Nanos
	// RequestID is the API's request-id of the answer, when known.
	RequestID string
	// Cached marks an item answered by the result cache: its line says it
	// charged this run nothing.
	Cached bool
}

// dispatchJSON is Dispatch on the wire: batch_id only on the batch
// route's lines (always there), charged_usd only on a cache hit's.
type dispatchJSON struct {
	Org        string   `json:"org"`
	Route      string   `json:"route"`
	BatchID    *string  `json:"batch_id,omitempty"`
	Attempts   int64    `json:"attempts"`
	LatencyMs  int64    `json:"latency_ms"`
	CostUSD    float64  `json:"cost_usd"`
	RequestID  string   `json:"request_id,omitempty"`
	Cached     bool     `json:"cached,omitempty"`
	ChargedUSD *float64 `json:"charged_usd,omitempty"`
}

// ResultLine is one line of results.jsonl, without its newline: the
// item's custom_id, its result object (JSON on one line: SucceededResult,
// ErroredResult, or the batch API's own) and the dispatch object.
func ResultLine(customID string, result []byte, d Dispatch) []byte {
	w := d.json()
	dj, _ := json.Marshal(w) // strings, integers and finite floats: never fails
	id, _ := json.Marshal(customID)
	line := make([]byte, 0, len(result)+len(dj)+len(id)+40)
	line = append(line, `{"custom_id":`...)
	line = append(line, id...)
	line = append(line, `,"result":`...)
	line = append(line, result...)
	line = append(line, `,"dispatch":`...)
	line = append(line, dj...)
	return append(line, '}')
}

// SucceededResult is the Message Batches "succeeded" result object of an
// answer's body, as the API sent it: only a body with line breaks is
// compacted, so that the line stays one line.
func SucceededResult(message []byte) []byte {
	const head = `{"type":"succeeded","message":`
	res := make([]byte, 0, len(head)+len(message)+1)
	res = append(res, head...)
	if bytes.IndexByte(message, '\n') < 0 && bytes.IndexByte(message, '\r') < 0 {
		res = append(res, message...)
	} else {
		buf := bytes.NewBuffer(res)
		if json.Compact(buf, message) != nil {
			buf.Truncate(len(head))
			buf.Write(message)
		}
		res = buf.Bytes()
	}
	return append(res, '}')
}

// ErroredResult is the "errored" result object of a terminal failure: the
// API's error envelope when it sent one, else one naming the local cause.
func ErroredResult(o anthropic.Outcome) []byte {
	env := anthropic.ErrorEnvelope{Type: "error", Error: anthropic.ErrorDetail{Type: o.ErrorType, Message: o.Reason}}
	if o.Envelope != nil {
		env = *o.Envelope
	}
	e, _ := json.Marshal(env)
	return append(append([]byte(`{"type":"errored","error":`), e...), '}')
}

// OpenAIResultLine is the results.jsonl line of an OpenAI item, without
// its newline: the OpenAI Batch API's output line, so that a reader of
// OpenAI batch results reads it as it is,
//
//	{"id": "batch_req_…", "custom_id": …,
//	 "response": {"status_code": …, "request_id": …, "body": {…}},
//	 "error": null, "dispatch": {…}}
//
// with the API's answer body (a chat completion, or its error envelope)
// when status is not 0, and otherwise no response and an error object
// {"code", "message"} naming the local cause. The dispatch object is
// apidispatch's, as on every line. The id is derived from the custom_id
// and the request id, so a rebuilt line is the same line.
func OpenAIResultLine(customID string, status int, body []byte, errCode, errMsg string, d Dispatch) []byte {
	type response struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	}
	type lineError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	w := d.json()
	sum := sha256.Sum256([]byte(customID + "\x00" + d.RequestID))
	v := struct {
		ID       string       `json:"id"`
		CustomID string       `json:"custom_id"`
		Response *response    `json:"response"`
		Error    *lineError   `json:"error"`
		Dispatch dispatchJSON `json:"dispatch"`
	}{ID: "batch_req_" + hex.EncodeToString(sum[:16]), CustomID: customID, Dispatch: w}
	if status != 0 {
		b := bytes.TrimSpace(body)
		if !json.Valid(b) {
			// Not JSON (a proxy's page): kept as a string, so the line
			// stays one JSON value.
			b, _ = json.Marshal(string(b))
		}
		v.Response = &response{StatusCode: status, RequestID: d.RequestID, Body: b}
	} else {
		v.Error = &lineError{Code: errCode, Message: errMsg}
	}
	line, _ := json.Marshal(v) // compacts the body: one line
	return line
}

// json is d as a result line writes it: the batch id only for the batch
// route, charged_usd 0 for an answer the cache gave.
func (d Dispatch) json() dispatchJSON {
	w := dispatchJSON{Org: d.Org, Route: d.Route, Attempts: d.Attempts, LatencyMs: d.LatencyMs,
		CostUSD: d.Cost.USD(), RequestID: d.RequestID, Cached: d.Cached}
	if d.Route == store.RouteBatch {
		w.BatchID = &d.BatchID
	}
	if d.Cached {
		w.ChargedUSD = new(float64)
	}
	return w
}
