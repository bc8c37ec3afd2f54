package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/store"
)

func scanAll(t testing.TB, path string) []store.Item {
	t.Helper()
	var items []store.Item
	if err := Scan(path, func(it store.Item) error { items = append(items, it); return nil }); err != nil {
		t.Fatal(err)
	}
	return items
}

// TestBOMAndCRLFRoundTrip: a file with a BOM, CRLF endings, a blank line and
// no final newline; every item's byte range holds exactly its line, and
// ReadAt returns its params byte for byte.
func TestBOMAndCRLFRoundTrip(t *testing.T) {
	t.Parallel()
	p1 := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"héllo"}]}`
	p2 := `{ "max_tokens" : 7 , "model" : "m2", "messages" : [ {"role":"user","content":[{"type":"text","text":"x"}]} ] }`
	p3 := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a\r\nb"}],"stream":false}`
	l1 := `{"custom_id":"first","params":` + p1 + `}`
	l2 := `  {"params":` + p2 + `, "custom_id":"sec\u006fnd"}  `
	l3 := `{"custom_id":"third","params":` + p3 + `}`
	content := "\xEF\xBB\xBF" + l1 + "\r\n\r\n" + l2 + "\r\n" + l3
	path := writeTemp(t, content)
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.N != 3 || sum.Lines != 4 || sum.Bytes != int64(len(content)) {
		t.Errorf("summary %+v", sum)
	}
	items := scanAll(t, path)
	want := []store.Item{
		{Seq: 1, Line: 1, CustomID: "first", Offset: 3, Length: int64(len(l1)), Model: "m", MaxTokens: 5},
		{Seq: 2, Line: 3, CustomID: "second", Offset: int64(3 + len(l1) + 4), Length: int64(len(l2)), Model: "m2", MaxTokens: 7},
		{Seq: 3, Line: 4, CustomID: "third", Offset: int64(3 + len(l1) + 4 + len(l2) + 2), Length: int64(len(l3)), Model: "m", MaxTokens: 1},
	}
	if len(items) != len(want) {
		t.Fatalf("got %d items", len(items))
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, it := range items {
		w := want[i]
		w.EstInput = it.EstInput
		if it != w {
			t.Errorf("item %d = %+v, want %+v", i, it, w)
		}
		if got := content[it.Offset : it.Offset+it.Length]; got != []string{l1, l2, l3}[i] {
			t.Errorf("item %d range holds %q", i, got)
		}
		params, err := ReadAt(f, it)
		if err != nil {
			t.Fatal(err)
		}
		if string(params) != []string{p1, p2, p3}[i] {
			t.Errorf("item %d params = %s", i, params)
		}
		if est := EstimateInputTokens(params); est != it.EstInput {
			t.Errorf("item %d: EstimateInputTokens = %d, Scan said %d", i, est, it.EstInput)
		}
	}
}

func TestReadAtDetectsChange(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, good("a")+"\n"+good("b")+"\n")
	items := scanAll(t, path)
	// Same length, another id: the file was edited.
	if err := os.WriteFile(path, []byte(good("a")+"\n"+good("c")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	if _, err := ReadAt(f, items[0]); err != nil {
		t.Errorf("unchanged line: %v", err)
	}
	_, err := ReadAt(f, items[1])
	if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), `custom_id is "c", want "b"`) {
		t.Errorf("changed id: %v", err)
	}
	// Shifted lines: the range now cuts a line in two.
	os.WriteFile(path, []byte("\n\n"+good("a")+"\n"+good("b")+"\n"), 0o644)
	if _, err := ReadAt(f, items[1]); !errors.Is(err, ErrChanged) {
		t.Errorf("shifted: %v", err)
	}
	// Truncated.
	os.WriteFile(path, []byte(good("a")), 0o644)
	if _, err := ReadAt(f, items[1]); !errors.Is(err, ErrChanged) {
		t.Errorf("truncated: %v", err)
	}
	if _, err := ReadAt(f, store.Item{CustomID: "a", Length: 0}); err == nil {
		t.Error("zero-length range accepted")
	}
}

