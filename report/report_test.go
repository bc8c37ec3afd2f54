package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/rundir"
)

func TestDownsampleKeepsEndsAndPeaks(t *testing.T) {
	t.Parallel()
	pts := make([]point, 10_000)
	for i := range pts {
		pts[i] = point{float64(i), math.Sin(float64(i) / 300)}
	}
	pts[4321].Y = 50 // a spike a plain average would hide
	for _, n := range []int{3, 10, 500, MaxPoints} {
		got := downsample(pts, n)
		if len(got) != n {
			t.Errorf("n=%d: %d points", n, len(got))
		}
		if got[0] != pts[0] || got[len(got)-1] != pts[len(pts)-1] {
			t.Errorf("n=%d: ends not kept: %v … %v", n, got[0], got[len(got)-1])
		}
		for i := 1; i < len(got); i++ {
			if got[i].X <= got[i-1].X {
				t.Fatalf("n=%d: x not increasing at %d", n, i)
			}
		}
		if n >= 10 && !containsPoint(got, pts[4321]) {
			t.Errorf("n=%d: the spike was dropped", n)
		}
	}
	short := pts[:5]
	if got := downsample(short, 10); len(got) != 5 || &got[0] == &short[0] {
		t.Errorf("a short series must come back whole, as a copy")
	}
	if got := downsample(pts, 2); len(got) != 2 {
		t.Errorf("n=2: %d points", len(got))
	}
	if got := downsample(nil, 10); len(got) != 0 {
		t.Errorf("nil: %v", got)
	}
}

func containsPoint(pts []point, p point) bool {
	for _, q := range pts {
		if q == p {
			return true
		}
	}
	return false
}

func TestPathD(t *testing.T) {
	t.Parallel()
	id := func(v float64) float64 { return v }
	if got := pathD([]point{{0, 0}, {1.26, 2}, {3, 4.04}}, id, id); got != "M0.0,0.0L1.3,2.0L3.0,4.0" {
		t.Errorf("pathD = %q", got)
	}
	if got := pathD([]point{{0, 0}, {1, math.NaN()}, {2, 2}, {3, 3}}, id, id); got != "M0.0,0.0M2.0,2.0L3.0,3.0" {
		t.Errorf("a NaN must lift the pen: %q", got)
	}
	if got := pathD(nil, id, id); got != "" {
		t.Errorf("empty: %q", got)
	}
	if got := areaD([]point{{1, 1}, {2, 2}}, id, id, 10); got != "M1.0,1.0L2.0,2.0L2.0,10.0L1.0,10.0Z" {
		t.Errorf("areaD = %q", got)
	}
}

func TestRateSeriesPoolsHonestly(t *testing.T) {
	t.Parallel()
	var rows []sampleRow
	for i := 1; i <= 10; i++ {
		rows = append(rows, sampleRow{T: float64(i), Dt: 1, Done: []float64{float64(i), 1}})
	}
	all := rateSeries(rows, -1, 100)
	if len(all) != 10 || all[0] != (point{0.5, 2}) || all[9] != (point{9.5, 11}) {
		t.Errorf("unpooled: %v", all)
	}
	pooled := rateSeries(rows, 0, 5) // pairs: (1+2)/2, (3+4)/2, …
	want := []point{{1, 1.5}, {3, 3.5}, {5, 5.5}, {7, 7.5}, {9, 9.5}}
	if fmt.Sprint(pooled) != fmt.Sprint(want) {
		t.Errorf("pooled = %v, want %v", pooled, want)
	}
	if got := rateSeries(rows, 7, 100); len(got) != 10 || got[3].Y != 0 {
		t.Errorf("an org never seen has rate 0: %v", got)
	}
	if rateSeries(nil, -1, 10) != nil {
		t.Errorf("no rows: want nil")
	}
	// A zero-length interval is skipped, not divided by.
	if got := rateSeries([]sampleRow{{T: 0, Dt: 0, Done: []float64{5}}}, -1, 10); len(got) != 0 {
		t.Errorf("dt 0: %v", got)
	}
}

