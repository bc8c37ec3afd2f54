package sim

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidateRequest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		body   string
		status int
		msg    string // substring of the message
	}{
		{"ok string content", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, 0, ""},
		{"ok blocks and system", `{"model":"claude-haiku-4-5","max_tokens":10,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"pre"}]}`, 0, ""},
		{"not json", `{"model":`, 400, "parsing the body"},
		{"array body", `[1,2]`, 400, "dictionary"},
		{"trailing data", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]} x`, 400, "after the JSON"},
		{"missing model", `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, 400, "model: Field required"},
		{"missing max_tokens", `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}`, 400, "max_tokens: Field required"},
		{"missing messages", `{"model":"claude-sonnet-4-5","max_tokens":10}`, 400, "messages: Field required"},
		{"empty messages", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`, 400, "at least one message"},
		{"max_tokens negative", `{"model":"claude-sonnet-4-5","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, 400, "greater than or equal to 0"},
		{"max_tokens too large", `{"model":"claude-sonnet-4-5","max_tokens":64001,"messages":[{"role":"user","content":"hi"}]}`, 400, "64001 > 64000"},
		{"max_tokens string", `{"model":"claude-sonnet-4-5","max_tokens":"ten","messages":[{"role":"user","content":"hi"}]}`, 400, "max_tokens"},
		{"bad role", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"bot","content":"hi"}]}`, 400, "messages.0.role"},
		{"system role", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"system","content":"hi"}]}`, 400, "top-level `system`"},
		{"missing role", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"content":"hi"}]}`, 400, "role: Field required"},
		{"empty user content", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":""}]}`, 400, "non-empty content"},
		{"unknown block", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[{"type":"video"}]}]}`, 400, "'video'"},
		{"extra field", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"custom_id":"x"}`, 400, "custom_id: Extra inputs are not permitted"},
		{"temperature", `{"model":"claude-sonnet-4-5","max_tokens":10,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]}`, 400, "temperature"},
		{"stream", `{"model":"claude-sonnet-4-5","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, 0, ""},
		{"max_tokens 0", `{"model":"claude-sonnet-4-5","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, 0, ""},
		{"metadata user_id", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u-1"}}`, 0, ""},
		{"metadata unknown key", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u-1","team":"x"}}`, 400, "metadata.team: Extra inputs are not permitted"},
		{"metadata escaped key", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"metadata":{"t\u00e9am":"x"}}`, 400, "Extra inputs are not permitted"},
		{"tool_choice undefined tool", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],"tool_choice":{"type":"tool","name":"get_time"}}`, 400, "Tool 'get_time' not found"},
		{"tool_choice without tools", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"any"}}`, 400, "only be specified while providing tools"},
		{"tool without schema", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"x"}]}`, 400, "input_schema: Field required"},
		{"tool_result without tool_use", `{"model":"claude-sonnet-4-6","max_tokens":100,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_x","content":"42"}]}]}`, 400, "unexpected `tool_use_id` found in `tool_result` blocks: toolu_x"},
		{"tool_result after tool_use", `{"model":"claude-sonnet-4-6","max_tokens":100,"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_x","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_x","content":"sunny"}]}]}`, 0, ""},
		{"stop sequence blank", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"stop_sequences":[" "]}`, 400, "non-whitespace"},
		{"thinking budget too small", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1000}}`, 400, "greater than or equal to 1024"},
		{"thinking budget not below max_tokens", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":2000}}`, 400, "`max_tokens` must be greater than `thinking.budget_tokens`"},
		{"thinking temperature", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"temperature":0.5,"thinking":{"type":"enabled","budget_tokens":1024}}`, 400, "`temperature` may only be set to 1"},
		{"thinking temperature 1", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"temperature":1,"thinking":{"type":"enabled","budget_tokens":1024}}`, 0, ""},
		{"inference_geo us 4.6", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"inference_geo":"us"}`, 0, ""},
		{"inference_geo on 4.5", `{"model":"claude-sonnet-4-5","max_tokens":10,"inference_geo":"us","messages":[{"role":"user","content":"hi"}]}`, 400, "inference_geo: not supported for model claude-sonnet-4-5"},
		{"inference_geo bad", `{"model":"claude-sonnet-4-6","max_tokens":2000,"messages":[{"role":"user","content":"hi"}],"inference_geo":"eu"}`, 400, "inference_geo: Input should be"},
		{"unknown model", `{"model":"claude-3-5-sonnet-20241022","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, 404, "model: claude-3-5-sonnet-20241022"},
		{"prompt too long", `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("a", 800000) + `"}]}`, 400, "prompt is too long"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, e := parseRequest([]byte(tc.body), false, false)
			if tc.status == 0 {
				if e != nil {
					t.Fatalf("refused: %d %s", e.status, e.msg)
				}
				return
			}
			if e == nil {
				t.Fatalf("accepted, want %d", tc.status)
			}
			if e.status != tc.status || !strings.Contains(e.msg, tc.msg) {
				t.Errorf("got %d %q, want %d containing %q", e.status, e.msg, tc.status, tc.msg)
			}
		})
	}
}

