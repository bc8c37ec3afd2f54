package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
)

func readSummary(t *testing.T, dir string) rundir.Summary {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rundir.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	var s rundir.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The same input run twice into two run directories with one cache: the
// second run sends nothing and costs nothing; plan, run's summary and
// 'cache stats' agree on the figures.
func TestRunTwiceWithOneCache(t *testing.T) {
	t.Parallel()
	const n = 400
	r, input, runDir := simAndInput(t, 50, n)
	cachePath := filepath.Join(t.TempDir(), "cache.db")
	run := func(dir string) {
		t.Helper()
		c := cliCmd(r, "run", input, "--run-dir", dir, "--base-url", r.URL, "--speed", "50", "--quiet", "--cache", cachePath)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("run %s: %v\n%s", dir, err, out)
		}
	}
	run(runDir + "1")
	sent := r.Server.LedgerTotals().Requests
	first := readSummary(t, runDir+"1")

	code, out, errOut := runCLI("plan", input, "--json", "--cache", cachePath, "--base-url", r.URL)
	if code != exitOK {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	var p struct {
		N     int64 `json:"n"`
		Cache struct {
			Hits     int64   `json:"hits"`
			SavedUSD float64 `json:"saved_usd"`
		} `json:"cache"`
		Cost struct {
			Expected float64 `json:"expected"`
		} `json:"projected_cost_usd"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, out)
	}
	if p.N != 0 || p.Cache.Hits != n || p.Cost.Expected != 0 || p.Cache.SavedUSD != first.Cost.Total {
		t.Fatalf("plan of a cached input (first run cost $%v): %s", first.Cost.Total, out)
	}
	if c := first.Cache; c == nil || c.Hits != 0 || c.Misses != n || c.SavedUSD != 0 {
		t.Fatalf("first run's cache summary: %+v", c)
	}

	run(runDir + "2")
	if d := r.Server.LedgerTotals().Requests - sent; d != 0 {
		t.Fatalf("second run sent %d requests", d)
	}
	s := readSummary(t, runDir+"2")
	if s.Cost.TotalNanos != 0 || s.Cache == nil || s.Cache.Hits != n || s.Cache.Misses != 0 || s.Cache.InputDuplicates != 0 ||
		s.Cache.SavedUSD != first.Cost.Total || !s.DataLoss.Passed {
		t.Fatalf("second run's summary: cost %v, cache %+v, first cost %v", s.Cost, s.Cache, first.Cost.Total)
	}

	code, out, errOut = runCLI("cache", "stats", "--json", "--cache", cachePath)
	var st struct {
		Entries int64   `json:"entries"`
		CostUSD float64 `json:"cost_usd"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Entries != n || st.CostUSD != first.Cost.Total {
		t.Fatalf("cache stats (first run cost $%v): exit %d %s %s", first.Cost.Total, code, out, errOut)
	}
	exp := filepath.Join(t.TempDir(), "export.jsonl")
	if code, _, errOut := runCLI("cache", "export", "--cache", cachePath, "--out", exp); code != exitOK {
		t.Fatalf("cache export: %s", errOut)
	}
	if b, _ := os.ReadFile(exp); bytes.Count(b, []byte("\n")) != n {
		t.Fatalf("export has %d lines, want %d", bytes.Count(b, []byte("\n")), n)
	}
	if code, out, _ := runCLI("cache", "prune", "--cache", cachePath, "--older-than", "1h"); code != exitOK || !strings.Contains(out, "pruned 0 entries") {
		t.Fatalf("prune --older-than 1h: exit %d, %s", code, out)
	}
	if code, out, _ := runCLI("cache", "prune", "--cache", cachePath, "--older-than", "0s"); code != exitOK || !strings.Contains(out, "pruned 400 entries") {
		t.Fatalf("prune --older-than 0s: exit %d, %s", code, out)
	}
}

func TestRunRefusesABadCacheFile(t *testing.T) {
	t.Parallel()
	r, input, runDir := simAndInput(t, 50, 10)
	bad := filepath.Join(t.TempDir(), "cache.db")
	if err := os.WriteFile(bad, bytes.Repeat([]byte("not a database\n"), 20), 0o644); err != nil {
		t.Fatal(err)
	}
	c := cliCmd(r, "run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet", "--cache", bad)
	out, err := c.CombinedOutput()
	if c.ProcessState.ExitCode() != exitUsage || !strings.Contains(string(out), bad) {
		t.Fatalf("run with a bad cache: %v\n%s", err, out)
	}
	if got := r.Server.LedgerTotals().Requests; got != 0 {
		t.Fatalf("%d requests sent", got)
	}
}

// TestEnvCacheIsIgnoredOnTheBatchRoute pins issue #19's small item:
// APIDISPATCH_CACHE in the environment made --route batch fail with a
// message about --cache, a flag the user never passed. The environment's
// cache is now left out of a batch run with a one-line note; a --cache
// given on the command line is still refused, naming the flag.
func TestEnvCacheIsIgnoredOnTheBatchRoute(t *testing.T) {
	t.Parallel()
	const n = 20
	r, input, runDir := simAndInput(t, 200, n)
	cachePath := filepath.Join(t.TempDir(), "cache.db")
	c := cliCmd(r, "run", input, "--route", "batch", "--run-dir", runDir, "--base-url", r.URL, "--speed", "200", "--quiet")
	c.Env = append(c.Env, "APIDISPATCH_CACHE="+cachePath)
	out, err := c.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "APIDISPATCH_CACHE="+cachePath+" is not used") || strings.Contains(string(out), "--cache answers") {
		t.Fatalf("batch run with APIDISPATCH_CACHE: %v\n%s", err, out)
	}
	if s := readSummary(t, runDir); s.Succeeded != n || s.Cache != nil {
		t.Fatalf("batch run: %d succeeded, cache %+v", s.Succeeded, s.Cache)
	}
	if _, err := os.Stat(cachePath); err == nil {
		t.Fatalf("the batch run created the environment's cache file")
	}
	c = cliCmd(r, "run", input, "--route", "batch", "--run-dir", runDir+"2", "--base-url", r.URL, "--speed", "200", "--quiet", "--cache", cachePath)
	out, _ = c.CombinedOutput()
	if c.ProcessState.ExitCode() != exitUsage || !strings.Contains(string(out), "--cache") {
		t.Fatalf("batch run with --cache: exit %d\n%s", c.ProcessState.ExitCode(), out)
	}
}
