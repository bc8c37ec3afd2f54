package promptcache

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// pad makes a text long enough to be worth caching.
var pad = strings.Repeat("Grade the answer on accuracy and clarity. ", 60)

var rubric = `[{"type":"text","text":"You are a judge. ` + pad + `","cache_control":{"type":"ephemeral"}}]`

func judge(item string) []byte {
	return []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"system":` + rubric +
		`,"messages":[{"role":"user","content":"` + item + `"}]}`)
}

func TestOfSamePrefixSameKey(t *testing.T) {
	a, ok1 := Of("claude-sonnet-4-5", judge("item 1"))
	b, ok2 := Of("claude-sonnet-4-5", judge("item 2"))
	if !ok1 || !ok2 || a.Key != b.Key {
		t.Fatalf("two items of one rubric: %v %v, keys %v %v", ok1, ok2, a.Key, b.Key)
	}
	if a.TTL != TTLDefault || a.Bytes != len(rubric)-1 {
		t.Errorf("prefix %+v: want the default ttl and the rubric's size (%d)", a, len(rubric))
	}
	// The Go SDK writes messages before system: the prefix is the API's
	// order, not the JSON's.
	c, ok := Of("claude-sonnet-4-5", []byte(`{"max_tokens":64,"messages":[{"role":"user","content":"item 3"}],"model":"claude-sonnet-4-5","system":`+rubric+`}`))
	if !ok || c.Key != a.Key {
		t.Errorf("messages before system: key %v, want %v", c.Key, a.Key)
	}
}

func TestOfDifferentPrefixes(t *testing.T) {
	base, _ := Of("claude-sonnet-4-5", judge("x"))
	other := strings.Replace(string(judge("x")), "Grade", "Score", 1)
	cases := map[string]struct {
		model string
		body  []byte
	}{
		"another rubric": {"claude-sonnet-4-5", []byte(other)},
		"another model":  {"claude-sonnet-4-6", judge("x")},
		"with tools": {"claude-sonnet-4-5", []byte(`{"model":"m","tools":[{"name":"t","input_schema":{}}],"system":` + rubric +
			`,"messages":[{"role":"user","content":"x"}]}`)},
	}
	for name, c := range cases {
		p, ok := Of(c.model, c.body)
		if !ok || p.Key == base.Key {
			t.Errorf("%s: ok=%v, key %v equals the base's", name, ok, p.Key)
		}
	}
}

// A marker written before the block's text (encoding/json sorts map
// keys) marks the whole block: two rubrics differ.
func TestOfMarkerBeforeText(t *testing.T) {
	body := func(rubric string) []byte {
		return []byte(`{"max_tokens":9,"messages":[{"content":"q","role":"user"}],"model":"m","system":[{"cache_control":{"ttl":"1h","type":"ephemeral"},"text":"` + rubric + pad + `","type":"text"}]}`)
	}
	a, ok1 := Of("m", body("rubric one"))
	b, ok2 := Of("m", body("rubric two"))
	if !ok1 || !ok2 || a.Key == b.Key || a.TTL != TTL1h {
		t.Errorf("two rubrics, marker first: %+v %+v", a, b)
	}
}

func TestOfMarkerInMessages(t *testing.T) {
	conv := func(last string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"long document ` + pad + `","cache_control":{"type":"ephemeral","ttl":"1h"}}]},` +
			`{"role":"assistant","content":"ok"},{"role":"user","content":"` + last + `"}]}`)
	}
	a, ok1 := Of("m", conv("question 1"))
	b, ok2 := Of("m", conv("question 2"))
	if !ok1 || !ok2 || a.Key != b.Key || a.TTL != TTL1h {
		t.Errorf("two questions on one cached document: %+v %+v", a, b)
	}
}

