package sim

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
)

const oaKey = "sk-proj-sim-oa-test"

// oaTestConfig is an Anthropic org "solo" and an OpenAI org "oa" whose
// gpt-4.1-mini has roomy limits and whose o4-mini has a TPM of 3,000.
func oaTestConfig() Config {
	cfg := testConfig()
	cfg.Orgs = append(cfg.Orgs, OrgConfig{
		Name: "oa", Provider: ProviderOpenAI, Keys: []string{oaKey}, Projects: []string{"proj_judge"},
		ModelLimits: map[string]OpenAILimits{
			"gpt-4.1-mini": {RPM: 6000, TPM: 10_000_000},
			"o4-mini":      {RPM: 600, TPM: 3000},
		},
		Batch: BatchLimits{PerMinute: 60, CancelS: 2},
	})
	return cfg
}

// The simulator's OpenAI prices are its own table; they must equal
// package cost's, or a client's sum would drift from the ledger.
func TestOpenAIPricesMatchPackageCost(t *testing.T) {
	t.Parallel()
	for _, m := range oaModels {
		p, err := cost.OpenAI().Lookup(m.snapshot)
		if err != nil {
			t.Errorf("%s: %v", m.id, err)
			continue
		}
		if p.MaxOutput != m.maxOutput {
			t.Errorf("%s: package cost's max_output %d, the simulator's %d", m.id, p.MaxOutput, m.maxOutput)
		}
		if got := (oaPrice{int64(p.Standard.Input), int64(p.Standard.CachedInput), int64(p.Standard.Output)}); got != m.price {
			t.Errorf("%s: package cost %+v, simulator %+v", m.id, got, m.price)
		}
		switch {
		case (p.Priority == nil) != (m.priority == nil):
			t.Errorf("%s: package cost priority %v, simulator %v", m.id, p.Priority, m.priority)
		case p.Priority != nil && (oaPrice{int64(p.Priority.Input), int64(p.Priority.CachedInput), int64(p.Priority.Output)}) != *m.priority:
			t.Errorf("%s: package cost priority %+v, simulator %+v", m.id, *p.Priority, *m.priority)
		case p.Flex != m.flex:
			t.Errorf("%s: package cost flex %v, simulator %v", m.id, p.Flex, m.flex)
		}
		for _, v := range []int64{m.price.in, m.price.cached, m.price.out} {
			if v%2 != 0 {
				t.Errorf("%s: rate %d is odd: its batch half is not exact", m.id, v)
			}
		}
	}
	if len(cost.OpenAI().Models()) != len(oaModels) {
		t.Errorf("package cost prices %d OpenAI models, the simulator serves %d", len(cost.OpenAI().Models()), len(oaModels))
	}
}

func oaDo(t *testing.T, run *Running, method, path, key string, body []byte, hdr ...string) reply {
	t.Helper()
	h := append([]string{"Authorization", "Bearer " + key}, hdr...)
	return do(t, method, run.URL+path, "", body, h...)
}

