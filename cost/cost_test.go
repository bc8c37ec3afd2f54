package cost

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
)

func TestCost(t *testing.T) {
	t.Parallel()
	split := func(m5, h1 int64) *anthropic.CacheCreation {
		return &anthropic.CacheCreation{Ephemeral5mInputTokens: m5, Ephemeral1hInputTokens: h1}
	}
	tests := []struct {
		name  string
		model string
		u     anthropic.Usage
		batch bool
		want  Nanos
	}{
		// Sonnet 4.5: $3 in = 3,000 n$/tok, $15 out = 15,000.
		// 271×3,000 = 813,000; 80×15,000 = 1,200,000; sum 2,013,000.
		{"judge item", "claude-sonnet-4-5-20250929",
			anthropic.Usage{InputTokens: 271, OutputTokens: 80}, false, 2_013_000},
		// 100×3,000 = 300,000; 5 m 1,000×3,750 = 3,750,000; 1 h 2,000×6,000 =
		// 12,000,000; read 5,000×300 = 1,500,000; out 200×15,000 = 3,000,000.
		// Sum 20,550,000.
		{"cache split 5m/1h", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 100, CacheCreationInputTokens: 3000, CacheCreation: split(1000, 2000),
				CacheReadInputTokens: 5000, OutputTokens: 200}, false, 20_550_000},
		// No split object: all 3,000 at 5 m: 3,000×3,750 = 11,250,000;
		// 100×3,000 = 300,000. Sum 11,550,000.
		{"cache creation without split is 5m", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 100, CacheCreationInputTokens: 3000}, false, 11_550_000},
		// Split explains 2,000 of 3,000: the other 1,000 go to 5 m.
		// 5 m 2,000×3,750 = 7,500,000; 1 h 1,000×6,000 = 6,000,000. Sum 13,500,000.
		{"short split bills the rest at 5m", "claude-sonnet-4-5",
			anthropic.Usage{CacheCreationInputTokens: 3000, CacheCreation: split(1000, 1000)}, false, 13_500_000},
		// Total input 150,000 + 60,000 = 210,000 > 200,000: long-context rates
		// $6 in = 6,000, read 0.1×6 = 600, $22.50 out = 22,500.
		// 150,000×6,000 = 900,000,000; 60,000×600 = 36,000,000;
		// 1,000×22,500 = 22,500,000. Sum 958,500,000.
		{"long context over 200k", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 150_000, CacheReadInputTokens: 60_000, OutputTokens: 1000}, false, 958_500_000},
		// Exactly 200,000 is not over: 200,000×3,000 = 600,000,000;
		// 1,000×15,000 = 15,000,000. Sum 615,000,000.
		{"long context boundary 200k", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 200_000, OutputTokens: 1000}, false, 615_000_000},
		// 200,001×6,000 = 1,200,006,000; 1,000×22,500 = 22,500,000.
		// Sum 1,222,506,000.
		{"long context 200001", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 200_001, OutputTokens: 1000}, false, 1_222_506_000},
		// Cache creation counts toward the threshold: 100,000 + 100,001 write
		// (5 m long = 7,500) = 200,001. 100,000×6,000 = 600,000,000;
		// 100,001×7,500 = 750,007,500. Sum 1,350,007,500.
		{"cache write counts toward 200k", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 100_000, CacheCreationInputTokens: 100_001}, false, 1_350_007_500},
		// Sonnet 4.6 has no long-context rule: 300,000×3,000 = 900,000,000.
		{"sonnet 4.6 no long context", "claude-sonnet-4-6",
			anthropic.Usage{InputTokens: 300_000}, false, 900_000_000},
		// Haiku 4.5 batch: $0.50 in = 500, $2.50 out = 2,500.
		// 1,000×500 = 500,000; 500×2,500 = 1,250,000. Sum 1,750,000.
		{"batch haiku", "claude-haiku-4-5-20251001",
			anthropic.Usage{InputTokens: 1000, OutputTokens: 500}, true, 1_750_000},
		// Haiku batch cache read $0.05 = 50: 10,000×50 = 500,000;
		// 1 h write batch $1 = 1,000: 10×1,000 = 10,000. Sum 510,000.
		{"batch cache", "claude-haiku-4-5",
			anthropic.Usage{CacheReadInputTokens: 10_000, CacheCreationInputTokens: 10, CacheCreation: split(0, 10)}, true, 510_000},
		// Batch and long context stack: $3 in, $11.25 out.
		// 250,000×3,000 = 750,000,000; 2,000×11,250 = 22,500,000. Sum 772,500,000.
		{"batch long context", "claude-sonnet-4-5",
			anthropic.Usage{InputTokens: 250_000, OutputTokens: 2000}, true, 772_500_000},
		// Opus 4.8: 1,000×5,000 + 1,000×25,000 = 30,000,000.
		{"opus 4.8", "claude-opus-4-8",
			anthropic.Usage{InputTokens: 1000, OutputTokens: 1000}, false, 30_000_000},
		// Opus 4.5 dated alias, batch: 2,000×2,500 + 100×12,500 = 6,250,000.
		{"opus 4.5 dated batch", "claude-opus-4-5-20251101",
			anthropic.Usage{InputTokens: 2000, OutputTokens: 100}, true, 6_250_000},
		// Sonnet 5: $2 in, $10 out, read $0.20: 1,000×2,000 + 1,000×200 +
		// 10×10,000 = 2,300,000.
		{"sonnet 5", "claude-sonnet-5",
			anthropic.Usage{InputTokens: 1000, CacheReadInputTokens: 1000, OutputTokens: 10}, false, 2_300_000},
		// Opus 5 5 m write $6.25 = 6,250: 100×6,250 = 625,000.
		{"opus 5 write", "claude-opus-5",
			anthropic.Usage{CacheCreationInputTokens: 100}, false, 625_000},
		// An unlisted dated snapshot is billed as its base model:
		// 1,000×3,000 = 3,000,000.
		{"date suffix fallback", "claude-sonnet-4-6-20260115",
			anthropic.Usage{InputTokens: 1000}, false, 3_000_000},
		{"zero usage", "claude-sonnet-4-5", anthropic.Usage{}, false, 0},
	}
	tab := Default()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tab.Cost(tc.model, tc.u, tc.batch)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Cost = %d (%v), want %d (%v)", got, got, tc.want, tc.want)
			}
		})
	}
}