func TestInputTokensAndJudgeShape(t *testing.T) {
	t.Parallel()
	r, e := parseRequest(judgeBody(1, 256), false, false)
	if e != nil {
		t.Fatal(e.msg)
	}
	if !r.judge {
		t.Error("judge-shaped request not recognised")
	}
	// 3 + system text (83 bytes) + user text + 4.
	if r.input < 40 || r.input > 80 {
		t.Errorf("input tokens %d for a ~230-byte prompt", r.input)
	}
	c, e := parseRequest(judgeBody(1, 256), true, false)
	if e != nil || c.input != r.input {
		t.Errorf("count_tokens %d, messages %d", c.input, r.input)
	}
	p, _ := parseRequest(proseBody(1, 256), false, false)
	if p.judge {
		t.Error("plain request taken for a judge")
	}
}

// Outputs depend only on the body: judge answers are JSON verdicts of
// 60–110 tokens, cut (stop max_tokens) at max_tokens.
func TestOutputDeterministicJudgeJSON(t *testing.T) {
	t.Parallel()
	for i := 0; i < 200; i++ {
		body := judgeBody(i, 256)
		r, _ := parseRequest(body, false, false)
		o := plan(sha256.Sum256(body), r)
		if o.tokens < judgeMinTokens || o.tokens > judgeMaxTokens || o.cut {
			t.Fatalf("judge output %d tokens cut=%v", o.tokens, o.cut)
		}
		msg := appendMessage(nil, "msg_x", r.model.id, o, usage{input: r.input, output: o.tokens})
		var m struct {
			Content []struct{ Text string } `json:"content"`
		}
		if err := json.Unmarshal(msg, &m); err != nil {
			t.Fatalf("response is not JSON: %v\n%s", err, msg)
		}
		var verdict struct {
			Aligned, Coherent *int
			Reasoning         string
		}
		if err := json.Unmarshal([]byte(m.Content[0].Text), &verdict); err != nil || verdict.Aligned == nil || verdict.Coherent == nil || verdict.Reasoning == "" {
			t.Fatalf("verdict %q: %v", m.Content[0].Text, err)
		}
		if o2 := plan(sha256.Sum256(body), r); string(o2.appendText(nil)) != string(o.appendText(nil)) {
			t.Fatal("same body, different text")
		}
	}
	body := judgeBody(1, 20)
	r, _ := parseRequest(body, false, false)
	o := plan(sha256.Sum256(body), r)
	if o.tokens != 20 || !o.cut {
		t.Errorf("max_tokens 20: %d tokens cut=%v", o.tokens, o.cut)
	}
	msg := appendMessage(nil, "msg_x", r.model.id, o, usage{})
	if !json.Valid(msg) || !strings.Contains(string(msg), `"stop_reason":"max_tokens"`) {
		t.Errorf("cut message %s", msg)
	}
}

