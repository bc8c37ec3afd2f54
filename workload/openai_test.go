package workload

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/store"
)

func oaLine(id, body string) string {
	return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":` + body + `}`
}

const oaMsgs = `"messages":[{"role":"system","content":"You judge."},{"role":"user","content":"Is 2+2=4?"}]`

// OpenAI batch-input lines are accepted as they are, beside Anthropic
// lines in the same file; Scan gives each item its provider, its
// completion limit and n, and ReadAt returns its body.
func TestOpenAILinesScanAndReadBack(t *testing.T) {
	t.Parallel()
	claude := `{"custom_id":"c1","params":{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}}`
	gpt1 := `{"model":"gpt-4.1-mini","max_completion_tokens":40,"n":2,` + oaMsgs + `}`
	gpt2 := `{"model":"o4-mini",` + oaMsgs + `,"max_tokens":30}`
	gpt3 := `{"model":"gpt-4.1",` + oaMsgs + `}`
	path := writeTemp(t, strings.Join([]string{claude, oaLine("g1", gpt1), oaLine("g2", gpt2), oaLine("g3", gpt3)}, "\n")+"\n")
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.N != 4 || sum.OpenAI != 3 || sum.FirstOpenAILine != 2 || sum.FirstAnthropicLine != 1 || len(sum.Models) != 1 || len(sum.OpenAIModels) != 3 {
		t.Fatalf("summary %+v", sum)
	}
	if ms := sum.OpenAIModels["gpt-4.1-mini"]; ms.N != 1 || ms.MaxTokens != 80 || ms.EstInput == 0 {
		t.Fatalf("gpt-4.1-mini summary %+v", ms)
	}
	var items []store.Item
	if err := Scan(path, func(it store.Item) error { items = append(items, it); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		provider    string
		max, n      int64
		model, body string
	}{{"", 64, 0, "claude-sonnet-4-5", ""}, {"openai", 40, 2, "gpt-4.1-mini", gpt1}, {"openai", 30, 0, "o4-mini", gpt2}, {"openai", 0, 0, "gpt-4.1", gpt3}}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, w := range want {
		it := items[i]
		if it.Provider != w.provider || it.MaxTokens != w.max || it.Choices != w.n || it.Model != w.model || it.EstInput <= 4 {
			t.Errorf("item %d: %+v, want %+v", i, it, w)
		}
		b, err := ReadAt(f, it)
		if err != nil {
			t.Fatal(err)
		}
		if w.body != "" && string(b) != w.body {
			t.Errorf("item %d: ReadAt %s, want the body %s", i, b, w.body)
		}
		if !json.Valid(b) {
			t.Errorf("item %d: %s", i, b)
		}
	}
	// An item scanned as Anthropic's whose line became an OpenAI one: the
	// file changed.
	moved := items[1]
	moved.Provider = ""
	if _, err := ReadAt(f, moved); err == nil || !strings.Contains(err.Error(), "provider") {
		t.Fatalf("ReadAt of a line of the other provider: %v", err)
	}
}

// Bad OpenAI lines: a clear error naming the line and the problem.
func TestOpenAILineProblems(t *testing.T) {
	t.Parallel()
	good := `{"model":"gpt-4.1-mini",` + oaMsgs + `}`
	for name, tc := range map[string]struct {
		line string
		want []string
	}{
		"wrong url":     {strings.Replace(oaLine("a", good), "/v1/chat/completions", "/v1/embeddings", 1), []string{`line 1: url is "/v1/embeddings": only /v1/chat/completions is supported`}},
		"get":           {strings.Replace(oaLine("a", good), `"POST"`, `"GET"`, 1), []string{`line 1: method is "GET": an OpenAI request line is sent with POST`}},
		"no method":     {strings.Replace(oaLine("a", good), `"method":"POST",`, ``, 1), []string{`line 1: method is missing (an OpenAI request line has "method": "POST")`}},
		"no body":       {`{"custom_id":"a","method":"POST","url":"/v1/chat/completions"}`, []string{"line 1: missing body"}},
		"both":          {`{"custom_id":"a","params":{},"method":"POST","url":"/v1/chat/completions","body":` + good + `}`, []string{"line 1: the line has params (an Anthropic request) and body, url or method (an OpenAI request): give one"}},
		"no model":      {oaLine("a", `{`+oaMsgs+`}`), []string{"line 1: body.model is missing"}},
		"unpriced":      {oaLine("a", `{"model":"gpt-9",`+oaMsgs+`}`), []string{`line 1: body.model "gpt-9": no price in the OpenAI price table (an OpenAI request line)`}},
		"zero max":      {oaLine("a", `{"model":"gpt-4.1","max_completion_tokens":0,`+oaMsgs+`}`), []string{"line 1: body.max_completion_tokens must be a positive integer, found 0"}},
		"n too large":   {oaLine("a", `{"model":"gpt-4.1","n":500,`+oaMsgs+`}`), []string{"line 1: body.n 500 is too large (at most 128)"}},
		"stream":        {oaLine("a", `{"model":"gpt-4.1","stream":true,`+oaMsgs+`}`), []string{"line 1: body.stream is true; requests are sent without streaming"}},
		"no messages":   {oaLine("a", `{"model":"gpt-4.1"}`), []string{"line 1: body.messages is missing"}},
		"body a string": {`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":"x"}`, []string{"line 1: body must be an object, found a string"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := Validate(writeTemp(t, tc.line+"\n"), ValidateOptions{})
			var got []string
			for _, p := range problems(t, err) {
				got = append(got, p.String())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// The OpenAI judge workload validates, and each line is an OpenAI item.
func TestGenerateOpenAIJudge(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := GenerateOpenAIJudge(&b, 50, 3, GenOptions{MaxTokens: 40}); err != nil {
		t.Fatal(err)
	}
	path := writeTemp(t, b.String())
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.N != 50 || sum.OpenAI != 50 || sum.OpenAIModels[DefaultOpenAIModel].MaxTokens != 50*40 || sum.OpenAIModels[DefaultOpenAIModel].EstInput < 50*100 {
		t.Fatalf("summary %+v %+v", sum, sum.OpenAIModels)
	}
}
