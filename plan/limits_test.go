package plan

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestLoadLimitsPhase0 reads a file in the shape of the original system's
// phase0_limits.json (orgs → model → raw headers), written from the table
// of docs/design.md §24 (no keys; org ids made up from the published prefixes).
func TestLoadLimitsPhase0(t *testing.T) {
	t.Parallel()
	l, err := LoadLimits("testdata/phase0_limits.json")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		org, model     string
		status         int
		rpm, itpm, otp int64
	}
	want := []row{
		{"high_prio", "claude-sonnet-4-5-20250929", 200, 30_000, 10_000_000, 1_000_000},
		{"high_prio", "claude-haiku-4-5-20251001", 429, 30_000, 0, 1_200_000}, // no ITPM header at the probe
		{"high_prio", "claude-opus-4-8", 200, 150_000, 60_000_000, 10_000_000},
		{"high_prio", "claude-3-5-sonnet-20241022", 404, 0, 0, 0},
		{"batch", "claude-sonnet-4-5-20250929", 200, 90_000, 8_000_000, 800_000},
		{"batch", "claude-haiku-4-5-20251001", 200, 4_000, 8_000_000, 800_000},
		{"batch", "claude-opus-4-8", 200, 4_000, 10_000_000, 2_000_000},
		{"low_prio", "claude-sonnet-4-5-20250929", 200, 30_000, 15_000_000, 1_200_000},
		{"low_prio", "claude-haiku-4-5-20251001", 200, 30_000, 24_000_000, 2_400_000},
		{"low_prio", "claude-opus-4-8", 200, 150_000, 120_000_000, 12_000_000},
	}
	for _, w := range want {
		m, ok := l.Orgs[w.org][w.model]
		if !ok {
			t.Errorf("%s/%s missing", w.org, w.model)
			continue
		}
		if m.Status != w.status || m.RPM != w.rpm || m.ITPM != w.itpm || m.OTPM != w.otp {
			t.Errorf("%s/%s = status %d rpm %d itpm %d otpm %d; want %+v", w.org, w.model, m.Status, m.RPM, m.ITPM, m.OTPM, w)
		}
	}
	hh := l.Orgs["high_prio"]["claude-haiku-4-5-20251001"]
	if hh.Remaining.OutputTokens != 0 || hh.Remaining.Requests != 29_999 || !strings.Contains(hh.Error, "rate_limit_error") {
		t.Errorf("high_prio haiku = %+v", hh)
	}
	if got := l.Orgs["low_prio"]["claude-sonnet-4-5-20250929"].Remaining; got.InputTokens != 14_973_000 || got.OutputTokens != 1_199_000 {
		t.Errorf("low_prio sonnet remaining = %+v", got)
	}
	if got := l.Orgs["batch"]["claude-opus-4-8"]; got.ServiceTier != "standard" || got.OrgID != "b4bbba0c-0000-4000-8000-000000000002" || got.Pool != "opus-4" {
		t.Errorf("batch opus = %+v", got)
	}
	if l.Source != "phase0_limits.json" || !l.OrgsDistinctAdditive || len(l.SharedOrgs) != 0 {
		t.Errorf("source %q additive %v shared %v", l.Source, l.OrgsDistinctAdditive, l.SharedOrgs)
	}
	if got := l.OrgNames(); !reflect.DeepEqual(got, []string{"batch", "high_prio", "low_prio"}) {
		t.Errorf("OrgNames = %v", got)
	}

	// Round trip through our own format keeps every figure.
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"headers"`) {
		t.Errorf("our format must not carry raw headers")
	}
	l2, err := ParseLimits(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Orgs, l2.Orgs) || !reflect.DeepEqual(l.OrgIDs, l2.OrgIDs) {
		t.Errorf("round trip changed the limits:\n%+v\n%+v", l.Orgs, l2.Orgs)
	}
}

func TestLimitsFor(t *testing.T) {
	t.Parallel()
	l, err := LoadLimits("testdata/phase0_limits.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		org, model, from string
		ok               bool
	}{
		{"high_prio", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20250929", true}, // exact
		{"high_prio", "claude-sonnet-4-5", "claude-sonnet-4-5-20250929", true},          // without the date
		{"high_prio", "claude-sonnet-4-6", "claude-sonnet-4-5-20250929", true},          // same pool
		{"batch", "claude-opus-4-5-20251101", "claude-opus-4-8", true},                  // same pool
		{"low_prio", "claude-haiku-4-5", "claude-haiku-4-5-20251001", true},
		{"low_prio", "claude-sonnet-5", "", false}, // pool never probed
		{"nobody", "claude-sonnet-4-5", "", false},
	}
	for _, tc := range tests {
		_, from, ok := l.For(tc.org, tc.model)
		if ok != tc.ok || from != tc.from {
			t.Errorf("For(%s, %s) = %q, %v; want %q, %v", tc.org, tc.model, from, ok, tc.from, tc.ok)
		}
	}
	var nilL *Limits
	if _, _, ok := nilL.For("a", "b"); ok {
		t.Error("nil Limits found something")
	}
}

func TestLoadLimitsSharedOrgs(t *testing.T) {
	t.Parallel()
	doc := `{"format":"apidispatch-limits/1","orgs":{
	  "a":{"claude-sonnet-4-5":{"status":200,"rpm":50,"itpm":30000,"otpm":8000,"org_id":"org-1"}},
	  "b":{"claude-sonnet-4-5":{"status":200,"rpm":50,"itpm":30000,"otpm":8000,"org_id":"org-1"}},
	  "c":{"claude-sonnet-4-5":{"status":200,"rpm":50,"itpm":30000,"otpm":8000,"org_id":"org-2"}}}}`
	l, err := ParseLimits([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.SharedOrgs, [][]string{{"a", "b"}}) || l.OrgsDistinctAdditive {
		t.Errorf("shared = %v, additive %v", l.SharedOrgs, l.OrgsDistinctAdditive)
	}
	if l.Orgs["c"]["claude-sonnet-4-5"].Pool != "sonnet-4" {
		t.Errorf("pool not filled in: %+v", l.Orgs["c"])
	}
}

func TestLoadLimitsErrors(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`not json`,
		`{}`,
		`{"orgs":{}}`,
		`{"orgs":{"a":{"m":{"rpm":-1}}}}`,
		`{"orgs":{"":{"m":{"rpm":1}}}}`,
		`{"orgs":{"a":{"":{"rpm":1}}}}`,
	} {
		if _, err := ParseLimits([]byte(doc)); !errors.Is(err, ErrLimitsFile) {
			t.Errorf("ParseLimits(%s) err = %v, want ErrLimitsFile", doc, err)
		}
	}
	if _, err := LoadLimits("testdata/does-not-exist.json"); err == nil || errors.Is(err, ErrLimitsFile) {
		t.Errorf("missing file: err = %v, want an I/O error", err)
	}
}

func FuzzParseLimits(f *testing.F) {
	f.Add([]byte(`{"orgs":{"a":{"claude-sonnet-4-5":{"status":200,"rpm":50,"itpm":30000,"otpm":8000,"org_id":"x"}}}}`))
	f.Add([]byte(`{"orgs":{"a":{"m":{"status":429,"headers":{"anthropic-ratelimit-requests-limit":"7","anthropic-organization-id":"o"}}}}}`))
	f.Add([]byte(`{"orgs":{"a":{"m":{"headers":{"anthropic-ratelimit-output-tokens-limit":"1e3"}}}},"org_ids":{"a":"o","b":"o"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLimits(b)
		if err != nil {
			return
		}
		out, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		l2, err := ParseLimits(out)
		if err != nil {
			t.Fatalf("our own output does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(l.Orgs, l2.Orgs) {
			t.Fatalf("round trip changed the limits")
		}
		for on := range l.Orgs {
			for m := range l.Orgs[on] {
				l.For(on, m)
			}
		}
	})
}