func TestRetryBins(t *testing.T) {
	t.Parallel()
	var rows []sampleRow
	var c429, cr float64
	for i := 1; i <= 100; i++ {
		if i >= 40 && i < 45 {
			c429 += 10
		}
		if i%10 == 0 {
			cr++
		}
		rows = append(rows, sampleRow{T: float64(i), Dt: 1, R429: c429, Retries: cr})
	}
	bins, width := retryBins(rows, 20)
	if width != 5 || len(bins) != 20 {
		t.Fatalf("width %v, %d bins", width, len(bins))
	}
	var a, b float64
	for _, x := range bins {
		a += x.A
		b += x.B
	}
	if a != 50 || b != 10 {
		t.Errorf("bins hold %v 429s and %v retries, want 50 and 10", a, b)
	}
	// Sample i covers (i-1, i]: the samples at 40…44 sit at 39.5…43.5.
	if bins[7].A != 10 || bins[8].A != 40 {
		t.Errorf("the storm lands in the wrong bars: %+v %+v", bins[7], bins[8])
	}
	if bins, _ := retryBins(nil, 10); bins != nil {
		t.Errorf("no rows: %v", bins)
	}
}

func TestNiceTicksAndFormats(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		max  float64
		top  float64
		nTck int
	}{{400, 400, 5}, {355, 400, 5}, {0, 1, 5}, {math.NaN(), 1, 5}, {12.78, 15, 4}, {0.0042, 0.006, 4}, {1, 1, 5}} {
		ticks, top := niceTicks(c.max, 4)
		if math.Abs(top-c.top) > 1e-12 || len(ticks) != c.nTck {
			t.Errorf("niceTicks(%v) = %v, %v; want top %v, %d ticks", c.max, ticks, top, c.top, c.nTck)
		}
	}
	for _, c := range []struct {
		s, step float64
		want    string
	}{{0, 30, "0s"}, {30, 30, "30s"}, {90, 30, "1m30s"}, {120, 60, "2m"}, {3900, 300, "1h05m"}, {7200, 3600, "2h00m"}, {2.5, 0.5, "2.5s"}} {
		if got := fmtClock(c.s, c.step); got != c.want {
			t.Errorf("fmtClock(%v, %v) = %q, want %q", c.s, c.step, got, c.want)
		}
	}
	for v, want := range map[float64]string{0: "$0.00", 12.78: "$12.78", 1234.996: "$1,235.00", 0.00213: "$0.0021", -3: "-$3.00"} {
		if got := fmtUSD(v); got != want {
			t.Errorf("fmtUSD(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{0: "0", 999: "999", 141600: "141,600", 1234567: "1,234,567", -1500: "-1,500"} {
		if got := fmtInt(v); got != want {
			t.Errorf("fmtInt(%v) = %q, want %q", v, got, want)
		}
	}
	if got := fmtDuration(491.6); got != "8m 12s" {
		t.Errorf("fmtDuration = %q", got)
	}
}

// plots returns the <svg class="plot"> elements of a page and, for each,
// the point counts of its series.
func plots(t *testing.T, page string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	svgRE := regexp.MustCompile(`(?s)<svg class="plot"[^>]*aria-label="([^"]*)".*?</svg>`)
	ptsRE := regexp.MustCompile(`<path class="series" d="([^"]*)"[^>]*data-points="(\d+)"`)
	for _, m := range svgRE.FindAllStringSubmatch(page, -1) {
		var counts []int
		for _, p := range ptsRE.FindAllStringSubmatch(m[0], -1) {
			n, _ := strconv.Atoi(p[2])
			if got := strings.Count(p[1], ","); got != n && !strings.HasSuffix(p[1], "Z") {
				t.Errorf("plot %q: a series says %d points but draws %d", m[1], n, got)
			}
			counts = append(counts, n)
		}
		out[m[1]] = append(out[m[1]], counts...)
	}
	return out
}

func readPage(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteABDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, disp := abFixture(t, dir, 6000, 12)
	harness := `{"ts":"2026-07-01T12:00:00Z","kind":"progress","note":"storm self-test passed"}` + "\n" +
		`{"ts":"2026-07-01T12:09:30Z","kind":"completed","note":"speed-up 6.0x; rotate keys b94495b5, 3fa9c2d1"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "events.jsonl"), []byte(harness), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	ps := plots(t, page)
	for _, title := range []string{
		"Completions per second, both arms", "Completions per second — Baseline (legacy)", "Completions per second — Dispatcher",
		"Cumulative cost from usage", "high_prio · sonnet", "low_prio · sonnet", "batch · sonnet",
	} {
		counts, ok := ps[title]
		if !ok {
			t.Errorf("no plot %q (plots: %v)", title, keys(ps))
			continue
		}
		if len(counts) == 0 || counts[0] < 2 {
			t.Errorf("plot %q has series of %v points", title, counts)
		}
	}
	if c := ps["Completions per second, both arms"]; len(c) != 4 { // two areas, two lines
		t.Errorf("both-arms plot has %d paths, want 4", len(c))
	}
	if c := ps["Completions per second — Dispatcher"]; len(c) != 4 { // all orgs + 3 orgs
		t.Errorf("dispatcher by-org plot has %d series, want 4", len(c))
	}
	if !strings.Contains(page, `<rect class="bar"`) {
		t.Errorf("no retry bars")
	}
	speedup := base.WallS / disp.WallS
	met := "target ≥ 5× met"
	if speedup < 5 {
		met = "target ≥ 5× NOT met"
	}
	for _, want := range []string{
		"Simulation at speed factor K = 12", fmtFactor(speedup) + "×", met,
		"Baseline (legacy)", "Dispatcher", "6,000", fmtUSD(base.Cost.Total), "✓ equal",
		fmtDuration(base.WallS), fmtDuration(disp.WallS), fmtDuration(base.WallS * 12),
		"429 responses", ">" + fmtInt(float64(disp.RateLimited429)) + "<", "passed", "API-eq.",
		"1,800 ms / 3,600 ms / 5,200 ms", "claude-sonnet-4-5-20250929", "N = 6,000", "b94495b5",
		"projected " + fmtUSD(2*0.00213*6000), "A/B harness (UTC)", "12:09:30", "rotate keys b94495b5",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"NaN", "Inf", "<script", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("page contains %q", bad)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestWriteRunDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sum := writeSynth(t, dir, synth{
		orgs: []string{"batch", "high_prio", "low_prio"}, cap: 100, n: 20_000, latency: 2, speed: 1,
		storm: [2]float64{40, 44}, stormOrg: "batch", colleague: [2]float64{10, 30}, retryRate: 0.2, costPer: 0.002, seed: 3, laneStop: true,
	})
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	ps := plots(t, page)
	if c := ps["Completions per second"]; len(c) != 4 || c[0] < 2 {
		t.Errorf("throughput plot series: %v", c)
	}
	if c := ps["Cumulative cost from usage"]; len(c) == 0 || c[len(c)-1] < 2 {
		t.Errorf("cost plot series: %v", c)
	}
	for _, want := range []string{
		"Run report", "Run against a local server", fmtInt(float64(sum.Succeeded)), fmtUSD(sum.Cost.Total),
		"This run", "stopped: 401 authentication_error", "held", "colleagues seen", `class="rule"`,
		`<rect class="bar"`, "Noteworthy events",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"API-eq.", "Speed-up", "NaN"} {
		if strings.Contains(page, bad) {
			t.Errorf("a real-speed single run shows %q", bad)
		}
	}
}

func TestEmptyRunsRenderWithNotes(t *testing.T) {
	t.Parallel()
	for name, files := range map[string]map[string]string{
		"summary only":       {"summary.json": `{}`},
		"events only, empty": {"events.jsonl": ``},
		"one sample":         {"summary.json": `{"wall_s":0,"succeeded":0}`, "events.jsonl": `{"ts":"2026-07-01T00:00:00Z","kind":"sample","data":{"t_s":0,"dt_s":0}}` + "\n"},
		"garbage":            {"summary.json": `{"wall_s":"soon","cost_usd":[1],"lanes":7}`, "events.jsonl": "not json\n{\"kind\":\"sample\",\"data\":{\"t_s\":\"x\"}}\n"},
		"ab, nothing else":   {"ab.json": `{}`},
		"ab, zero walls":     {"ab.json": `{"speedup":null,"arms":{"baseline":{"wall_s":0},"dispatcher":{"wall_s":0}}}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for f, body := range files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := Write(dir); err != nil {
				t.Fatal(err)
			}
			page := readPage(t, dir)
			if !strings.Contains(page, `class="empty"`) {
				t.Errorf("no 'no data' note on an empty run")
			}
			for _, bad := range []string{"NaN", "Inf", "%!"} {
				if strings.Contains(page, bad) {
					t.Errorf("page contains %q", bad)
				}
			}
		})
	}
}

