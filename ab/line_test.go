package ab

import (
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/rundir"
)

// The legacy arm's results lines have the sync route's shape (docs/design.md §3
// and §12): the same bytes as before the result line had one builder.
func TestLegacyLineShape(t *testing.T) {
	envelope := &anthropic.ErrorEnvelope{Type: "error", Error: anthropic.ErrorDetail{Type: "overloaded_error", Message: "Overloaded"}}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"succeeded", resultLine("item_000001", succeededResult([]byte(`{"id": "msg_1",`+"\n"+`"content":[]}`)), "a", 3, 10, 2_130_000, "req_1"),
			`{"custom_id":"item_000001","result":{"type":"succeeded","message":{"id":"msg_1","content":[]}},"dispatch":{"org":"a","route":"sync","attempts":3,"latency_ms":10,"cost_usd":0.00213,"request_id":"req_1"}}`},
		{"errored", resultLine("item_000002", rundir.ErroredResult(anthropic.Outcome{ErrorType: "overloaded_error", Envelope: envelope}), "a", 4, 20, 0, ""),
			`{"custom_id":"item_000002","result":{"type":"errored","error":{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}},"dispatch":{"org":"a","route":"sync","attempts":4,"latency_ms":20,"cost_usd":0}}`},
	} {
		if string(c.got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, c.got, c.want)
		}
	}
}