func TestAppendJSONString(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain", `q"uote\back`, "ctl\x00\x1f\n", "ünï©ødé", "bad\xffutf8"} {
		var got string
		if err := json.Unmarshal(appendJSONString(nil, s), &got); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if utf8.ValidString(s) && got != s {
			t.Errorf("%q round-tripped as %q", s, got)
		}
	}
}

// FuzzValidateRequest: no body makes validation panic, accepted bodies
// have a known model and sane counts, and errors are well-formed.
func FuzzValidateRequest(f *testing.F) {
	f.Add(string(judgeBody(1, 256)), false)
	f.Add(string(proseBody(2, 64)), true)
	f.Add(`{"model":"claude-haiku-4-5","max_tokens":10,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`, false)
	f.Add(`{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"image","source":{}}]}]}`, false)
	f.Add(`{}`, false)
	f.Add(`null`, true)
	f.Add(`{"messages":[null]}`, false)
	f.Add(`{"model":"claude-sonnet-4-5","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, false)
	f.Add(`{"model":"claude-sonnet-4-6","max_tokens":300,"stream":true,"stop_sequences":["e"],"metadata":{"user_id":"u"},"inference_geo":"us","tools":[{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer","minimum":-5}}}}}],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"hi"}]}`, false)
	f.Add(`{"model":"claude-opus-4-6","max_tokens":3000,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"t","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"x"}]}]}`, false)
	f.Add(`{"model":"claude-sonnet-4-6","max_tokens":300,"tools":[{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"array","minItems":1000000000,"items":{"type":"array","minItems":1000000000,"items":{"type":"string","minLength":1e12}}}}}}],"tool_choice":{"type":"tool","name":"t"},"messages":[{"role":"user","content":"hi"}]}`, false)
	f.Fuzz(func(t *testing.T, body string, count bool) {
		r, e := parseRequest([]byte(body), count, false)
		if e != nil {
			if e.status != http.StatusBadRequest && e.status != http.StatusNotFound {
				t.Fatalf("status %d", e.status)
			}
			if e.msg == "" || !json.Valid(appendError(nil, e, "req_x")) {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		if r.model == nil || r.input < tokensPerRequest || (!count && r.maxTokens < 0) || r.cacheTokens < 0 || r.cacheTokens > r.input {
			t.Fatalf("accepted with %+v", r)
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		o := plan(sha256.Sum256([]byte(body)), r)
		if len(o.toolInput) > 2*maxToolInput || (o.toolInput != nil && !json.Valid(o.toolInput)) {
			t.Fatalf("tool input of %d bytes: %.200s", len(o.toolInput), o.toolInput)
		}
		if msg := appendMessage(nil, "msg_x", r.model.id, o, usage{}); !json.Valid(msg) {
			t.Fatalf("invalid response %s", msg)
		}
	})
}

// FuzzFastDecode holds the fast decoder to encoding/json: whenever it
// accepts a body, the strict decode accepts it too and fills the same.
func FuzzFastDecode(f *testing.F) {
	f.Add(string(judgeBody(1, 256)))
	f.Add(string(proseBody(2, 64)))
	f.Add(`{"model":"claude-haiku-4-5","max_tokens":10,"temperature":0.5,"stream":false,"metadata":{"user_id":"u"},"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\n","cache_control":{"type":"ephemeral","ttl":"1h"}}]},{"content":"x","role":"assistant"}]}`)
	f.Add(`{"model":"m","max_tokens":-1,"messages":[]}`)
	f.Add(`{"model":"m","messages":[{}]} `)
	f.Fuzz(func(t *testing.T, body string) {
		var fast wireRequest
		if fastDecodeRequest([]byte(body), &fast) {
			var slow wireRequest
			if e := strictDecodeRequest([]byte(body), &slow); e != nil {
				t.Fatalf("fast accepted what the strict decode refuses (%s): %q", e.msg, body)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("fast %+v\nslow %+v\nbody %q", fast, slow, body)
			}
		}
		var fb []wireBlock
		if fastDecodeBlocks([]byte(body), &fb) {
			var sb []wireBlock
			if err := json.Unmarshal([]byte(body), &sb); err != nil {
				t.Fatalf("fast blocks accepted what json refuses (%v): %q", err, body)
			}
			if !reflect.DeepEqual(fb, sb) {
				t.Fatalf("fast %+v\nslow %+v\nbody %q", fb, sb, body)
			}
		}
	})
}

// TestLongOutputsWhenAskedAtLength: a user message asking for an answer "at
// length" gets 1,200–2,400 tokens, cut at max_tokens, so output-token limits
// can bind on long outputs; without the words, prose stays short.
func TestLongOutputsWhenAskedAtLength(t *testing.T) {
	var long, short int
	for i := range 50 {
		body := fmt.Appendf(nil, `{"model":"claude-sonnet-4-5-20250929","max_tokens":2048,"messages":[{"role":"user","content":"Write at length about the river crossing, part %d."}]}`, i)
		r, e := parseRequest(body, false, false)
		if e != nil {
			t.Fatal(e)
		}
		o := plan(sha256.Sum256(body), r)
		if o.tokens < longMinTokens || o.tokens > 2048 {
			t.Fatalf("asked at length: %d tokens, want 1,200–2,048", o.tokens)
		}
		if o.cut {
			long++
		}
		p, _ := parseRequest(proseBody(i, 2048), false, false)
		if q := plan(sha256.Sum256(proseBody(i, 2048)), p); q.tokens > proseMaxTokens {
			t.Fatalf("plain prose: %d tokens", q.tokens)
		}
		short++
	}
	if long == 0 || long == 50 {
		t.Fatalf("%d of 50 long answers cut at max_tokens, want some but not all", long)
	}
}
