package workload

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/store"
)

// good is a valid request line with custom_id id.
func good(id string) string {
	return `{"custom_id":"` + id + `","params":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`
}

// withParams is a line with custom_id "x" and the given params text.
func withParams(params string) string {
	return `{"custom_id":"x","params":` + params + `}`
}

func writeTemp(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "requests.jsonl")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func problems(t *testing.T, err error) []Problem {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v is not a *ValidationError", err)
	}
	return ve.Problems
}

// TestValidateRules gives every rule a file, the line it is on and the exact
// message.
func TestValidateRules(t *testing.T) {
	t.Parallel()
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	long := strings.Repeat("a", 65)
	tests := []struct {
		name  string
		lines []string
		opts  ValidateOptions
		want  []Problem
	}{
		{"valid", []string{good("a"), good("b")}, ValidateOptions{}, nil},
		{"truncated JSON", []string{good("a"), `{"custom_id":"b","params":`}, ValidateOptions{},
			[]Problem{{2, "malformed JSON at column 27: unexpected end of line (expected a value)"}}},
		{"missing comma", []string{`{"custom_id":"a" "params":{}}`}, ValidateOptions{},
			[]Problem{{1, `malformed JSON at column 18: invalid character '"' (expected ',' or '}')`}}},
		{"trailing data", []string{good("a") + ` x`}, ValidateOptions{},
			[]Problem{{1, "malformed JSON at column 101: unexpected 'x' after the end of the JSON value"}}},
		{"two objects on a line", []string{good("a") + good("b")}, ValidateOptions{},
			[]Problem{{1, "malformed JSON at column 100: unexpected '{' after the end of the JSON value"}}},
		{"bad literal", []string{`{"custom_id":tru}`}, ValidateOptions{},
			[]Problem{{1, "malformed JSON at column 14: invalid character 't' (expected a value)"}}},
		{"bad number", []string{`{"custom_id":"a","n":01}`}, ValidateOptions{},
			[]Problem{{1, "malformed JSON at column 23: invalid character '1' (expected ',' or '}')"}}},
		{"bad escape", []string{`{"custom_id":"a\x"}`}, ValidateOptions{},
			[]Problem{{1, `malformed JSON at column 16: invalid escape 'x' in string`}}},
		{"raw control character", []string{"{\"custom_id\":\"a\tb\"}"}, ValidateOptions{},
			[]Problem{{1, `malformed JSON at column 16: control character '\t' in string (escape it)`}}},
		{"unterminated string", []string{`{"custom_id":"abc`}, ValidateOptions{},
			[]Problem{{1, `malformed JSON at column 14: unterminated string`}}},
		{"binary garbage", []string{good("a"), "\x00\x01\x02\x03"}, ValidateOptions{},
			[]Problem{{2, `malformed JSON at column 1: invalid character '\x00' (expected a value)`}}},
		{"invalid UTF-8", []string{`{"custom_id":"ab` + "\xff\xfe" + `"}`}, ValidateOptions{},
			[]Problem{{1, "not valid UTF-8 at column 17 (binary data?)"}}},
		{"array line", []string{`[1,2]`}, ValidateOptions{}, []Problem{{1, "the line is an array, not a JSON object"}}},
		{"string line", []string{`"hello"`}, ValidateOptions{}, []Problem{{1, "the line is a string, not a JSON object"}}},
		{"null line", []string{`null`}, ValidateOptions{}, []Problem{{1, "the line is null, not a JSON object"}}},
		{"missing custom_id", []string{`{"params":{"model":"m","max_tokens":1,` + msgs + `}}`}, ValidateOptions{},
			[]Problem{{1, "missing custom_id"}}},
		{"custom_id number", []string{`{"custom_id":12,"params":{"model":"m","max_tokens":1,` + msgs + `}}`}, ValidateOptions{},
			[]Problem{{1, "custom_id must be a string, found a number"}}},
		{"custom_id empty", []string{good("")}, ValidateOptions{},
			[]Problem{{1, "custom_id is empty (it must be 1 to 64 characters)"}}},
		{"custom_id characters", []string{good("ok"), good("a b")}, ValidateOptions{},
			[]Problem{{2, `custom_id "a b" has characters outside [a-zA-Z0-9_-]`}}},
		{"custom_id dot", []string{good("a.b")}, ValidateOptions{},
			[]Problem{{1, `custom_id "a.b" has characters outside [a-zA-Z0-9_-]`}}},
		{"custom_id length", []string{good(long)}, ValidateOptions{},
			[]Problem{{1, `custom_id "` + long + `" is 65 characters long (at most 64)`}}},
		{"custom_id 64 is fine", []string{good(strings.Repeat("Z", 64))}, ValidateOptions{}, nil},
		{"custom_id characters and length", []string{good(long + "!")}, ValidateOptions{},
			[]Problem{{1, `custom_id "` + long + `!" has characters outside [a-zA-Z0-9_-] and is 66 characters long (at most 64)`}}},
		{"custom_id escape decodes", []string{good(`\u0061b`), good("ab")}, ValidateOptions{},
			[]Problem{{2, `custom_id "ab" is a duplicate of line 1`}}},
		{"duplicate", []string{good("a"), good("b"), good("a"), good("c"), good("a")}, ValidateOptions{},
			[]Problem{{3, `custom_id "a" is a duplicate of line 1`}, {5, `custom_id "a" is a duplicate of line 1`}}},
		{"missing params", []string{`{"custom_id":"a"}`}, ValidateOptions{}, []Problem{{1, "missing params"}}},
		{"params string", []string{`{"custom_id":"a","params":"x"}`}, ValidateOptions{},
			[]Problem{{1, "params must be an object, found a string"}}},
		{"model missing", []string{withParams(`{"max_tokens":1,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.model is missing"}}},
		{"model number", []string{withParams(`{"model":4,"max_tokens":1,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.model must be a string, found a number"}}},
		{"model empty", []string{withParams(`{"model":"","max_tokens":1,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.model is empty"}}},
		{"max_tokens missing", []string{withParams(`{"model":"m",` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens is missing"}}},
		{"max_tokens string", []string{withParams(`{"model":"m","max_tokens":"5",` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens must be a positive integer, found a string"}}},
		{"max_tokens zero", []string{withParams(`{"model":"m","max_tokens":0,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens must be a positive integer, found 0"}}},
		{"max_tokens negative", []string{withParams(`{"model":"m","max_tokens":-3,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens must be a positive integer, found -3"}}},
		{"max_tokens fraction", []string{withParams(`{"model":"m","max_tokens":1.5,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens must be a positive integer, found 1.5"}}},
		{"max_tokens exponent", []string{withParams(`{"model":"m","max_tokens":1e3,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens must be a positive integer, found 1e3"}}},
		{"max_tokens huge", []string{withParams(`{"model":"m","max_tokens":99999999999999999999999,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.max_tokens 99999999999999999999999 is too large (at most 100000000)"}}},
		{"messages missing", []string{withParams(`{"model":"m","max_tokens":1}`)}, ValidateOptions{},
			[]Problem{{1, "params.messages is missing"}}},
		{"messages object", []string{withParams(`{"model":"m","max_tokens":1,"messages":{}}`)}, ValidateOptions{},
			[]Problem{{1, "params.messages must be a non-empty array, found an object"}}},
		{"messages empty", []string{withParams(`{"model":"m","max_tokens":1,"messages":[ ]}`)}, ValidateOptions{},
			[]Problem{{1, "params.messages is empty"}}},
		{"stream true", []string{good("a"), withParams(`{"model":"m","max_tokens":1,"stream":true,` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{2, "params.stream is true; requests are sent without streaming"}}},
		{"stream false is fine", []string{withParams(`{"model":"m","max_tokens":1,"stream":false,` + msgs + `}`)}, ValidateOptions{}, nil},
		{"stream string", []string{withParams(`{"model":"m","max_tokens":1,"stream":"yes",` + msgs + `}`)}, ValidateOptions{},
			[]Problem{{1, "params.stream must be a boolean, found a string"}}},
		{"several problems on one line", []string{`{"params":{"max_tokens":0,"messages":[]}}`}, ValidateOptions{},
			[]Problem{{1, "missing custom_id"}, {1, "params.model is missing"},
				{1, "params.max_tokens must be a positive integer, found 0"}, {1, "params.messages is empty"}}},
		{"blank lines keep numbering", []string{"", good("a"), "   ", "\t", `{"custom_id":"b"}`}, ValidateOptions{},
			[]Problem{{5, "missing params"}}},
		{"line too long", []string{good("a"), good(strings.Repeat("b", 200)), good("c")}, ValidateOptions{MaxLineBytes: 150},
			[]Problem{{2, "line is longer than the limit of 150 bytes; the rest of it was skipped"}}},
		{"nested too deeply", []string{withParams(`{"model":"m","max_tokens":1,` + msgs + `,"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`)},
			ValidateOptions{}, []Problem{{1, "malformed JSON at column 10101: nested too deeply"}}},
		{"escaped keys are decoded", []string{`{"custom\u005fid":"a","params":{"model":"m","max_tokens":1,` + msgs + `}}`}, ValidateOptions{}, nil},
		{"unknown model", []string{good("a"), strings.Replace(good("b"), `"m"`, `"gpt"`, 1), strings.Replace(good("c"), `"m"`, `"gpt"`, 1)},
			ValidateOptions{KnownModel: func(m string) error {
				if m == "gpt" {
					return errors.New("no price")
				}
				return nil
			}},
			[]Problem{{2, `params.model "gpt": no price`}, {3, `params.model "gpt": no price`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeTemp(t, strings.Join(tc.lines, "\n")+"\n")
			sum, err := Validate(path, tc.opts)
			if got := problems(t, err); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tc.want)
			}
			if sum == nil {
				t.Fatal("nil summary")
			}
			if sum.Lines != int64(len(tc.lines)) {
				t.Errorf("Lines = %d, want %d", sum.Lines, len(tc.lines))
			}
		})
	}
}

func TestValidationErrorFormat(t *testing.T) {
	t.Parallel()
	e := &ValidationError{Problems: []Problem{
		{12, `custom_id "a b" has characters outside [a-zA-Z0-9_-]`},
		{13, "missing params"},
	}, More: 7}
	want := "line 12: custom_id \"a b\" has characters outside [a-zA-Z0-9_-]\nline 13: missing params\n... and 7 more problem(s) not shown"
	if e.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", e.Error(), want)
	}
}

func TestValidateMaxProblems(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := 0; i < 60; i++ {
		lines = append(lines, `{"custom_id":"a b"}`) // two problems a line
	}
	path := writeTemp(t, strings.Join(lines, "\n"))
	_, err := Validate(path, ValidateOptions{MaxProblems: 5})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v", err)
	}
	if len(ve.Problems) != 5 || ve.More != 115 {
		t.Errorf("got %d problems + %d more, want 5 + 115", len(ve.Problems), ve.More)
	}
	if ve.Problems[4].Line != 3 {
		t.Errorf("5th problem on line %d, want 3", ve.Problems[4].Line)
	}
	if !strings.Contains(err.Error(), "and 115 more") {
		t.Errorf("Error() does not count the rest: %s", err)
	}
	_, err = Validate(path, ValidateOptions{})
	if !errors.As(err, &ve) || len(ve.Problems) != DefaultMaxProblems || ve.More != 70 {
		t.Errorf("default: %d problems + %d more, want 50 + 70", len(ve.Problems), ve.More)
	}
}

// TestDuplicatesMergeInLineOrder: duplicates (found in the second pass) and
// other problems interleave by line and share the MaxProblems budget.
func TestDuplicatesMergeInLineOrder(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := 0; i < 30; i++ {
		lines = append(lines, good("same"), `{"custom_id":"q"}`)
	}
	path := writeTemp(t, strings.Join(lines, "\n"))
	_, err := Validate(path, ValidateOptions{MaxProblems: 6})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v", err)
	}
	want := []Problem{
		{2, "missing params"},
		{3, `custom_id "same" is a duplicate of line 1`},
		{4, "missing params"}, // first-pass problems first within a line
		{4, `custom_id "q" is a duplicate of line 2`},
		{5, `custom_id "same" is a duplicate of line 1`},
		{6, "missing params"},
	}
	if !reflect.DeepEqual(ve.Problems, want) {
		t.Errorf("problems:\n got %q\nwant %q", ve.Problems, want)
	}
	// 30 "missing params" + 29 + 29 duplicates = 88 in all.
	if ve.More != 88-6 {
		t.Errorf("More = %d, want %d", ve.More, 88-6)
	}
}

// TestHashCollisionIsNotDuplicate forces every custom_id to the same hash:
// the exact second pass must tell distinct ids from true duplicates.
func TestHashCollisionIsNotDuplicate(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, strings.Join([]string{good("a"), good("b"), good("c"), good("b")}, "\n"))
	v := &validator{hash: func([]byte) uint64 { return 42 }}
	_, err := v.run(path)
	want := []Problem{{4, `custom_id "b" is a duplicate of line 2`}}
	if got := problems(t, err); !reflect.DeepEqual(got, want) {
		t.Errorf("problems = %q, want %q", got, want)
	}
	path = writeTemp(t, strings.Join([]string{good("a"), good("b"), good("c")}, "\n"))
	v = &validator{hash: func([]byte) uint64 { return 42 }}
	if _, err := v.run(path); err != nil {
		t.Errorf("distinct ids with one hash reported: %v", err)
	}
}

func TestValidateEmpty(t *testing.T) {
	t.Parallel()
	for _, content := range []string{"", "\n\n  \n", "\xEF\xBB\xBF", "\r\n"} {
		_, err := Validate(writeTemp(t, content), ValidateOptions{})
		if !errors.Is(err, ErrEmpty) {
			t.Errorf("Validate(%q) = %v, want ErrEmpty", content, err)
		}
	}
	if _, err := Validate(filepath.Join(t.TempDir(), "nope.jsonl"), ValidateOptions{}); err == nil || errors.Is(err, ErrEmpty) {
		t.Errorf("missing file: %v", err)
	}
}

func TestValidateSummary(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := GenerateJudge(&buf, 100, 1, GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := GenerateChat(&buf, 10, 1, GenOptions{Model: "claude-haiku-4-5", MaxTokens: 64}); err != nil {
		t.Fatal(err)
	}
	path := writeTemp(t, buf.String())
	calls := 0
	sum, err := Validate(path, ValidateOptions{KnownModel: func(string) error { calls++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(buf.Bytes())
	if sum.Hash != hex.EncodeToString(h[:]) || sum.Bytes != int64(buf.Len()) || sum.N != 110 || sum.Lines != 110 {
		t.Errorf("summary %+v", sum)
	}
	if calls != 2 {
		t.Errorf("KnownModel called %d times, want once per model (2)", calls)
	}
	if got := sum.ModelNames(); !reflect.DeepEqual(got, []string{"claude-haiku-4-5", DefaultModel}) {
		t.Errorf("models %v", got)
	}
	// The per-model sums equal what Scan yields.
	var est, maxTok = map[string]int64{}, map[string]int64{}
	err = Scan(path, func(it store.Item) error {
		est[it.Model] += it.EstInput
		maxTok[it.Model] += it.MaxTokens
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	j := sum.Models[DefaultModel]
	if j.N != 100 || j.MaxTokens != 25600 || j.EstInput != est[DefaultModel] {
		t.Errorf("judge summary %+v, scan est %d", j, est[DefaultModel])
	}
	if c := sum.Models["claude-haiku-4-5"]; c.N != 10 || c.MaxTokens != 640 || c.EstInput != est["claude-haiku-4-5"] {
		t.Errorf("chat summary %+v", c)
	}
	if avg := j.EstInput / j.N; avg < 260 || avg > 300 {
		t.Errorf("judge estimate %d tokens an item, want about 280", avg)
	}
}

// TestEndlessLine: a line far over the default 32 MiB limit is reported and
// skipped without being held whole in memory, and the lines after it keep
// their numbers and offsets.
func TestEndlessLine(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 80 MB")
	}
	path := filepath.Join(t.TempDir(), "big.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, good("a"))
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for i := 0; i < 80; i++ {
		f.Write(chunk)
	}
	fmt.Fprint(f, "\n"+good("b")+"\n"+`{"custom_id":"c"}`) // no final newline
	f.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sum, err := Validate(path, ValidateOptions{})
	runtime.ReadMemStats(&after)
	want := []Problem{
		{2, "line is longer than the limit of 33554432 bytes; the rest of it was skipped"},
		{4, "missing params"},
	}
	if got := problems(t, err); !reflect.DeepEqual(got, want) {
		t.Errorf("problems = %q, want %q", got, want)
	}
	if sum.LongestLine != 80<<20 {
		t.Errorf("LongestLine = %d", sum.LongestLine)
	}
	// The assembly buffer doubles up to the limit: about 2 × 32 MiB in all,
	// not the 80 MiB line (nor a copy per fragment).
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 100<<20 {
		t.Errorf("allocated %d MiB for an 80 MiB line", alloc>>20)
	}
}

// The summary counts, per model, the items whose params make them dearer
// (inference_geo "us", cache_control markers at 5-minute and 1-hour
// rates), as the API reads them: escaped keys too, words in text not.
func TestValidateCountsDearerItems(t *testing.T) {
	t.Parallel()
	lines := []string{
		`{"custom_id":"a","params":{"model":"m","max_tokens":5,"inference_geo":"us","messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"b","params":{"model":"m","max_tokens":5,"inference\u005fgeo":"us","messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"c","params":{"model":"m","max_tokens":5,"inference_geo":"global","messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"d","params":{"model":"m","max_tokens":5,"system":[{"type":"text","text":"r","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"e","params":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}}`,
		`{"custom_id":"f","params":{"model":"m","max_tokens":5,"cache_control":{"type":"ephemeral","ttl":"1\u0068"},"messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"g","params":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"\"inference_geo\":\"us\", \"cache_control\":{}"}]}}`,
		`{"custom_id":"h","params":{"model":"m","max_tokens":5,"system":[{"type":"text","text":"r","cache_control":null}],"messages":[{"role":"user","content":"hi"}]}}`,
	}
	path := writeTemp(t, strings.Join(lines, "\n")+"\n")
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := sum.Models["m"]; m.N != 8 || m.GeoUS != 2 || m.CacheWrite5m != 1 || m.CacheWrite1h != 2 {
		t.Errorf("summary %+v: want 8 items, 2 with inference_geo us, 1 with a 5-minute write, 2 with a 1-hour one", m)
	}
	// The estimate does not count a cache_control marker as text.
	var ests []int64
	if err := Scan(path, func(it store.Item) error { ests = append(ests, it.EstInput); return nil }); err != nil {
		t.Fatal(err)
	}
	plain := `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"r"}],"messages":[{"role":"user","content":"hi"}]}`
	if want := EstimateInputTokens([]byte(plain)); ests[3] != want {
		t.Errorf("estimate with a marker %d, without %d", ests[3], want)
	}
}
