package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeRunDir writes a minimal run directory: a summary and three samples.
func writeRunDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	summary := `{"n":30,"succeeded":30,"errored":0,"unfinished":0,"wall_s":3,"requests_per_min":600,` +
		`"cost_usd":{"total":0.06,"by_org":{"a":0.06}},"data_loss":{"passed":true},"latency_ms":{"p50":900,"p95":1500,"p99":1900}}`
	var events strings.Builder
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(&events, `{"ts":"2026-07-01T00:00:%02dZ","kind":"sample","note":"","data":{"t_s":%d,"dt_s":1,`+
			`"completed_by_org":{"a":10},"lanes":[{"org":"a","pool":"sonnet","cap":20,"limit":10,"in_flight":10}],`+
			`"rate_limited_429":0,"retries":0,"cost_usd":%g,"in_flight":10}}`+"\n", i, i, 0.02*float64(i))
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), []byte(summary), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "events.jsonl"), []byte(events.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReportWritesIntoRunDir(t *testing.T) {
	t.Parallel()
	dir := writeRunDir(t)
	var out, errb bytes.Buffer
	if code := mainCode([]string{"report", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := filepath.Join(dir, "report.html")
	if strings.TrimSpace(out.String()) != want {
		t.Errorf("stdout %q, want the path %q", out.String(), want)
	}
	b, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"<svg", `<path class="series"`, "$0.06", "passed", "900 ms"} {
		if !bytes.Contains(b, []byte(s)) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func TestReportOutFlag(t *testing.T) {
	t.Parallel()
	dir := writeRunDir(t)
	out := filepath.Join(t.TempDir(), "page.html")
	for _, args := range [][]string{{"report", dir, "--out", out}, {"report", "--out", out, dir}} {
		var stdout, errb bytes.Buffer
		if code := mainCode(args, &stdout, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if strings.TrimSpace(stdout.String()) != out {
			t.Errorf("%v: stdout %q", args, stdout.String())
		}
		if _, err := os.Stat(out); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); err == nil {
		t.Errorf("--out also wrote RUN_DIR/report.html")
	}
}

func TestReportUsageErrors(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"no dir":      {"report"},
		"two dirs":    {"report", t.TempDir(), t.TempDir()},
		"not a run":   {"report", t.TempDir()},
		"bad flag":    {"report", "--nope", t.TempDir()},
		"missing dir": {"report", filepath.Join(t.TempDir(), "missing")},
	} {
		var out, errb bytes.Buffer
		if code := mainCode(args, &out, &errb); code != exitUsage {
			t.Errorf("%s: exit %d, want %d", name, code, exitUsage)
		}
		if out.Len() != 0 || errb.Len() == 0 {
			t.Errorf("%s: stdout %q stderr %q", name, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := mainCode([]string{"report", "--help"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "usage: apidispatch report RUN_DIR") {
		t.Errorf("--help: exit %d, stdout %q", code, out.String())
	}
}