func TestCostErrors(t *testing.T) {
	t.Parallel()
	tab := Default()
	for _, m := range []string{"claude-fable-5", "gpt-4o", "", "claude-sonnet-4-5-2025"} {
		_, err := tab.Cost(m, anthropic.Usage{InputTokens: 1}, false)
		if !errors.Is(err, ErrNoPrice) {
			t.Errorf("Cost(%q) err = %v, want ErrNoPrice", m, err)
		} else if !strings.Contains(err.Error(), `"`+m+`"`) {
			t.Errorf("error %q does not name the model", err)
		}
		if _, err := tab.WorstCase(Bound{Model: m, Input: 1, MaxTokens: 1}); !errors.Is(err, ErrNoPrice) {
			t.Errorf("WorstCase(%q) err = %v, want ErrNoPrice", m, err)
		}
	}
	bad := []anthropic.Usage{
		{InputTokens: -1},
		{OutputTokens: math.MaxInt64},
		{CacheCreationInputTokens: 5, CacheCreation: &anthropic.CacheCreation{Ephemeral1hInputTokens: -5}},
	}
	for _, u := range bad {
		if _, err := tab.Cost("claude-sonnet-4-5", u, false); !errors.Is(err, ErrBadUsage) {
			t.Errorf("Cost(%+v) err = %v, want ErrBadUsage", u, err)
		}
	}
}

func TestWorstCase(t *testing.T) {
	t.Parallel()
	tab := Default()
	// 280×3,000 = 840,000; 256×15,000 = 3,840,000. Sum 4,680,000.
	got, err := tab.WorstCase(Bound{Model: "claude-sonnet-4-5-20250929", Input: 280, MaxTokens: 256})
	if err != nil || got != 4_680_000 {
		t.Errorf("WorstCase judge = %d, %v; want 4680000", got, err)
	}
	// Over 200k: 300,000×6,000 + 4,096×22,500 = 1,800,000,000 + 92,160,000.
	got, err = tab.WorstCase(Bound{Model: "claude-sonnet-4-5", Input: 300_000, MaxTokens: 4096})
	if err != nil || got != 1_892_160_000 {
		t.Errorf("WorstCase long = %d, %v; want 1892160000", got, err)
	}
}