func TestOpenAIAuthentication(t *testing.T) {
	t.Parallel()
	run := startSim(t, oaTestConfig())
	chat := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}]}`)
	orgID := run.Server.OpenAIOrgs()[0].ID
	cases := []struct {
		name   string
		key    string
		hdr    []string
		status int
		code   string
	}{
		{"ok", oaKey, nil, 200, ""},
		{"anthropic key", soloKey, nil, 401, openai.CodeInvalidAPIKey},
		{"unknown key", "sk-nope", nil, 401, openai.CodeInvalidAPIKey},
		{"organization matches", oaKey, []string{"OpenAI-Organization", orgID}, 200, ""},
		{"organization mismatch", oaKey, []string{"OpenAI-Organization", "org-other"}, 401, "mismatched_organization"},
		{"project mismatch", oaKey, []string{"OpenAI-Project", "proj_other"}, 401, "mismatched_project"},
	}
	for _, c := range cases {
		r := oaDo(t, run, "POST", "/v1/chat/completions", c.key, chat, c.hdr...)
		if r.status != c.status || r.header.Get("x-request-id") == "" {
			t.Errorf("%s: status %d, want %d: %s", c.name, r.status, c.status, r.body)
			continue
		}
		if c.code != "" {
			env := openai.ParseEnvelope(r.body)
			if env == nil || env.Error.CodeString() != c.code {
				t.Errorf("%s: %s", c.name, r.body)
			}
		}
	}
	// An OpenAI key does not open the Anthropic surface, nor an Anthropic
	// key the OpenAI models.
	if r := do(t, "POST", run.URL+"/v1/messages", oaKey, judgeBody(1, 100)); r.status != 401 {
		t.Errorf("OpenAI key on /v1/messages: %d", r.status)
	}
	if r := do(t, "GET", run.URL+"/v1/models", soloKey, nil); r.status != 200 || !strings.Contains(string(r.body), "claude") {
		t.Errorf("Anthropic models: %d %s", r.status, r.body)
	}
	if r := oaDo(t, run, "GET", "/v1/models", oaKey, nil); r.status != 200 || strings.Contains(string(r.body), "claude") || !strings.Contains(string(r.body), "gpt-4.1-mini") {
		t.Errorf("OpenAI models: %d %s", r.status, r.body)
	}
	// A model the org has no limits for is not found for it.
	if r := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)); r.status != 404 {
		t.Errorf("gpt-4o: %d %s", r.status, r.body)
	}
}

func TestOpenAIValidation(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"model":"gpt-4.1-mini"}`:                                                                                    "Missing required parameter: 'messages'.",
		`{"model":"gpt-4.1-mini","messages":[]}`:                                                                      "empty array",
		`{"model":"gpt-4.1-mini","messages":[{"role":"robot","content":"x"}]}`:                                        "Invalid value: 'robot'",
		`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"x"}],"foo":1}`:                                 "Unrecognized request argument supplied: foo",
		`{"model":"o4-mini","messages":[{"role":"user","content":"x"}],"max_tokens":10}`:                              "'max_tokens' is not supported with this model",
		`{"model":"o4-mini","messages":[{"role":"user","content":"x"}],"temperature":0.2}`:                            "Only the default (1) value is supported",
		`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"x"}],"n":0}`:                                   "Invalid 'n'",
		`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"x"}],"max_tokens":99999}`:                      "max_tokens is too large",
		`{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`:                                                "does not exist",
		`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`: "only allowed when 'stream' is enabled",
		`{"model":"gpt-4.1-mini","messages":[{"role":"tool","content":"x"}]}`:                                         "tool_call_id",
		`not json`: "could not parse the JSON body",
	} {
		_, e := parseOpenAIChat([]byte(body))
		if e == nil || !strings.Contains(e.msg, want) {
			t.Errorf("%s: %+v, want %q", body, e, want)
		}
	}
	r, e := parseOpenAIChat([]byte(`{"model":"gpt-4.1-mini","max_tokens":64,"n":2,"messages":[{"role":"system","content":"Judge this."},{"role":"user","content":"2+2=4?"}]}`))
	if e != nil || !r.hasMax || r.maxOut != 64 || r.n != 2 || !r.judge || r.echo != "gpt-4.1-mini-2025-04-14" {
		t.Errorf("parsed %+v, %v", r, e)
	}
}