func TestLooseABDecoding(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Numbers as strings, an unknown field, a per-arm projection by arm,
	// by_org as bare counts, a failed data-loss check, and arm directories
	// whose summary.json is missing (baseline) or says more (dispatcher).
	writeJSON(t, filepath.Join(dir, "ab.json"), map[string]any{
		"speedup": "5.5", "target_met": true, "simulated": false, "future_field": map[string]any{"x": 1},
		"projected_cost_usd": map[string]any{"per_arm": map[string]any{"baseline": 3.5, "dispatcher": 3.25}, "total": 6.75},
		"arms": map[string]any{
			"baseline":   map[string]any{"wall_s": 110, "cost_usd": 3.4, "by_org": map[string]any{"high_prio": 1000}, "latency_ms": "fast"},
			"dispatcher": map[string]any{"wall_s": 20, "cost_usd": "3.3", "data_loss": map[string]any{"passed": false, "missing": 2}},
		},
	})
	os.MkdirAll(filepath.Join(dir, "baseline"), 0o755)
	os.MkdirAll(filepath.Join(dir, "dispatcher"), 0o755)
	writeJSON(t, filepath.Join(dir, "dispatcher", "summary.json"), rundir.Summary{Succeeded: 998, Errored: 2, RateLimited429: 7, WallS: 21})
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	for _, want := range []string{
		"5.50×", "Live run against the Anthropic API", "$3.40", "$3.30", "$3.50", "$3.25", "projected $6.75, actual $6.70",
		"FAILED: 2 missing", "1,000 (completed)", "998", ">7<", "20.0 s", "Baseline (legacy): no events.jsonl",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestSpeedupComputedWhenMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "ab.json"), map[string]any{
		"arms": map[string]any{"baseline": map[string]any{"wall_s": 300}, "dispatcher": map[string]any{"wall_s": 100}},
	})
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	if !strings.Contains(page, "3×") || !strings.Contains(page, "NOT met") || !strings.Contains(page, "computed") {
		t.Errorf("speed-up not computed from the walls")
	}
}

