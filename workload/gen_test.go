package workload

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

type judgeLine struct {
	CustomID string `json:"custom_id"`
	Params   struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		System    []struct {
			Type         string            `json:"type"`
			Text         string            `json:"text"`
			CacheControl map[string]string `json:"cache_control"`
		} `json:"system"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	} `json:"params"`
}

func TestGenerateJudge(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := GenerateJudge(&buf, 500, 7, GenOptions{}); err != nil {
		t.Fatal(err)
	}
	path := writeTemp(t, buf.String())
	if sum, err := Validate(path, ValidateOptions{}); err != nil || sum.N != 500 {
		t.Fatalf("generated file does not validate: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	seen := map[string]bool{}
	total := 0
	for i, l := range lines {
		var j judgeLine
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			t.Fatal(err)
		}
		p := j.Params
		if want := "phase6_" + pad6(i); j.CustomID != want {
			t.Fatalf("line %d id %q, want %q", i, j.CustomID, want)
		}
		if p.Model != DefaultModel || p.MaxTokens != 256 || len(p.System) != 1 || p.System[0].Type != "text" ||
			p.System[0].Text != JudgeRubric || p.System[0].CacheControl["type"] != "ephemeral" ||
			len(p.Messages) != 1 || p.Messages[0].Role != "user" {
			t.Fatalf("line %d has the wrong shape: %s", i, l)
		}
		c := p.Messages[0].Content
		if !strings.HasPrefix(c, "Question asked to the AI: ") || !strings.Contains(c, "\n\nAI's response: ") ||
			!strings.HasSuffix(c, " Item "+itoa(i)+".\n\nProvide your evaluation as a JSON object.") {
			t.Fatalf("line %d content %q", i, c)
		}
		if seen[c] {
			t.Fatalf("line %d repeats a content", i)
		}
		seen[c] = true
		total += len(c)
	}
	if avg := total / len(lines); avg < 330 || avg > 400 {
		t.Errorf("average user message %d characters, want about 364", avg)
	}
	if n := len(JudgeRubric); n < 680 || n > 760 {
		t.Errorf("rubric is %d characters, want about 720", n)
	}
}

func TestGenerateDeterministic(t *testing.T) {
	t.Parallel()
	for _, shape := range []Shape{ShapeJudge, ShapeChat} {
		gen := func(n int, seed int64) string {
			var b bytes.Buffer
			if err := Generate(&b, shape, n, seed, GenOptions{}); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}
		a, b := gen(300, 1), gen(300, 1)
		if a != b {
			t.Errorf("%s: same seed, different output", shape)
		}
		if c := gen(300, 2); c == a {
			t.Errorf("%s: seed does not change the output", shape)
		}
		if p := gen(40, 1); !strings.HasPrefix(a, p) {
			t.Errorf("%s: the first 40 items depend on n", shape)
		}
	}
}

func TestGenerateOptions(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	err := GenerateJudge(&buf, 3, 0, GenOptions{Model: "claude-haiku-4-5", MaxTokens: 64, Prefix: "run-2_"})
	if err != nil {
		t.Fatal(err)
	}
	var j judgeLine
	first, _, _ := strings.Cut(buf.String(), "\n")
	json.Unmarshal([]byte(first), &j)
	if j.CustomID != "run-2_000000" || j.Params.Model != "claude-haiku-4-5" || j.Params.MaxTokens != 64 {
		t.Errorf("options not applied: %+v", j)
	}
	buf.Reset()
	if err := GenerateJudge(&buf, 0, 0, GenOptions{}); err != nil || buf.Len() != 0 {
		t.Errorf("n=0: %v, %d bytes", err, buf.Len())
	}
	bad := []GenOptions{
		{Prefix: "a b"},
		{Prefix: strings.Repeat("p", 59)},
		{MaxTokens: -1},
	}
	for _, o := range bad {
		if err := GenerateJudge(&buf, 1, 0, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
	if err := GenerateJudge(&buf, -1, 0, GenOptions{}); err == nil {
		t.Error("negative n accepted")
	}
	if err := Generate(&buf, "essay", 1, 0, GenOptions{}); err == nil {
		t.Error("unknown shape accepted")
	}
	// Past a million items the index simply grows a digit.
	g, _ := newGen(&buf, 2_000_000, GenOptions{}, "p_")
	if got := string(g.start(1_234_567, "")); got != `{"custom_id":"p_1234567` {
		t.Errorf("start = %s", got)
	}
}

func TestGenerateChat(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := GenerateChat(&buf, 300, 5, GenOptions{}); err != nil {
		t.Fatal(err)
	}
	path := writeTemp(t, buf.String())
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.N != 300 {
		t.Errorf("N = %d", sum.N)
	}
	lo, hi, sys := int64(1<<62), int64(0), 0
	for _, it := range scanAll(t, path) {
		lo, hi = min(lo, it.EstInput), max(hi, it.EstInput)
		if !strings.HasPrefix(it.CustomID, "chat_") {
			t.Fatalf("id %q", it.CustomID)
		}
	}
	sys = strings.Count(buf.String(), `"system":`)
	if hi < 3*lo {
		t.Errorf("prompt estimates %d..%d tokens: not varied enough", lo, hi)
	}
	if sys < 50 || sys > 150 {
		t.Errorf("%d of 300 have a system prompt, want about a third", sys)
	}
}

func pad6(i int) string { s := itoa(i); return strings.Repeat("0", 6-len(s)) + s }

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