func FuzzParseOpenAIChat(f *testing.F) {
	f.Add([]byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`))
	f.Add([]byte(`{"model":"o3","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`))
	f.Add([]byte(`{"model":"gpt-4.1-mini","response_format":{"type":"json_object"},"messages":[{"role":"user","content":"JSON"}]}`))
	f.Add([]byte(`{"model":"gpt-4.1-mini","response_format":{"type":"json_schema","json_schema":{"name":"v"}},"messages":[{"role":"user","content":"x"}]}`))
	f.Add([]byte(`{"model":"gpt-4.1-mini","response_format":{"type":"json_schema","json_schema":{"name":"v","schema":{"type":"object","properties":{"a":{"$ref":"#/$defs/A"}},"$defs":{"A":{"type":"array","items":{"$ref":"#/$defs/A"}}}}}},"messages":[{"role":"user","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, e := parseOpenAIChat(b)
		if e == nil && (r.model == nil || r.prompt <= 0 || r.n < 1) {
			t.Fatalf("accepted %q as %+v", b, r)
		}
	})
}

// upload posts a batch input file and returns its id.
func upload(t *testing.T, run *Running, lines string) string {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	fw.Write([]byte(lines))
	mw.Close()
	r := oaDo(t, run, "POST", "/v1/files", oaKey, buf.Bytes(), "Content-Type", mw.FormDataContentType())
	var f openai.File
	if r.status != 200 || json.Unmarshal(r.body, &f) != nil {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	return f.ID
}

func createBatch(t *testing.T, run *Running, file string) openai.Batch {
	t.Helper()
	r := oaDo(t, run, "POST", "/v1/batches", oaKey, []byte(`{"input_file_id":"`+file+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`))
	var b openai.Batch
	if r.status != 200 || json.Unmarshal(r.body, &b) != nil {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	return b
}

func waitBatch(t *testing.T, run *Running, id string) openai.Batch {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var b openai.Batch
		r := oaDo(t, run, "GET", "/v1/batches/"+id, oaKey, nil)
		if r.status != 200 || json.Unmarshal(r.body, &b) != nil {
			t.Fatalf("retrieve: %d %s", r.status, r.body)
		}
		if openai.BatchTerminal(b.Status) {
			return b
		}
	}
	t.Fatalf("batch %s did not end", id)
	return openai.Batch{}
}

func TestOpenAIBatchFailsAndExpires(t *testing.T) {
	t.Parallel()
	cfg := oaTestConfig()
	cfg.Speed = 50_000 // 24 API hours in under 2 s
	cfg.Orgs[1].ModelLimits["gpt-4.1-mini"] = OpenAILimits{RPM: 6000, TPM: 10_000_000, BatchQueueTokens: 100}
	run := startSim(t, cfg)
	line := func(id string, body string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":` + body + "}\n"
	}
	ok := `{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":20}`

	// A duplicate custom_id fails the whole batch, naming the line.
	b := waitBatch(t, run, createBatch(t, run, upload(t, run, line("a", ok)+line("a", ok))).ID)
	if b.Status != "failed" || b.Errors == nil || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "duplicate_custom_id" || *b.Errors.Data[0].Line != 2 || b.FailedAt == nil {
		t.Errorf("duplicate: %+v", b)
	}
	// A body the API refuses is a 400 line in the error file, the rest succeed.
	bad := `{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"n":0}`
	b = waitBatch(t, run, createBatch(t, run, upload(t, run, line("good", ok)+line("bad", bad))).ID)
	if b.Status != "completed" || b.RequestCounts.Completed != 1 || b.RequestCounts.Failed != 1 || b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Errorf("mixed: %+v", b)
	} else if r := oaDo(t, run, "GET", "/v1/files/"+*b.ErrorFileID+"/content", oaKey, nil); !strings.Contains(string(r.body), `"status_code":400`) || !strings.Contains(string(r.body), `"custom_id":"bad"`) {
		t.Errorf("error file: %s", r.body)
	}
	// Above the enqueued-token limit (100 tokens here) a batch fails.
	var many strings.Builder
	for i := range 20 {
		many.WriteString(line("m"+string(rune('a'+i)), ok))
	}
	b = waitBatch(t, run, createBatch(t, run, upload(t, run, many.String())).ID)
	if b.Status != "failed" || b.Errors.Data[0].Code != openai.CodeTokenLimitExceeded {
		t.Errorf("queue limit: %+v", b)
	}
	// A stalled batch expires after 24 h: what ran is in the output file,
	// the rest in the error file as batch_expired.
	if _, err := run.Server.AddFault(Fault{Kind: FaultBatchStall, Org: "oa", Fraction: 0.5}); err != nil {
		t.Fatal(err)
	}
	b = waitBatch(t, run, createBatch(t, run, upload(t, run, line("s1", ok)+line("s2", ok)+line("s3", ok)+line("s4", ok))).ID)
	if b.Status != "expired" || b.ExpiredAt == nil || b.RequestCounts.Completed != 2 || b.RequestCounts.Failed != 2 {
		t.Errorf("expired: %+v", b)
	} else if r := oaDo(t, run, "GET", "/v1/files/"+*b.ErrorFileID+"/content", oaKey, nil); strings.Count(string(r.body), openai.CodeBatchExpired) != 2 {
		t.Errorf("expired lines: %s", r.body)
	}
	// Batch entries are billed at half the price of the same request.
	for _, e := range run.Server.Ledger() {
		if e.ServiceTier == "batch" {
			if full, _ := OpenAICostNanos(e.Model, e.InputTokens, 0, e.OutputTokens, false); 2*e.CostNanos-full > 1 || full-2*e.CostNanos > 1 {
				t.Errorf("batch entry %d n$, the same sync %d n$", e.CostNanos, full)
			}
		}
	}
}

// JSON mode (response_format json_object) answers valid JSON whatever the
// prompt's words, streamed or not, and is refused when no message names
// JSON; a response_format of another type, or a json_schema without its
// name, is refused. The Python SDK's driver found the simulator answering
// prose in JSON mode and accepting it without JSON in the messages.
func TestOpenAIJSONModeAnswersJSON(t *testing.T) {
	t.Parallel()
	run := startSim(t, oaTestConfig())
	const ask = `"messages":[{"role":"user","content":"Is 2+2 = 4? Answer in JSON, with a field correct."}]`
	body := []byte(`{"model":"gpt-4.1-mini","max_completion_tokens":300,"response_format":{"type":"json_object"},` + ask + `}`)
	r := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, body)
	var c openai.ChatCompletion
	if r.status != 200 || json.Unmarshal(r.body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content == nil {
		t.Fatalf("json_object: %d %s", r.status, r.body)
	}
	content := *c.Choices[0].Message.Content
	if !json.Valid([]byte(content)) || c.Choices[0].FinishReason != "stop" {
		t.Errorf("json_object answered %s: %q", c.Choices[0].FinishReason, content)
	}
	// Streamed, the deltas add up to the same JSON.
	body = []byte(`{"model":"gpt-4.1-mini","max_completion_tokens":300,"stream":true,"response_format":{"type":"json_object"},` + ask + `}`)
	r = oaDo(t, run, "POST", "/v1/chat/completions", oaKey, body)
	var streamed strings.Builder
	for l := range strings.Lines(string(r.body)) {
		data, ok := strings.CutPrefix(strings.TrimSpace(l), "data: {")
		if !ok {
			continue
		}
		var ch openai.Chunk
		if err := json.Unmarshal([]byte("{"+data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", l, err)
		}
		for _, x := range ch.Choices {
			if x.Delta.Content != nil {
				streamed.WriteString(*x.Delta.Content)
			}
		}
	}
	if r.status != 200 || streamed.String() != content {
		t.Errorf("json_object streamed: %d %q, unstreamed %q", r.status, streamed.String(), content)
	}
	for _, c := range []struct{ body, param, want string }{
		{`{"model":"gpt-4.1-mini","response_format":{"type":"json_object"},"messages":[{"role":"user","content":"Is 2+2 = 4?"}]}`,
			"messages", "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."},
		{`{"model":"gpt-4.1-mini","response_format":{"type":"xml"},` + ask + `}`,
			"response_format.type", "Invalid value: 'xml'. Supported values are: 'text', 'json_object' and 'json_schema'."},
		{`{"model":"gpt-4.1-mini","response_format":{"type":"json_schema"},` + ask + `}`,
			"response_format.json_schema", "Missing required parameter: 'response_format.json_schema'."},
		{`{"model":"gpt-4.1-mini","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}},` + ask + `}`,
			"response_format.json_schema.name", "Missing required parameter: 'response_format.json_schema.name'."},
		{`{"model":"gpt-4.1-mini","response_format":"json",` + ask + `}`,
			"response_format", "Invalid type for 'response_format': expected an object, but got a string instead."},
	} {
		r := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(c.body))
		var e struct{ Error openai.ErrorDetail }
		if r.status != 400 || json.Unmarshal(r.body, &e) != nil || e.Error.Param == nil || *e.Error.Param != c.param || e.Error.Message != c.want {
			t.Errorf("%s: %d %s, want 400 %s %q", c.body, r.status, r.body, c.param, c.want)
		}
	}
	// text, and a json_schema with its name, are accepted.
	for _, rf := range []string{`{"type":"text"}`, `{"type":"json_schema","json_schema":{"name":"verdict","strict":true,"schema":{"type":"object"}}}`} {
		if r := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(`{"model":"gpt-4.1-mini","response_format":`+rf+`,`+ask+`}`)); r.status != 200 {
			t.Errorf("%s: %d %s", rf, r.status, r.body)
		}
	}
}

// Structured outputs (response_format json_schema) answer JSON that fits
// the schema, nested models under $defs included, streamed or not; cut by
// max_completion_tokens it stops with finish_reason "length". The Python
// SDK's driver found chat.completions.parse failing: the simulator
// answered a judge's verdict of its own shape whatever the schema.
func TestOpenAIStructuredOutputsFollowTheSchema(t *testing.T) {
	t.Parallel()
	run := startSim(t, oaTestConfig())
	const schema = `{"name":"Review","strict":true,"schema":{"type":"object","additionalProperties":false,
		"required":["verdict","flags","label"],
		"properties":{"verdict":{"$ref":"#/$defs/Verdict"},"flags":{"type":"array","items":{"type":"string"}},
			"label":{"type":"string","enum":["good","bad"]}},
		"$defs":{"Verdict":{"type":"object","additionalProperties":false,"required":["correct","score"],
			"properties":{"correct":{"type":"boolean"},"score":{"type":"integer","minimum":1,"maximum":5}}}}}}`
	ask := `"messages":[{"role":"system","content":"You are an impartial judge."},{"role":"user","content":"Is 2+2 = 4?"}]`
	type review struct {
		Verdict *struct {
			Correct *bool `json:"correct"`
			Score   *int  `json:"score"`
		} `json:"verdict"`
		Flags []string `json:"flags"`
		Label string   `json:"label"`
	}
	fits := func(content string) bool {
		var v review
		d := json.NewDecoder(strings.NewReader(content))
		d.DisallowUnknownFields()
		return d.Decode(&v) == nil && v.Verdict != nil && v.Verdict.Correct != nil && v.Verdict.Score != nil &&
			*v.Verdict.Score >= 1 && *v.Verdict.Score <= 5 && v.Flags != nil && (v.Label == "good" || v.Label == "bad")
	}
	body := `{"model":"gpt-4.1-mini","max_completion_tokens":300,"response_format":{"type":"json_schema","json_schema":` + schema + `},` + ask
	r := oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(body+`}`))
	var c openai.ChatCompletion
	if r.status != 200 || json.Unmarshal(r.body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content == nil {
		t.Fatalf("json_schema: %d %s", r.status, r.body)
	}
	content := *c.Choices[0].Message.Content
	if !fits(content) || c.Choices[0].FinishReason != "stop" {
		t.Errorf("json_schema answered %s: %s", c.Choices[0].FinishReason, content)
	}
	r = oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(body+`,"stream":true}`))
	var streamed strings.Builder
	for l := range strings.Lines(string(r.body)) {
		data, ok := strings.CutPrefix(strings.TrimSpace(l), "data: {")
		if !ok {
			continue
		}
		var ch openai.Chunk
		if err := json.Unmarshal([]byte("{"+data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", l, err)
		}
		for _, x := range ch.Choices {
			if x.Delta.Content != nil {
				streamed.WriteString(*x.Delta.Content)
			}
		}
	}
	if streamed.String() != content {
		t.Errorf("streamed %q, unstreamed %q", streamed.String(), content)
	}
	// Cut short: a prefix of the same JSON, finish_reason length.
	body = strings.Replace(body, `"max_completion_tokens":300`, `"max_completion_tokens":3`, 1)
	r = oaDo(t, run, "POST", "/v1/chat/completions", oaKey, []byte(body+`}`))
	var cut openai.ChatCompletion
	if r.status != 200 || json.Unmarshal(r.body, &cut) != nil || cut.Choices[0].Message.Content == nil {
		t.Fatalf("json_schema cut: %d %s", r.status, r.body)
	}
	if got := *cut.Choices[0].Message.Content; cut.Choices[0].FinishReason != "length" || cut.Usage.CompletionTokens != 3 ||
		got == "" || !strings.HasPrefix(content, got) || json.Valid([]byte(got)) {
		t.Errorf("cut at 3 tokens: %s %d %q of %q", cut.Choices[0].FinishReason, cut.Usage.CompletionTokens, got, content)
	}
}

// A schema whose definitions refer to each other many times resolves
// within its node budget instead of multiplying.
func TestOpenAIResolveRefsIsBounded(t *testing.T) {
	t.Parallel()
	props := map[string]any{}
	for i := range 10 {
		props[strconv.Itoa(i)] = map[string]any{"$ref": "#/$defs/A"}
	}
	defs := map[string]any{"A": map[string]any{"type": "object", "properties": props}}
	var count func(v any) int
	count = func(v any) int {
		n := 1
		switch x := v.(type) {
		case map[string]any:
			for _, e := range x {
				n += count(e)
			}
		case []any:
			for _, e := range x {
				n += count(e)
			}
		}
		return n
	}
	budget := maxResolvedNodes
	got := resolveRefs(map[string]any{"$ref": "#/$defs/A"}, defs, 0, &budget)
	if n := count(got); n > 4*maxResolvedNodes {
		t.Errorf("resolved %d nodes, budget %d", n, maxResolvedNodes)
	}
}

// The lost-create faults strike OpenAI creates as they do Anthropic
// ones: the batch exists (listed, with its metadata, and its input file
// readable) while its create is answered with a 500 in OpenAI's envelope,
// or the connection is reset.
func TestOpenAIBatchCreateLost(t *testing.T) {
	t.Parallel()
	ok := `{"custom_id":"c1","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}]}}` + "\n"
	for _, kind := range []FaultKind{FaultBatchCreateLost500, FaultBatchCreateLostReset} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			cfg := oaTestConfig()
			cfg.Faults = []Fault{{Kind: kind, Org: "oa"}}
			run := startSim(t, cfg)
			file := upload(t, run, ok)
			r := oaDo(t, run, "POST", "/v1/batches", oaKey, []byte(`{"input_file_id":"`+file+`","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":"v"}}`))
			switch kind {
			case FaultBatchCreateLost500:
				var env openai.ErrorEnvelope
				if r.status != 500 || json.Unmarshal(r.body, &env) != nil || env.Error.Type != openai.ErrServer {
					t.Fatalf("create: %d %s; want a 500 server_error", r.status, r.body)
				}
			default:
				if r.err == nil {
					t.Fatalf("create answered %d; want a reset", r.status)
				}
			}
			var page struct {
				Data []openai.Batch `json:"data"`
			}
			if l := oaDo(t, run, "GET", "/v1/batches", oaKey, nil); l.status != 200 || json.Unmarshal(l.body, &page) != nil {
				t.Fatalf("list: %d %s", l.status, l.body)
			}
			if len(page.Data) != 1 || page.Data[0].InputFileID != file || page.Data[0].Metadata["k"] != "v" || page.Data[0].RequestCounts.Total != 1 {
				t.Fatalf("after a lost create the list holds %+v; want the batch with its file and metadata", page.Data)
			}
			if c := oaDo(t, run, "GET", "/v1/files/"+file+"/content", oaKey, nil); c.status != 200 || string(c.body) != ok {
				t.Fatalf("input file: %d %q", c.status, c.body)
			}
		})
	}
}