func TestResumedRunContinuesTheAxis(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	t0 := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	ev := func(at time.Duration, kind string, data any) {
		line, _ := json.Marshal(map[string]any{"ts": t0.Add(at), "kind": kind, "note": "", "data": data})
		b.Write(append(line, '\n'))
	}
	ev(0, "started", map[string]any{"speed": 1})
	for i := 1; i <= 10; i++ {
		ev(time.Duration(i)*time.Second, "sample", map[string]any{"t_s": i, "dt_s": 1, "completed_by_org": map[string]int{"a": 5}, "cost_usd": 0.1 * float64(i), "rate_limited_429": i})
	}
	ev(11*time.Second, "incomplete", nil)
	ev(time.Hour, "started", nil)
	for i := 1; i <= 5; i++ {
		ev(time.Hour+time.Duration(i)*time.Second, "sample", map[string]any{"t_s": i, "dt_s": 1, "completed_by_org": map[string]int{"a": 5}, "cost_usd": 0.1 * float64(i), "rate_limited_429": i})
	}
	tl := &timeline{orgIdx: map[string]int{}, laneIdx: map[string]*laneTrack{}}
	if err := tl.read(&b); err != nil {
		t.Fatal(err)
	}
	if len(tl.Rows) != 15 || tl.Duration() != 15 {
		t.Fatalf("%d rows over %v s, want 15 over 15", len(tl.Rows), tl.Duration())
	}
	if len(tl.Resumes) != 1 || tl.Resumes[0] != 10 {
		t.Errorf("resumes %v, want [10]", tl.Resumes)
	}
	last := tl.Rows[14]
	if math.Abs(last.Cost-1.5) > 1e-9 || last.R429 != 15 {
		t.Errorf("counters did not continue across the resume: cost %v, 429s %v", last.Cost, last.R429)
	}
	if len(tl.Marks) != 1 || tl.Marks[0].Kind != "incomplete" || tl.Marks[0].T != 11 {
		t.Errorf("marks %+v", tl.Marks)
	}
}

