package dispatch

import (
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/store"
)

// The sync route's and the cache's results lines keep their shape
// (docs/design.md §3 and §12): the same bytes as before the result line had one
// builder.
func TestSyncAndCacheLineShape(t *testing.T) {
	lane := &laneRef{org: &orgState{Org: org.Org{Name: "high_prio"}}}
	w := &work{it: store.Item{Seq: 7, CustomID: "item_000001"}, attempts: 2}
	envelope := &anthropic.ErrorEnvelope{Type: "error", Error: anthropic.ErrorDetail{Type: "invalid_request_error", Message: "max_tokens: <bad> & \"worse\""}}
	for _, c := range []struct {
		name string
		a    *attempt
		st   store.State
		want string
	}{
		{"succeeded", &attempt{w: w, lane: lane, latency: 1840 * time.Millisecond, body: []byte(`{"id":"msg_1", "type":"message","content":[]}`), reqID: "req_1", costN: 2_130_000}, store.Succeeded,
			`{"custom_id":"item_000001","result":{"type":"succeeded","message":{"id":"msg_1", "type":"message","content":[]}},"dispatch":{"org":"high_prio","route":"sync","attempts":2,"latency_ms":1840,"cost_usd":0.00213,"request_id":"req_1"}}`},
		{"succeeded, a body with line breaks", &attempt{w: w, lane: lane, latency: time.Millisecond, body: []byte("{\"id\":\"msg_1\",\n  \"content\": []}"), costN: 800}, store.Succeeded,
			`{"custom_id":"item_000001","result":{"type":"succeeded","message":{"id":"msg_1","content":[]}},"dispatch":{"org":"high_prio","route":"sync","attempts":2,"latency_ms":1,"cost_usd":8e-7}}`},
		{"errored, the API's envelope", &attempt{w: w, lane: lane, latency: 12 * time.Millisecond, reqID: "req_2", outcome: anthropic.Outcome{ErrorType: "invalid_request_error", Envelope: envelope}}, store.Errored,
			`{"custom_id":"item_000001","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: \u003cbad\u003e \u0026 \"worse\""}}},"dispatch":{"org":"high_prio","route":"sync","attempts":2,"latency_ms":12,"cost_usd":0,"request_id":"req_2"}}`},
		{"errored, a local cause", &attempt{w: w, lane: lane, outcome: anthropic.Outcome{ErrorType: "invalid_request_error", Reason: "400 without a body"}}, store.Errored,
			`{"custom_id":"item_000001","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"400 without a body"}}},"dispatch":{"org":"high_prio","route":"sync","attempts":2,"latency_ms":0,"cost_usd":0}}`},
	} {
		if got := string((&Engine{}).outcome(c.a, c.st).Line); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	hit := hitOutcome(store.Item{Seq: 9, CustomID: "item_000002"}, answer{body: []byte("{\"id\":\"msg_1\",\r\n\"content\":[]}"), org: "low_prio", requestID: "req_3", costN: 2_130_000})
	want := `{"custom_id":"item_000002","result":{"type":"succeeded","message":{"id":"msg_1","content":[]}},"dispatch":{"org":"low_prio","route":"sync","attempts":0,"latency_ms":0,"cost_usd":0.00213,"request_id":"req_3","cached":true,"charged_usd":0}}`
	if got := string(hit.Line); got != want {
		t.Errorf("cache hit:\n got %s\nwant %s", got, want)
	}
}

// BenchmarkOutcomeLine is the sync route's results line for one success,
// built for every answer on the scheduler goroutine.
func BenchmarkOutcomeLine(b *testing.B) {
	body := []byte(`{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello there, how can I help?"}],"stop_reason":"end_turn","usage":{"input_tokens":120,"output_tokens":64}}`)
	a := &attempt{w: &work{it: store.Item{Seq: 7, CustomID: "item_000001"}, attempts: 1}, lane: &laneRef{org: &orgState{Org: org.Org{Name: "high_prio"}}},
		latency: 1840 * time.Millisecond, body: body, reqID: "req_011CUnm2kwQa", costN: 2_130_000}
	e := &Engine{}
	b.ReportAllocs()
	for b.Loop() {
		e.outcome(a, store.Succeeded)
	}
}
