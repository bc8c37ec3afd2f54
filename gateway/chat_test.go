package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// The attempts a dead gateway left in flight on an OpenAI org hold a slot
// of that org's lane of their model, OpenAI's pool, not an Anthropic pool
// of the same name no OpenAI lane is in.
func TestDeadOpenAIAttemptHeldInItsModelsPool(t *testing.T) {
	orgs := []*upstream{{Org: org.Org{Name: "claude"}}, {Org: org.Org{Name: "gpt", Provider: org.OpenAI}}}
	s := newLaneSet(orgs, gate.LaneConfig{}, func(*upstreampkg.Provider, string) int { return 2 }, 10, nil, nil)
	s.holdDead([]spendTag{{Org: "gpt", Model: "gpt-4.1-mini", MaxTokens: 200}}, time.Now(), time.Minute)
	k := deadKey{"gpt", upstreampkg.OpenAI.PoolOf("gpt-4.1-mini")}
	if h := s.dead[k]; h == nil || len(h.until) != 1 {
		t.Errorf("holds %v, want one slot under %v", s.dead, k)
	}
}

// withUsage asks for the stream's usage chunk whatever the client's body
// says of it, and keeps a body that asks already byte for byte.
func TestWithUsageAsksForTheUsageChunk(t *testing.T) {
	for _, body := range []string{
		`{"model":"gpt-4.1-mini","stream":true,"messages":[]}`,
		` { "model":"gpt-4.1-mini","stream":true}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false}}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{}}`,
		`{"model":"gpt-4.1-mini","stream":true,"stream_options":{"include_usage":true}}`,
	} {
		p, bad, _ := parseChat([]byte(body))
		if bad != "" {
			t.Fatalf("%s: %s", body, bad)
		}
		got, err := withUsage([]byte(body), p)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var v struct {
			Model         string
			StreamOptions map[string]any `json:"stream_options"`
		}
		if err := json.Unmarshal(got, &v); err != nil || v.Model != "gpt-4.1-mini" || v.StreamOptions["include_usage"] != true {
			t.Errorf("%s → %s (%v)", body, got, err)
		}
		if strings.Contains(body, "include_obfuscation") && v.StreamOptions["include_obfuscation"] != false {
			t.Errorf("%s → %s: the client's other stream options are lost", body, got)
		}
		if p.clientUsage && string(got) != body {
			t.Errorf("%s changed to %s", body, got)
		}
	}
}