func TestOfNothingMarked(t *testing.T) {
	for _, body := range []string{
		// Too short for any model to cache.
		`{"model":"m","system":[{"type":"text","text":"short","cache_control":{"type":"ephemeral"}}],"messages":[]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		// The words inside a text are escaped, never a marker.
		`{"model":"m","messages":[{"role":"user","content":"say \"cache_control\": yes"}]}`,
		`not json "cache_control"`,
		`{"model":"m","cache_control":null,"messages":[]}`,
		`{"model":"m","system":"x","cache_control"`,
	} {
		if p, ok := Of("m", []byte(body)); ok {
			t.Errorf("%s: prefix %+v, want none", body, p)
		}
	}
}

func TestOfAutomaticCaching(t *testing.T) {
	body := func(q string) []byte {
		return []byte(`{"model":"m","cache_control":{"type":"ephemeral","ttl":"1h"},"messages":[{"role":"user","content":"` + q + pad + `"}]}`)
	}
	a, ok := Of("m", body("a"))
	b, _ := Of("m", body("b"))
	if !ok || a.TTL != TTL1h || a.Key == b.Key {
		t.Errorf("automatic caching marks the whole prompt: %+v %+v", a, b)
	}
}

func FuzzOf(f *testing.F) {
	f.Add(judge("x"))
	f.Add([]byte(`{"cache_control":{"ttl":"1h"}}`))
	f.Add([]byte(`{"system":"\"cache_control\"","messages":[{"cache_control":{}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, ok := Of("m", b)
		if ok && (p.Bytes > len(b) || p.TTL != TTLDefault && p.TTL != TTL1h) {
			t.Errorf("prefix %+v of %d bytes", p, len(b))
		}
	})
}

func TestPlacesWarmth(t *testing.T) {
	pl := NewPlaces(10)
	p, _ := Of("m", judge("x"))
	t0 := time.Unix(1000, 0)
	orgs := []string{"a", "b", "c"}
	w := make([]Warmth, 3)
	where := func(at time.Time) []Warmth {
		t.Helper()
		if !pl.Where(at, p, orgs, w) {
			t.Fatal("prefix not worth placing")
		}
		return slices.Clone(w)
	}
	if got := where(t0); !slices.Equal(got, []Warmth{Cold, Cold, Cold}) {
		t.Errorf("new prefix: %v", got)
	}
	pl.Sent(t0, p, "b")
	if got := where(t0); !slices.Equal(got, []Warmth{Cold, Warming, Cold}) {
		t.Errorf("sent to b: %v", got)
	}
	pl.Answered(t0.Add(time.Second), p, "b", true, 1500)
	if got := where(t0.Add(time.Second)); !slices.Equal(got, []Warmth{Cold, Warm, Cold}) {
		t.Errorf("answered by b: %v", got)
	}
	// 5 API-minutes at speed 10 is 30 s.
	if got := where(t0.Add(30 * time.Second)); !slices.Equal(got, []Warmth{Cold, Warm, Cold}) {
		t.Errorf("29 s after: %v", got)
	}
	if got := where(t0.Add(31 * time.Second)); !slices.Equal(got, []Warmth{Cold, Cold, Cold}) {
		t.Errorf("past its lifetime: %v", got)
	}
	// A writer not answered within WritingFor (30 API-seconds, 3 s at
	// speed 10) no longer counts as writing.
	pl.Sent(t0, p, "c")
	if got := where(t0.Add(2 * time.Second)); got[2] != Warming {
		t.Errorf("2 s after c's writer left: %v", got)
	}
	if got := where(t0.Add(4 * time.Second)); got[2] != Cold {
		t.Errorf("4 s after c's writer left: %v", got)
	}
	pl.Answered(t0.Add(4*time.Second), p, "c", false, 0)
	// A failure ends the request without warming.
	pl.Sent(t0, p, "a")
	pl.Answered(t0, p, "a", false, 0)
	if got := where(t0); got[0] != Cold {
		t.Errorf("a failed: %v", got)
	}
	// A success that cached nothing: not worth placing.
	pl.Sent(t0.Add(40*time.Second), p, "c")
	pl.Answered(t0.Add(40*time.Second), p, "c", true, 0)
	if pl.Where(t0.Add(41*time.Second), p, orgs, w) || pl.Where(t0.Add(time.Hour), p, orgs, w) {
		t.Error("a prefix the API did not cache is still placed")
	}
}

func TestPlacesSweep(t *testing.T) {
	pl := NewPlaces(1)
	t0 := time.Unix(1000, 0)
	for i := range 3 * sweepEvery {
		p, _ := Of("m", judge("x"))
		p.Key.a += uint64(i)
		at := t0.Add(time.Duration(i) * time.Second) // each expires after 300 s
		pl.Sent(at, p, "a")
		pl.Answered(at, p, "a", true, 1)
	}
	if n := pl.Len(); n > sweepEvery+400 {
		t.Errorf("%d prefixes tracked, most long expired", n)
	}
}

func TestRank(t *testing.T) {
	order := []int{0, 1, 2, 3}
	Rank([]Warmth{Cold, Warming, Warm, Warm}, order)
	if !slices.Equal(order, []int{2, 3, 1, 0}) {
		t.Errorf("order %v, want warm (2, 3), warming (1), cold (0)", order)
	}
	order = []int{3, 0, 1, 2}
	Rank([]Warmth{Cold, Cold, Cold, Cold}, order)
	if !slices.Equal(order, []int{3, 0, 1, 2}) {
		t.Errorf("all cold: order %v changed", order)
	}
}

func TestWaits(t *testing.T) {
	cases := []struct {
		w    []Warmth
		full []bool
		want bool
	}{
		{[]Warmth{Cold, Cold}, []bool{false, false}, false},
		{[]Warmth{Warming, Cold}, []bool{false, false}, true}, // wait for a's answer
		{[]Warmth{Warming, Warm}, []bool{false, false}, false},
		{[]Warmth{Warming, Warm}, []bool{false, true}, true}, // warm only where full
		{[]Warmth{Warm, Cold}, []bool{true, false}, false},   // the next lane warms it
	}
	for _, c := range cases {
		if got := Waits(c.w, c.full); got != c.want {
			t.Errorf("Waits(%v, %v) = %v, want %v", c.w, c.full, got, c.want)
		}
	}
}
