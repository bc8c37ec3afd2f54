package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/sim"
)

// TestRunOutputsArePrivate is issue 20's world-readable outputs: a run's
// directory is 0700 and everything in it (results, events, summary, the
// run store and its WAL) 0600, and so is the cache file, even under a
// umask of 022: they hold model outputs.
func TestRunOutputsArePrivate(t *testing.T) {
	r, input, runDir := simWith(t, 50, 30, func(*sim.Config) {})
	cachePath := filepath.Join(t.TempDir(), "cache.sqlite")
	c := cliCmd(r, "run", input, "--run-dir", runDir, "--base-url", r.URL, "--speed", "50", "--quiet", "--cache", cachePath)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st, err := os.Stat(runDir)
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Mode().Perm(); p != 0o700 {
		t.Errorf("run directory %o, want 700", p)
	}
	ents, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || fi.IsDir() {
			continue
		}
		if p := fi.Mode().Perm(); p&0o077 != 0 {
			t.Errorf("%s is %o: readable by others", e.Name(), p)
		}
	}
	if len(ents) < 4 {
		t.Fatalf("only %d files in the run directory", len(ents))
	}
	matches, _ := filepath.Glob(cachePath + "*")
	for _, m := range matches {
		fi, err := os.Stat(m)
		if err != nil {
			t.Fatal(err)
		}
		if p := fi.Mode().Perm(); p&0o077 != 0 {
			t.Errorf("%s is %o: readable by others", filepath.Base(m), p)
		}
	}
	if len(matches) == 0 {
		t.Fatal("no cache file")
	}
}