// batch_results_cut strikes each download of a batch's output or error
// file on its own, as a network cut would: a fault active while the batch
// ended does not cut its files for ever, and one added after it ended cuts
// the next download. Campaign seeds 68 and 147 hung on an output file the
// simulator had cut once and for all when its batch ended.
func TestOpenAIBatchResultsCutEachRead(t *testing.T) {
	t.Parallel()
	cfg := oaTestConfig()
	cfg.Speed = 50_000
	run := startSim(t, cfg)
	ok := `{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":20}`
	bad := `{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"n":0}`
	var in strings.Builder
	for i := range 40 {
		body := ok
		if i%4 == 3 {
			body = bad
		}
		in.WriteString(`{"custom_id":"c` + strconv.Itoa(i) + `","method":"POST","url":"/v1/chat/completions","body":` + body + "}\n")
	}
	read := func(file string) (whole bool, lines int) {
		t.Helper()
		r := oaDo(t, run, "GET", "/v1/files/"+file+"/content", oaKey, nil)
		if r.err == nil && r.status != 200 {
			t.Fatalf("download of %s: %d %s", file, r.status, r.body)
		}
		return r.err == nil, bytes.Count(r.body, []byte("\n"))
	}

	// Active at p = 0.5 while the batch ends: some downloads are cut,
	// others whole, of either file.
	if _, err := run.Server.AddFault(Fault{Kind: FaultBatchResultsCut, Org: "oa", Probability: 0.5}); err != nil {
		t.Fatal(err)
	}
	b := waitBatch(t, run, createBatch(t, run, upload(t, run, in.String())).ID)
	if b.Status != "completed" || b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Fatalf("batch: %+v", b)
	}
	for _, c := range []struct {
		file string
		want int
	}{{*b.OutputFileID, 30}, {*b.ErrorFileID, 10}} {
		cut, whole := 0, 0
		for range 40 {
			if w, n := read(c.file); w {
				whole++
				if n != c.want {
					t.Errorf("%s: a whole download of %d lines, want %d", c.file, n, c.want)
				}
			} else {
				cut++
				if n >= c.want {
					t.Errorf("%s: a cut download of %d lines, want fewer than %d", c.file, n, c.want)
				}
			}
		}
		if cut == 0 || whole == 0 {
			t.Errorf("%s at p = 0.5: %d of 40 downloads cut, %d whole; want some of each", c.file, cut, whole)
		}
	}

	// Cleared, every download is whole; added after the batch ended (p 1),
	// every download is cut.
	run.Server.ClearFaults()
	if w, n := read(*b.OutputFileID); !w || n != 30 {
		t.Errorf("fault cleared: whole %v, %d lines", w, n)
	}
	if _, err := run.Server.AddFault(Fault{Kind: FaultBatchResultsCut}); err != nil {
		t.Fatal(err)
	}
	if w, _ := read(*b.OutputFileID); w {
		t.Error("a fault added after the batch ended did not cut its output file's download")
	}
}

