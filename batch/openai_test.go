package batch

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
)

// The lines of an OpenAI batch's output and error files read as the sync
// route reads the same answers: a completion is done (its usage priced),
// a 400 is terminal and kept, a 500 or 429 is sent again, and a request
// the batch never ran (expired, cancelled) is sent again; the results line
// of a kept answer is the OpenAI batch output line, with the answer's
// request id.
func TestOpenAIResultLines(t *testing.T) {
	completion := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4.1-mini-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"ok","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},"system_fingerprint":null}`
	bad := `{"error":{"message":"Invalid 'n': must be at least 1.","type":"invalid_request_error","param":"n","code":"integer_below_min_value"}}`
	server := `{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}`
	limited := `{"error":{"message":"Rate limit reached","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
	resp := func(status int, body string) string {
		return `{"id":"batch_req_1","custom_id":"p_1","response":{"status_code":` + strconv.Itoa(status) + `,"request_id":"req_1","body":` + body + `},"error":null}`
	}
	notRun := func(code string) string {
		return `{"id":"batch_req_1","custom_id":"p_1","response":null,"error":{"code":"` + code + `","message":"not run"}}`
	}
	for _, tc := range []struct {
		name    string
		line    string
		kind    resultKind
		errType string
		expired bool
	}{
		{"completion", resp(200, completion), resultSucceeded, "", false},
		{"400", resp(400, bad), resultErrored, openai.ErrInvalidRequest, false},
		{"500", resp(500, server), resultRetry, "", false},
		{"429", resp(429, limited), resultRetry, "", false},
		{"expired", notRun(openai.CodeBatchExpired), resultRetry, "", true},
		{"cancelled", notRun(openai.CodeBatchCancelled), resultRetry, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := openaiAPI{}.parse([]byte(tc.line))
			if err != nil || r.customID != "p_1" || r.kind != tc.kind || r.expired != tc.expired || (tc.errType != "" && r.errType != tc.errType) {
				t.Fatalf("parse: %+v, %v; want kind %d, error type %q, expired %v", r, err, tc.kind, tc.errType, tc.expired)
			}
			if tc.kind == resultSucceeded && (r.usage == nil || r.usage.Input != 100 || r.usage.Output != 20 || r.usage.OpenAI == nil) {
				t.Fatalf("usage %+v", r.usage)
			}
			if tc.kind == resultRetry {
				return
			}
			line := openaiAPI{}.line("item_1", &r, rundir.Dispatch{Org: "gpt", Route: store.RouteBatch, BatchID: "batch_1", Attempts: 1})
			var v openai.BatchOutputLine
			if err := json.Unmarshal(line, &v); err != nil || v.CustomID != "item_1" || v.Response == nil || v.Response.StatusCode != r.status ||
				v.Response.RequestID != "req_1" || !strings.Contains(string(line), `"batch_id":"batch_1"`) {
				t.Fatalf("results line %s (%v)", line, err)
			}
		})
	}
}