func TestNoKeyTextAndEscaping(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeSynth(t, dir, synth{orgs: []string{"<b>evil</b>"}, cap: 10, n: 100, latency: 1, speed: 1, costPer: 0.001, seed: 4})
	f, err := os.OpenFile(filepath.Join(dir, "events.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, `{"ts":"2026-07-01T12:00:05Z","kind":"warning","note":"oops sk-ant-api03-AbCdEf_123-xyz leaked <script>alert(1)</script>"}`)
	f.Close()
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	for _, bad := range []string{"sk-ant-api03", "AbCdEf_123", "<script>", "<b>evil"} {
		if strings.Contains(page, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	for _, want := range []string{"[redacted]", "&lt;b&gt;evil&lt;/b&gt;"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestNotARunDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := Write(dir); !errors.Is(err, ErrNotRunDir) {
		t.Errorf("Write(empty dir) = %v, want ErrNotRunDir", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a report was written for an empty directory")
	}
	if err := Write(filepath.Join(dir, "missing")); !errors.Is(err, ErrNotRunDir) {
		t.Errorf("Write(missing) = %v, want ErrNotRunDir", err)
	}
}

func TestWriteFileElsewhere(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeSynth(t, dir, synth{orgs: []string{"a"}, cap: 10, n: 50, latency: 1, speed: 1, costPer: 0.001, seed: 5})
	out := filepath.Join(t.TempDir(), "r.html")
	got, err := WriteFile(dir, out)
	if err != nil || got != out {
		t.Fatalf("WriteFile = %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteFile with out also wrote dir/report.html")
	}
	ents, _ := os.ReadDir(filepath.Dir(out))
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
	var buf bytes.Buffer
	if err := Render(&buf, dir); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if !bytes.Equal(buf.Bytes(), b) {
		t.Errorf("Render and WriteFile differ: the page must not depend on when it is made")
	}
}

// TestLongRunIsDownsampled pins that a soak's hours of samples draw as at
// most MaxPoints points per series.
func TestLongRunIsDownsampled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeSynth(t, dir, synth{orgs: []string{"a", "b"}, cap: 100, n: 150_000, latency: 4, speed: 1,
		storm: [2]float64{3000, 3010}, stormOrg: "a", retryRate: 0.05, costPer: 0.002, seed: 6})
	start := time.Now()
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered in %v", time.Since(start))
	page := readPage(t, dir)
	for title, counts := range plots(t, page) {
		for _, n := range counts {
			if n > MaxPoints {
				t.Errorf("plot %q draws a series of %d points", title, n)
			}
		}
	}
	if len(page) > 1_500_000 {
		t.Errorf("the page is %d bytes", len(page))
	}
}

func BenchmarkWriteSoak(b *testing.B) {
	dir := b.TempDir()
	writeSynth(b, dir, synth{orgs: []string{"a", "b", "c"}, cap: 100, n: 1_000_000, latency: 6, speed: 1, costPer: 0.002, seed: 7})
	b.ReportAllocs()
	for b.Loop() {
		if err := Write(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzTimeline feeds arbitrary events.jsonl text to the reader and the
// page: neither may panic, and the page must not show NaN or Inf.
func FuzzTimeline(f *testing.F) {
	f.Add([]byte(`{"ts":"2026-07-01T00:00:01Z","kind":"sample","data":{"t_s":1,"dt_s":1,"completed_by_org":{"a":3},"lanes":[{"org":"a","pool":"sonnet","cap":10,"limit":2.5,"in_flight":2,"held":true}],"rate_limited_429":1,"retries":0,"cost_usd":0.1,"in_flight":2}}` + "\n"))
	f.Add([]byte(`{"kind":"started","ts":"x"}` + "\n" + `{"kind":"sample","data":{"t_s":-5,"dt_s":-1}}` + "\n" + `{"kind":"lane","note":"a stopped"}`))
	f.Add([]byte(`{"kind":"sample","data":{"t_s":1e308,"dt_s":1e-308,"completed_by_org":{"a":1e308}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tl := &timeline{orgIdx: map[string]int{}, laneIdx: map[string]*laneTrack{}}
		if err := tl.read(bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		src := &source{Name: "fuzz", Speed: 2, Arms: []*arm{{Name: "run", Label: "This run", Color: colorRun, TL: tl}}}
		var buf bytes.Buffer
		if err := render(&buf, src); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(buf.Bytes(), []byte("NaN")) || bytes.Contains(buf.Bytes(), []byte("Inf")) {
			t.Errorf("page shows NaN or Inf")
		}
	})
}

// TestABHarnessFields reads the fields 'apidispatch ab' writes beyond the
// design's minimum: arm directories by name (rounds), the target, the
// headline, the storm self-test, problems, setup time, API-equivalent
// rates and latencies, and the ledger match.
func TestABHarnessFields(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, disp := abFixture(t, filepath.Join(dir, "round2"), 3000, 4)
	arm := func(s rundir.Summary, name string) map[string]any {
		return map[string]any{
			"arm": name, "round": 2, "dir": filepath.Join("round2", name), "wall_s": s.WallS, "api_equivalent_wall_s": s.WallS * 4,
			"setup_s": 1.25, "cost_usd": s.Cost.Total, "ledger_cost_usd": s.Cost.Total + 1, "cost_matches_ledger": true,
			"requests_per_min": s.RequestsPerMin, "api_equivalent_requests_per_min": s.RequestsPerMin / 4,
			"succeeded": s.Succeeded, "latency_ms": s.LatencyMs, "api_equivalent_latency_ms": map[string]any{"p50": 7000, "p95": 9000, "p99": 12000},
			"data_loss": s.DataLoss, "resumed": name == "dispatcher",
		}
	}
	writeJSON(t, filepath.Join(dir, "ab.json"), map[string]any{
		"speedup": 5.9, "speedup_incl_setup": 5.7, "target_speedup": 6, "target_met": false, "simulated": true, "speed_factor": 4,
		"headline": "SIMULATION: dispatcher 5.9× faster", "complete": true, "problems": []string{"arm baseline: 3 errored"},
		"projected_cost_usd": map[string]any{"per_arm": 6.4, "total": 12.8, "arms": 2},
		"config":             map[string]any{"n": 3000, "model": "claude-sonnet-4-5-20250929", "sim_preset": "origin-3org", "baseline_org": "high_prio", "baseline_concurrency": 50, "orgs": []map[string]string{{"org": "high_prio", "key_fingerprint": "b94495b5"}, {"org": "batch"}, {"org": "low_prio"}}},
		"storm_self_test":    map[string]any{"passed": true, "n": 2000, "rate_limited_429": 812},
		"rounds": []map[string]any{
			{"round": 1, "order": "ab", "speedup": 6.1, "baseline": map[string]any{"wall_s": 61}, "dispatcher": map[string]any{"wall_s": 10}},
			{"round": 2, "order": "ba", "speedup": 5.7, "baseline": map[string]any{"wall_s": base.WallS}, "dispatcher": map[string]any{"wall_s": disp.WallS}},
		},
		"arms": map[string]any{"baseline": arm(base, "baseline"), "dispatcher": arm(disp, "dispatcher")},
	})
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	page := readPage(t, dir)
	for _, want := range []string{
		"5.90×", "target ≥ 6× NOT met", "SIMULATION: dispatcher 5.9× faster", "5.70×", "Storm self-test", "2,000 items, 812 429s",
		"Problem reported by ab: arm baseline: 3 errored", "Setup before the first request", "1.2 s", "Requests per minute, API-equivalent",
		"7,000 ms / 9,000 ms / 12,000 ms", "✓ equal", "resumed: the wall-clock covers only the rest", "preset origin-3org",
		"baseline: org high_prio alone at a fixed concurrency of 50", "dispatcher: 3 orgs (high_prio, batch, low_prio)",
		"<h2>Rounds</h2>", "6.10×",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if ps := plots(t, page); len(ps["Completions per second — Dispatcher"]) == 0 {
		t.Errorf("the arm directories named in ab.json were not read")
	}
	if strings.Contains(page, "no events.jsonl") {
		t.Errorf("an arm's events were looked for in the wrong place")
	}
}

// TestRouteTable: a run that used the batch route (or auto) has a "By
// route" table with each route's items, cost and sync-price figure; a plain
// sync run has none.
func TestRouteTable(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		summary string
		want    []string
		none    bool
	}{
		"auto": {summary: `{"wall_s":10,"succeeded":6000,"by_route":{"batch":{"items":1137,"succeeded":1137,"cost_usd":1.258101,"sync_price_usd":2.516202,"wall_s":9.6},"sync":{"items":4863,"succeeded":4863,"cost_usd":10.75545,"wall_s":8.1}}}`,
			want: []string{"By route", "1,137", "$1.26", "$2.52", "4,863", "$10.76"}},
		"sync only": {summary: `{"wall_s":10,"succeeded":5,"by_route":{"sync":{"items":5,"cost_usd":1}}}`, none: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "summary.json"), []byte(tc.summary), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := Write(dir); err != nil {
				t.Fatal(err)
			}
			page := readPage(t, dir)
			if tc.none {
				if strings.Contains(page, "By route") {
					t.Error("a sync-only run has a By route table")
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(page, w) {
					t.Errorf("page lacks %q", w)
				}
			}
		})
	}
}