// TestOpenAIFileDelete: DELETE /v1/files/{id} answers as the API does
// ({"id", "object": "file", "deleted": true}); the file is then not found
// (retrieve, content, a second delete: 404), nor listed. A batch whose
// input file is deleted once it has ended keeps its results and still
// names the file.
func TestOpenAIFileDelete(t *testing.T) {
	t.Parallel()
	cfg := oaTestConfig()
	cfg.Speed = 50_000
	run := startSim(t, cfg)
	in := upload(t, run, `{"custom_id":"c0","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":20}}`+"\n")
	b := waitBatch(t, run, createBatch(t, run, in).ID)
	if b.Status != "completed" || b.OutputFileID == nil {
		t.Fatalf("batch: %+v", b)
	}
	r := oaDo(t, run, "DELETE", "/v1/files/"+in, oaKey, nil)
	if r.status != 200 || string(r.body) != `{"id":"`+in+`","object":"file","deleted":true}` {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, path string }{{"GET", in}, {"GET", in + "/content"}, {"DELETE", in}} {
		if r := oaDo(t, run, c.method, "/v1/files/"+c.path, oaKey, nil); r.status != 404 || !bytes.Contains(r.body, []byte("No such File object: "+in)) {
			t.Errorf("%s %s after the delete: %d %s; want 404", c.method, c.path, r.status, r.body)
		}
	}
	if r := oaDo(t, run, "GET", "/v1/files?purpose=batch", oaKey, nil); r.status != 200 || bytes.Contains(r.body, []byte(in)) {
		t.Errorf("list after the delete: %d %s", r.status, r.body)
	}
	after := waitBatch(t, run, b.ID)
	if after.InputFileID != in {
		t.Errorf("the batch names input file %q after its delete, want %q", after.InputFileID, in)
	}
	if r := oaDo(t, run, "GET", "/v1/files/"+*b.OutputFileID+"/content", oaKey, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"custom_id":"c0"`)) {
		t.Errorf("output after the input's delete: %d %s", r.status, r.body)
	}
}
