package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/apidispatch/apidispatch/store"
)

// FuzzValidate runs the reader and validator on arbitrary files and checks
// them against encoding/json: a line is reported malformed exactly when it
// is not valid JSON (or not UTF-8); an accepted file scans to N items with
// unique ids whose byte ranges read back to the same custom_id and params
// encoding/json sees.
func FuzzValidate(f *testing.F) {
	f.Add([]byte(good("a") + "\n" + good("b") + "\n"))
	f.Add([]byte("\xEF\xBB\xBF" + good("a") + "\r\n\r\n" + good("b")))
	f.Add([]byte(good("a") + "\n" + good("a")))
	f.Add([]byte(`{"custom_id":"x\u0041","params":{"model":"m","max_tokens":1,"messages":[1],"stream":false}}`))
	f.Add([]byte(`{"custom_id":"a","params":{"model":"m","max_tokens":1e2,"messages":[]}}` + "\n[1,2]\n\"s\"\n"))
	f.Add([]byte("\x00\xff\xfe garbage \n\n\t\n{"))
	f.Add([]byte(`{"custom_id":"a","params":{"model":"m","max_tokens":3,"messages":[{"content":"a\"b\\c\u00e9"}],"x":[true,false,null,-0.5e+3,{}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxLine = 4096
		path := filepath.Join(t.TempDir(), "f.jsonl")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum, err := Validate(path, ValidateOptions{MaxProblems: 1 << 30, MaxLineBytes: maxLine})
		if errors.Is(err, ErrEmpty) {
			for _, l := range splitLines(data) {
				if !isBlank(l) {
					t.Fatalf("ErrEmpty with non-blank line %q", l)
				}
			}
			return
		}
		var ve *ValidationError
		if err != nil && !errors.As(err, &ve) {
			t.Fatalf("unexpected error type: %v", err)
		}
		byLine := map[int64][]string{}
		if ve != nil {
			for i, p := range ve.Problems {
				if p.Line < 1 || p.Line > sum.Lines || i > 0 && p.Line < ve.Problems[i-1].Line {
					t.Fatalf("problem %d out of order or range: %v", i, p)
				}
				byLine[p.Line] = append(byLine[p.Line], p.Msg)
			}
		}
		for i, l := range splitLines(data) {
			if isBlank(l) || len(l) > maxLine {
				continue
			}
			syntaxOK := utf8.Valid(l) && json.Valid(l)
			reported := false
			for _, m := range byLine[int64(i+1)] {
				if strings.HasPrefix(m, "malformed JSON") || strings.HasPrefix(m, "not valid UTF-8") {
					reported = true
				}
			}
			if syntaxOK == reported {
				t.Fatalf("line %d %q: json.Valid=%v but reported=%v (%q)", i+1, l, syntaxOK, reported, byLine[int64(i+1)])
			}
		}
		if err != nil {
			return
		}
		fh, ferr := os.Open(path)
		if ferr != nil {
			t.Fatal(ferr)
		}
		defer fh.Close()
		ids := map[string]bool{}
		var n int64
		serr := Scan(path, func(it store.Item) error {
			n++
			if ids[it.CustomID] {
				t.Fatalf("duplicate id %q passed validation", it.CustomID)
			}
			ids[it.CustomID] = true
			params, err := ReadAt(fh, it)
			if err != nil {
				t.Fatalf("ReadAt(%+v): %v", it, err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(data[it.Offset:it.Offset+it.Length], &m); err != nil {
				t.Fatalf("range of %+v is not a JSON object: %v", it, err)
			}
			var id string
			json.Unmarshal(m["custom_id"], &id)
			if id != it.CustomID || !bytes.Equal(m["params"], params) {
				t.Fatalf("item %+v: encoding/json sees id %q params %s; ReadAt gave %s", it, id, m["params"], params)
			}
			return nil
		})
		if serr != nil {
			t.Fatalf("Scan after a clean Validate: %v", serr)
		}
		if n != sum.N {
			t.Fatalf("Scan gave %d items, Validate counted %d", n, sum.N)
		}
	})
}

// splitLines splits as the reader does: "\n" separators, a trailing "\r"
// dropped, a BOM at the start skipped, no empty last line after a final
// newline.
func splitLines(data []byte) [][]byte {
	data = bytes.TrimPrefix(data, utf8BOM)
	if len(data) == 0 {
		return nil
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	lines := bytes.Split(data, []byte("\n"))
	for i, l := range lines {
		lines[i] = bytes.TrimSuffix(l, []byte("\r"))
	}
	return lines
}

// FuzzParseLine checks the hand-written scanner against encoding/json on
// single lines (fast, so it explores far more inputs than FuzzValidate): the
// same lines are valid JSON, and on an object the custom_id and params it
// finds are the ones encoding/json decodes.
func FuzzParseLine(f *testing.F) {
	f.Add([]byte(good("a")))
	f.Add([]byte(`{"custom_id":"a","custom_id":1,"params":{"model":"m","params":2},"params":{"max_tokens":-0.0e-0}}`))
	f.Add([]byte(`{"custom\u005fid":"\ud83d\ude00","params":{"messages":[[],{},"",0,true,false,null]}}`))
	f.Add([]byte(` [ "\"\\\/\b\f\n\r\t" , 1.5E+10 ] `))
	f.Add([]byte("{\"a\":\"\xff\x80\"}"))
	f.Fuzz(func(t *testing.T, line []byte) {
		p := parser{b: line}
		var r request
		ok := parseRequest(&p, &r)
		if ok != json.Valid(line) {
			t.Fatalf("%q: scanner ok=%v, json.Valid=%v (%s)", line, ok, !ok, p.err)
		}
		_ = EstimateInputTokens(line) // must not panic on anything
		if !ok || r.top != kindObject {
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%q: valid object does not decode: %v", line, err)
		}
		if !utf8.Valid(line) {
			return // encoding/json rewrites invalid UTF-8 in keys and strings
		}
		raw, has := m["custom_id"]
		if has != (r.customIDKind != kindMissing) {
			t.Fatalf("%q: custom_id present=%v, scanner kind %v", line, has, r.customIDKind)
		}
		if r.customIDKind == kindString {
			var id string
			json.Unmarshal(raw, &id)
			got := string(line[r.customID.s:r.customID.e])
			if r.customID.esc {
				got = decodeString(line, r.customID)
			}
			if got != id {
				t.Fatalf("%q: custom_id %q, encoding/json %q", line, got, id)
			}
		}
		if r.paramsKind == kindObject && !bytes.Equal(line[r.params.s:r.params.e], m["params"]) {
			t.Fatalf("%q: params %q, encoding/json %q", line, line[r.params.s:r.params.e], m["params"])
		}
	})
}
