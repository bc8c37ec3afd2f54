package rundir

import (
	"bytes"
	"encoding/json"
	"strings"
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

// An OpenAI item's line is the OpenAI Batch API's output line (with the
// dispatch object beside it): a success, an API error, a local error.
func TestOpenAIResultLine(t *testing.T) {
	t.Parallel()
	d := Dispatch{Org: "gpt_a", Route: store.RouteSync, Attempts: 2, RequestID: "req_1", Cost: 1234}
	type line struct {
		ID       string `json:"id"`
		CustomID string `json:"custom_id"`
		Response *struct {
			StatusCode int             `json:"status_code"`
			RequestID  string          `json:"request_id"`
			Body       json.RawMessage `json:"body"`
		} `json:"response"`
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Dispatch struct {
			Org     string  `json:"org"`
			CostUSD float64 `json:"cost_usd"`
		} `json:"dispatch"`
	}
	read := func(b []byte) line {
		t.Helper()
		if bytes.ContainsAny(b, "\n\r") {
			t.Fatalf("not one line: %q", b)
		}
		var l line
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	ok := read(OpenAIResultLine("c1", 200, []byte("{\"id\":\"chatcmpl-1\",\n\"object\":\"chat.completion\"}"), "", "", d))
	if !strings.HasPrefix(ok.ID, "batch_req_") || ok.CustomID != "c1" || ok.Response == nil || ok.Response.StatusCode != 200 ||
		ok.Response.RequestID != "req_1" || string(ok.Response.Body) != `{"id":"chatcmpl-1","object":"chat.completion"}` || ok.Error != nil || ok.Dispatch.Org != "gpt_a" {
		t.Fatalf("success line %+v", ok)
	}
	bad := read(OpenAIResultLine("c2", 400, []byte(`{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`), "", "", d))
	if bad.Response == nil || bad.Response.StatusCode != 400 || !strings.Contains(string(bad.Response.Body), "invalid_request_error") {
		t.Fatalf("API error line %+v", bad)
	}
	local := read(OpenAIResultLine("c3", 0, nil, "invalid_response", "not a completion", d))
	if local.Response != nil || local.Error == nil || local.Error.Code != "invalid_response" {
		t.Fatalf("local error line %+v", local)
	}
	if again := OpenAIResultLine("c1", 200, []byte(`{}`), "", "", d); read(again).ID != ok.ID {
		t.Fatal("the id is not stable")
	}
}
