package workload

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
)

// BoundOf finds every cache_control marker and inference_geo "us" as the
// API reads them, escapes included, and nothing in text; its input bound
// is never below the body's length or the estimate.
func TestBoundOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		body  string
		cache cost.CacheWrite
		geo   bool
	}{
		{"plain", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, cost.NoCacheWrite, false},
		{"system block", `{"system":[{"type":"text","text":"rubric","cache_control":{"type":"ephemeral"}}],"messages":[]}`, cost.CacheWrite5m, false},
		{"message block 1h", `{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`, cost.CacheWrite1h, false},
		{"5m then 1h", `{"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"5m"}}],"tools":[{"name":"t","cache_control":{"ttl":"1h","type":"ephemeral"}}]}`, cost.CacheWrite1h, false},
		{"tool_result nested", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r","cache_control":{"type":"ephemeral"}}]}]}]}`, cost.CacheWrite5m, false},
		{"top-level automatic", `{"cache_control":{"type":"ephemeral"},"messages":[]}`, cost.CacheWrite5m, false},
		{"null marker", `{"cache_control":null,"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":null}]}]}`, cost.NoCacheWrite, false},
		{"geo us", `{"model":"claude-sonnet-4-6","inference_geo":"us"}`, cost.NoCacheWrite, true},
		{"geo global", `{"inference_geo":"global"}`, cost.NoCacheWrite, false},
		{"geo not at the top is not the request's", `{"tools":[{"input_schema":{"properties":{"inference_geo":"us"}}}]}`, cost.NoCacheWrite, false},
		{"escaped geo key", `{"inference\u005fgeo":"\u0075s"}`, cost.NoCacheWrite, true},
		{"escaped cache key and ttl", `{"system":[{"type":"text","text":"a","cache\u005fcontrol":{"type":"ephemeral","ttl":"1\u0068"}}]}`, cost.CacheWrite1h, false},
		{"words in text", `{"messages":[{"role":"user","content":"set \"inference_geo\": \"us\" and \"cache_control\": {\"ttl\": \"1h\"} \u00e9"}]}`, cost.NoCacheWrite, false},
		{"key as a value", `{"metadata":{"user_id":"cache_control"},"stop_sequences":["inference_geo"]}`, cost.NoCacheWrite, false},
		{"not JSON: every multiplier", `{"inference_geo":`, cost.CacheWrite1h, true},
		{"not an object: every multiplier", `[1]`, cost.CacheWrite1h, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := BoundOf("claude-sonnet-4-6", []byte(tc.body), 64, true)
			if b.CacheWrite != tc.cache || b.GeoUS != tc.geo {
				t.Errorf("cache %d geo %v, want %d %v", b.CacheWrite, b.GeoUS, tc.cache, tc.geo)
			}
			if b.Model != "claude-sonnet-4-6" || b.MaxTokens != 64 || !b.Batch {
				t.Errorf("bound %+v", b)
			}
			if b.Input < int64(len(tc.body)) || b.Input < EstimateInputTokens([]byte(tc.body)) {
				t.Errorf("input bound %d below the body's %d bytes or its estimate", b.Input, len(tc.body))
			}
		})
	}
}

// FuzzBoundOf: never a panic; a body that is not a JSON object is bounded
// at every multiplier; a top-level inference_geo the API would read as
// "us" is always found.
func FuzzBoundOf(f *testing.F) {
	f.Add([]byte(`{"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"1h"}}],"inference_geo":"us"}`))
	f.Add([]byte(`{"inference\u005fgeo":"us","cache\u005fcontrol":null}`))
	f.Add([]byte(`{"messages":[[[[{}]]]]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		b := BoundOf("m", body, 1, false)
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil || top == nil {
			if b.CacheWrite != cost.CacheWrite1h || !b.GeoUS {
				t.Errorf("not an object, bounded as %+v: %q", b, body)
			}
			return
		}
		var geo string
		if raw, ok := top["inference_geo"]; ok && json.Unmarshal(raw, &geo) == nil && geo == "us" && !b.GeoUS {
			// encoding/json matches keys without case; the API does not.
			var exact struct {
				Geo *string `json:"inference_geo"`
			}
			if json.Unmarshal(body, &exact) == nil && exact.Geo != nil && *exact.Geo == "us" && caseExact(body) {
				t.Errorf("inference_geo us missed: %q", body)
			}
		}
	})
}

// caseExact reports whether every top-level key of body is spelt exactly
// once (encoding/json matches keys without case and keeps the last).
func caseExact(body []byte) bool {
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	seen := map[string]bool{}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return false
		}
		s, _ := k.(string)
		if seen[s] || (s != "inference_geo" && strings.EqualFold(s, "inference_geo")) {
			return false
		}
		seen[s] = true
		var v json.RawMessage
		if d.Decode(&v) != nil {
			return false
		}
	}
	return true
}