func TestDefaultTable(t *testing.T) {
	t.Parallel()
	tab := Default()
	want := []string{
		"claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "claude-sonnet-4-6",
		"claude-haiku-4-5", "claude-haiku-4-5-20251001",
		"claude-opus-4-5", "claude-opus-4-5-20251101", "claude-opus-4-6", "claude-opus-4-7", "claude-opus-4-8",
		"claude-sonnet-5", "claude-opus-5",
	}
	for _, m := range want {
		p, err := tab.Lookup(m)
		if err != nil {
			t.Errorf("Lookup(%q): %v", m, err)
			continue
		}
		// Every batch rate is half the standard one.
		if p.Batch.Input*2 != p.Standard.Input || p.Batch.Output*2 != p.Standard.Output ||
			p.Batch.CacheRead*2 != p.Standard.CacheRead || p.Batch.CacheWrite5m*2 != p.Standard.CacheWrite5m ||
			p.Batch.CacheWrite1h*2 != p.Standard.CacheWrite1h {
			t.Errorf("%s: batch %+v is not half of %+v", m, p.Batch, p.Standard)
		}
		// The standard cache multipliers hold.
		s := p.Standard
		if s.CacheWrite5m*4 != s.Input*5 || s.CacheWrite1h != s.Input*2 || s.CacheRead*10 != s.Input {
			t.Errorf("%s: cache prices %+v break the 1.25/2/0.1 multipliers", m, s)
		}
	}
	if _, err := tab.Lookup("claude-fable-5"); !errors.Is(err, ErrNoPrice) {
		t.Errorf("fable-5 must not be priced by default: %v", err)
	}
	if n := len(tab.Models()); n != 9 {
		t.Errorf("Models() has %d entries, want 9", n)
	}
	p, _ := tab.Lookup("claude-sonnet-4-5")
	if lc := p.LongContext; lc == nil || lc.Threshold != 200_000 || lc.Standard.Input != 6000 ||
		lc.Standard.Output != 22_500 || lc.Standard.CacheRead != 600 || lc.Standard.CacheWrite5m != 7500 ||
		lc.Standard.CacheWrite1h != 12_000 || lc.Batch.Output != 11_250 {
		t.Errorf("sonnet 4.5 long context = %+v", p.LongContext)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "prices.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadOverride(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
# A price for a model the embedded table leaves out; cache prices derived.
[models."claude-fable-5"]
input = 4
output = "20"

# Overriding a model by its dated alias replaces all its names.
[models."claude-sonnet-4-5-20250929"]
input = 4
output = 16
cache_read = 0.5
batch_multiplier = 0.25
`)
	tab, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// fable: 4 → 4,000; 5 m = 5,000; 1 h = 8,000; read 400; 20 → 20,000.
	// 10×4,000 + 10×5,000 + 10×400 + 10×20,000 = 294,000.
	got, err := tab.Cost("claude-fable-5", anthropic.Usage{InputTokens: 10, CacheCreationInputTokens: 10,
		CacheReadInputTokens: 10, OutputTokens: 10}, false)
	if err != nil || got != 294_000 {
		t.Errorf("fable cost = %d, %v; want 294000", got, err)
	}
	// Both names of Sonnet 4.5 now cost the override, and the long-context
	// rule went with the replaced entry: 300,000×4,000 = 1,200,000,000.
	for _, m := range []string{"claude-sonnet-4-5", "claude-sonnet-4-5-20250929"} {
		got, err := tab.Cost(m, anthropic.Usage{InputTokens: 300_000}, false)
		if err != nil || got != 1_200_000_000 {
			t.Errorf("%s cost = %d, %v; want 1200000000", m, got, err)
		}
	}
	// Batch ×0.25: 1,000 read 500×0.25 = 125 → 125,000; 100 out 16,000×0.25 = 4,000 → 400,000.
	got, err = tab.Cost("claude-sonnet-4-5", anthropic.Usage{CacheReadInputTokens: 1000, OutputTokens: 100}, true)
	if err != nil || got != 525_000 {
		t.Errorf("override batch = %d, %v; want 525000", got, err)
	}
	// Other models keep the embedded prices; the default table is untouched.
	if got, _ := tab.Cost("claude-haiku-4-5", anthropic.Usage{InputTokens: 1}, false); got != 1000 {
		t.Errorf("haiku = %d, want 1000", got)
	}
	if got, _ := Default().Cost("claude-sonnet-4-5", anthropic.Usage{InputTokens: 1}, false); got != 3000 {
		t.Errorf("default sonnet = %d, want 3000", got)
	}
	if n := len(tab.Models()); n != 10 {
		t.Errorf("Models() = %d entries, want 10", n)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body string
		want       []string // substrings of the error
	}{
		{"too many decimals", "[models.\"m\"]\ninput = 3\noutput = 15.0001\n",
			[]string{"line 3", "output", "at most 3 decimals"}},
		{"negative", "[models.\"m\"]\ninput = -1\noutput = 1\n", []string{"line 2", "negative"}},
		{"not a number", "[models.\"m\"]\ninput = \"three\"\noutput = 1\n", []string{"line 2", "not a decimal"}},
		{"unknown key", "[models.\"m\"]\ninput = 1\noutput = 1\ninptu = 2\n", []string{"unknown key", "inptu"}},
		{"missing output", "[models.\"m\"]\ninput = 1\n", []string{`models."m"`, "output price is required"}},
		{"syntax", "[models.\"m\"\ninput = 1\n", []string{"line 2", "table name"}},
		{"derived cache not whole", "[models.\"m\"]\ninput = 0.001\noutput = 1\n",
			[]string{`models."m"`, "cache_write_5m not given"}},
		{"batch not whole", "[models.\"m\"]\ninput = 1\noutput = 1\nbatch_multiplier = 0.333\n",
			[]string{`models."m"`, "batch_multiplier", "not a whole number"}},
		{"bad multiplier", "[models.\"m\"]\ninput = 1\noutput = 1\nbatch_multiplier = 2\n",
			[]string{"line 4", "multiplier"}},
		{"long context without threshold", "[models.\"m\"]\ninput = 1\noutput = 1\n[models.\"m\".long_context]\ninput = 2\noutput = 2\n",
			[]string{`models."m".long_context`, "threshold"}},
		{"duplicate alias", "[models.\"a\"]\ninput = 1\noutput = 1\n[models.\"b\"]\naliases = [\"a\"]\ninput = 1\noutput = 1\n",
			[]string{`"a" is already used`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.body)
			_, err := Load(path)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestNanosString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		n    Nanos
		want string
	}{
		{0, "$0.000000"},
		{2_130_000, "$0.002130"},
		{2_130_500, "$0.0021305"},
		{1, "$0.000000001"},
		{12_500_000_000, "$12.500000"},
		{-1_500_000_000, "-$1.500000"},
		{math.MinInt64, "-$9223372036.854775808"},
	}
	for _, tc := range tests {
		if got := tc.n.String(); got != tc.want {
			t.Errorf("Nanos(%d).String() = %q, want %q", int64(tc.n), got, tc.want)
		}
	}
	if got := Nanos(2_130_000).USD(); got != 0.00213 {
		t.Errorf("USD() = %v", got)
	}
}

func TestParseUSD(t *testing.T) {
	t.Parallel()
	good := map[string]Nanos{
		"12.50": 12_500_000_000, "$0.002130": 2_130_000, "600": 600 * NanosPerUSD,
		"0.000000001": 1, "-1.5": -1_500_000_000, " 7 ": 7 * NanosPerUSD, ".5": 500_000_000,
	}
	for s, want := range good {
		if got, err := ParseUSD(s); err != nil || got != want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1e3", "0.0000000001", "abc", "1.", "$", "99999999999999"} {
		if _, err := ParseUSD(s); err == nil {
			t.Errorf("ParseUSD(%q) succeeded", s)
		}
	}
}

func ExampleTable_Cost() {
	u := anthropic.Usage{InputTokens: 271, OutputTokens: 80}
	c, _ := Default().Cost("claude-sonnet-4-5-20250929", u, false)
	fmt.Println(c, c.USD())
	// Output: $0.002013 0.002013
}

// inference_geo "us" is ×1.1 on every category (docs/design.md §20).
func TestCostUSGeo(t *testing.T) {
	u := anthropic.Usage{InputTokens: 1000, OutputTokens: 200, CacheReadInputTokens: 3000, CacheCreationInputTokens: 500}
	base, err := Default().Cost("claude-opus-4-6", u, false)
	if err != nil {
		t.Fatal(err)
	}
	u.InferenceGeo = "us"
	us, err := Default().Cost("claude-opus-4-6", u, false)
	if err != nil {
		t.Fatal(err)
	}
	if us*10 != base*11 {
		t.Errorf("us %d, global %d: want exactly ×1.1", us, base)
	}
	if got := usGeo(7); got != 8 {
		t.Errorf("usGeo(7) = %d, want 8 (7.7 rounded)", got)
	}
}
