package cache

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/workload"
)

var canonSeeds = []string{
	base,
	`{}`,
	`{"b":1,"a":{"d":[1,2.50,{"z":null,"y":true}],"c":false}}`,
	`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"q\" \\ \n tab\t <>&  \u2028 ☃"}]}`,
	"{\"model\":\"m\",\"x\":\"caf\xc3\xa9 bad \xff utf8\"}",
	`{"a":1,"a":2}`,
	`{"n":[0,-0,1e400,1E2,0.000001,123456789012345678901234567890,-1.5e-7]}`,
	`{"metadata":{"user_id":"x"},"temperature":0.0}`,
	" \t\n{ \"k\" : [ ] , \"e\" : { } }\n",
	`{"ключ":"значение","ascii":"v"}`,
	`{"a":"\ud83d\ude00","b":"\u0041"}`,
}

// The fast canonical form is byte for byte the encoding/json one.
func TestCanonicalMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := workload.GenerateJudge(&b, 50, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.Generate(&b, workload.Shape("chat"), 50, 3, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	seeds := append([]string{}, canonSeeds...)
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var r struct {
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, string(r.Params))
	}
	for _, s := range seeds {
		checkCanon(t, []byte(s))
	}
}

func checkCanon(t *testing.T, p []byte) {
	t.Helper()
	fast, ferr := Canonical(p)
	slow, serr := canonicalSlow(p)
	if (ferr == nil) != (serr == nil) {
		t.Fatalf("%q: fast err %v, slow err %v", p, ferr, serr)
	}
	if ferr == nil && !bytes.Equal(fast, slow) {
		t.Fatalf("%q:\nfast %s\nslow %s", p, fast, slow)
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range canonSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`[1]`))
	f.Add([]byte(`{"a":}`))
	f.Fuzz(func(t *testing.T, p []byte) { checkCanon(t, p) })
}

// A Messages body keys as the same params in a request line, with or
// without "stream"; a request line's params keep it in their key.
func TestInspectMessageLeavesOutStream(t *testing.T) {
	plain := []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":0}`)
	want, _, err := Inspect(plain)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":0}`,
		`{"stream":false,"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":0}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":0,"stream":true,"metadata":{"user_id":"u"}}`,
	} {
		k, sampled, err := InspectMessage([]byte(b))
		if err != nil || sampled || k != want {
			t.Errorf("%s: key %v sampled %v err %v, want the plain params' key", b, k, sampled, err)
		}
	}
	k, _, _ := Inspect([]byte(`{"stream":false,"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":0}`))
	if k == want {
		t.Error("a request line's params lost their stream field from the key")
	}
	other, _, _ := InspectMessage([]byte(`{"model":"m","max_tokens":6,"messages":[{"role":"user","content":"hi"}],"temperature":0}`))
	if other == want {
		t.Error("another max_tokens has the same key")
	}
}