// TestReadAtConcurrent reads every item of one *os.File from many
// goroutines (run with -race).
func TestReadAtConcurrent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	GenerateJudge(&buf, 2000, 3, GenOptions{})
	path := writeTemp(t, buf.String())
	items := scanAll(t, path)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(items); i += 8 {
				p, err := ReadAt(f, items[i])
				if err != nil {
					errs <- err
					return
				}
				var mp struct{ Model string }
				if err := json.Unmarshal(p, &mp); err != nil || mp.Model != DefaultModel {
					errs <- fmt.Errorf("item %d: %v %q", i, err, mp.Model)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestScanStopsOnProblemAndCallbackError(t *testing.T) {
	t.Parallel()
	path := writeTemp(t, good("a")+"\n"+`{"custom_id":"b"}`+"\n")
	n := 0
	err := Scan(path, func(store.Item) error { n++; return nil })
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Problems[0] != (Problem{2, "missing params"}) || n != 1 {
		t.Errorf("err = %v after %d items", err, n)
	}
	stop := errors.New("stop")
	if err := Scan(path, func(store.Item) error { return stop }); err != stop {
		t.Errorf("callback error came back as %v", err)
	}
}

func TestEstimateInputTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		want   int64
	}{
		// ceil(4/4) + 4×1 message + 4 = 9.
		{"one message", `{"messages":[{"role":"user","content":"abcd"}]}`, 9},
		// (8+4)/4 = 3, + 4 + 4 = 11.
		{"system string", `{"system":"12345678","messages":[{"role":"user","content":"abcd"}]}`, 11},
		// "type" values and cache_control are structure, not text: 9.
		{"blocks", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`, 9},
		// h, l, l, o = 4 ASCII → 1; é → 1; + 8 = 10.
		{"non-ASCII", `{"messages":[{"role":"user","content":"héllo"}]}`, 10},
		// An escape is one character: "a\nb" = 3 → 1; + 8 = 9.
		{"escape", `{"messages":[{"role":"user","content":"a\nb"}]}`, 9},
		// \u00e9 is non-ASCII: 1; "ab" → 1; + 8 = 10.
		{"unicode escape", `{"messages":[{"role":"user","content":"a\u00e9b"}]}`, 10},
		// Base64 data is capped at 6,400 characters = 1,600; + 8 = 1,608.
		{"image", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` +
			strings.Repeat("A", 100000) + `"}}]}]}`, 1608},
		// Two messages: ceil(9/4) = 3 + 8 + 4 = 15.
		{"two messages", `{"messages":[{"role":"user","content":"abcd"},{"role":"assistant","content":"efghi"}]}`, 15},
		// Tools count: "get_time" 8 + "Get the time" 12 = 20 → 5; + 4 + 4 = 13.
		{"tools", `{"tools":[{"name":"get_time","description":"Get the time","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":""}]}`, 13},
		// Other params are not text: model, metadata.
		{"other params ignored", `{"model":"claude-sonnet-4-5","metadata":{"user_id":"abcdefgh"},"messages":[{"role":"user","content":"abcd"}]}`, 9},
		// Malformed: a quarter of the length, rounded up: 7 bytes → 2.
		{"malformed", `{"messa`, 2},
	}
	for _, tc := range tests {
		if got := EstimateInputTokens(json.RawMessage(tc.params)); got != tc.want {
			t.Errorf("%s: EstimateInputTokens = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestLongLineRoundTrip: a line longer than the read buffer (assembled in
// pieces) with a CRLF ending keeps its exact range and params.
func TestLongLineRoundTrip(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("abcdefgh", 3<<20/8) // 3 MiB of prompt
	params := `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"` + text + `"}]}`
	long := `{"custom_id":"big","params":` + params + `}`
	content := good("a") + "\r\n" + long + "\r\n" + good("b") + "\r\n"
	path := writeTemp(t, content)
	sum, err := Validate(path, ValidateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.LongestLine != int64(len(long)) {
		t.Errorf("LongestLine = %d, want %d", sum.LongestLine, len(long))
	}
	items := scanAll(t, path)
	if len(items) != 3 || items[1].Length != int64(len(long)) || items[2].Offset != int64(len(good("a"))+2+len(long)+2) {
		t.Fatalf("items %+v", items)
	}
	if want := int64(3<<20/4 + 4 + 4); items[1].EstInput != want {
		t.Errorf("EstInput = %d, want %d", items[1].EstInput, want)
	}
	f, _ := os.Open(path)
	defer f.Close()
	got, err := ReadAt(f, items[1])
	if err != nil || string(got) != params {
		t.Errorf("ReadAt: %v (%d bytes)", err, len(got))
	}
}
