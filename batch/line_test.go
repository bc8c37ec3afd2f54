package batch

import (
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
)

// The batch route's results lines keep their shape (docs/design.md §3 and
// §12): the API's result object compacted, and batch_id with no
// request_id; the same bytes as before the result line had one builder.
func TestBatchLineShape(t *testing.T) {
	b := &rec{BatchRecord: store.BatchRecord{Org: "high_prio", ID: "msgbatch_01"}, org: &orgState{cl: messagesAPI{}}}
	it := &store.BatchItem{Item: store.Item{Seq: 3, CustomID: "item_000003"}, Batches: 1}
	for _, c := range []struct {
		name   string
		st     store.State
		result string
		want   string
	}{
		{"succeeded", store.Succeeded, `{"type": "succeeded", "message": {"id": "msg_1"}}`,
			`{"custom_id":"item_000003","result":{"type":"succeeded","message":{"id":"msg_1"}},"dispatch":{"org":"high_prio","route":"batch","batch_id":"msgbatch_01","attempts":1,"latency_ms":60000,"cost_usd":0.001065}}`},
		{"errored", store.Errored, `{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"<no>"}}}`,
			`{"custom_id":"item_000003","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"<no>"}}},"dispatch":{"org":"high_prio","route":"batch","batch_id":"msgbatch_01","attempts":1,"latency_ms":60000,"cost_usd":0}}`},
	} {
		var c1 int64
		if c.st == store.Succeeded {
			c1 = 1_065_000
		}
		o := (&Route{}).outcome(b, it, c.st, &result{raw: []byte(c.result)}, cost.Nanos(c1), time.Minute)
		if got := string(o.Line); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}
