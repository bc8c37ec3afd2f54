package rundir

import (
	"encoding/json"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/store"
)

// Every line ResultLine builds is one JSON object on one line that reads
// back as it was given, whatever the route; batch_id and charged_usd
// appear only on the lines they belong to.
func TestResultLineReadsBack(t *testing.T) {
	for _, d := range []Dispatch{
		{Org: "a", Route: store.RouteSync, Attempts: 2, LatencyMs: 5, Cost: 1_000, RequestID: "req_1"},
		{Org: "b", Route: store.RouteBatch, BatchID: "msgbatch_1", Attempts: 1, LatencyMs: 60_000, Cost: 500},
		{Org: "c", Route: store.RouteSync, Cost: 2_000, RequestID: "req_2", Cached: true},
	} {
		res := SucceededResult([]byte("{\"id\":\"m\",\n\"content\":[{\"text\":\"a\\nb\"}]}"))
		line := ResultLine("id_<1>", res, d)
		var got struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type    string          `json:"type"`
				Message json.RawMessage `json:"message"`
			} `json:"result"`
			Dispatch map[string]any `json:"dispatch"`
		}
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		for _, b := range line {
			if b == '\n' || b == '\r' {
				t.Fatalf("a line break inside the line: %q", line)
			}
		}
		if got.CustomID != "id_<1>" || got.Result.Type != "succeeded" || got.Dispatch["org"] != d.Org || got.Dispatch["route"] != d.Route {
			t.Errorf("read back %+v from %s", got, line)
		}
		_, hasBatch := got.Dispatch["batch_id"]
		_, hasCharged := got.Dispatch["charged_usd"]
		if hasBatch != (d.Route == store.RouteBatch) || hasCharged != d.Cached || (got.Dispatch["cached"] == true) != d.Cached {
			t.Errorf("%+v: batch_id %v, charged_usd %v in %s", d, hasBatch, hasCharged, line)
		}
	}
	e := ErroredResult(anthropic.Outcome{ErrorType: "invalid_request_error", Reason: "bad"})
	if string(e) != `{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}}` {
		t.Errorf("errored result %s", e)
	}
}
