package rundir

import (
	"bytes"
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
	w := dispatchJSON{Org: d.Org, Route: d.Route, Attempts: d.Attempts, LatencyMs: d.LatencyMs,
		CostUSD: d.Cost.USD(), RequestID: d.RequestID, Cached: d.Cached}
	if d.Route == store.RouteBatch {
		w.BatchID = &d.BatchID
	}
	if d.Cached {
		w.ChargedUSD = new(float64)
	}
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
