package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/ab"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// smallStorm keeps the storm self-test of command tests short.
func smallStorm(c *ab.Config) { c.StormTest = ab.StormTest{N: 200, Speed: 50} }

// liveSetup starts a simulator to play the live API and writes an orgs
// file naming the given orgs' keys through key files.
func liveSetup(t *testing.T, names ...string) (*sim.Running, string) {
	t.Helper()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = 50
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	dir := t.TempDir()
	var toml strings.Builder
	for _, n := range names {
		kf := filepath.Join(dir, n+".key")
		if err := os.WriteFile(kf, []byte(r.Server.Keys()[n][0]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&toml, "[[org]]\nname = %q\nkey_file = %q\n\n", n, kf)
	}
	orgs := filepath.Join(dir, "orgs.toml")
	if err := os.WriteFile(orgs, []byte(toml.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return r, orgs
}

func TestABUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"--n", "0"},
		{"--n", "10", "--order", "aabb", "--sim"},
		{"--n", "10", "--budget", "lots", "--sim"},
		{"--n", "10", "extra-arg"},
		{"--n", "10", "--speed", "-2", "--sim"},
		{"--n", "10", "--sim", "--arms", "legacy,batch"},
		{"--n", "10", "--sim", "--arms", "dispatcher"},
		{"--n", "10", "--sim", "--arms", "legacy,dispatcher,batch,batch"},
		{"--n", "10", "--sim", "--arms", "legacy,baseline,dispatcher"},
		{"--n", "10", "--sim", "--arms", "legacy,dispatcher,auto"},
		{"--n", "10", "--sim", "--arms", ""},
	} {
		var out, errb bytes.Buffer
		args = append(args, "--dir", t.TempDir())
		if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitUsage {
			t.Errorf("%v: exit %d, want %d; stderr %s", args, code, exitUsage, errb.String())
		}
	}
}

func TestABBudgetPauseSendsNothing(t *testing.T) {
	t.Parallel()
	r, orgs := liveSetup(t, "high_prio", "batch", "low_prio")
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"--n", "500", "--orgs", orgs, "--base-url", r.URL, "--speed", "50", "--budget", "0.50", "--dir", dir}
	if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitPaused {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitPaused, errb.String())
	}
	if n := r.Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("a paused A/B sent %d requests", n)
	}
	if !strings.Contains(errb.String(), "paused by the budget gate") || !strings.Contains(errb.String(), "2 arms ×") {
		t.Errorf("stderr lacks the gate's arithmetic:\n%s", errb.String())
	}
}

func TestABConfirmRefusal(t *testing.T) {
	t.Parallel()
	r, orgs := liveSetup(t, "high_prio", "batch")
	var out, errb bytes.Buffer
	args := []string{"--n", "30000", "--orgs", orgs, "--base-url", r.URL, "--speed", "50", "--dir", t.TempDir()}
	if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitRefused {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitRefused, errb.String())
	}
	if n := r.Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("a refused A/B sent %d requests", n)
	}
	if !strings.Contains(errb.String(), "--confirm") {
		t.Errorf("stderr does not mention --confirm:\n%s", errb.String())
	}
}

func TestABOneOrgRefused(t *testing.T) {
	t.Parallel()
	r, orgs := liveSetup(t, "high_prio")
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"--n", "100", "--orgs", orgs, "--base-url", r.URL, "--speed", "50", "--dir", dir}
	if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitRefused {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitRefused, errb.String())
	}
	if n := r.Server.LedgerTotals().Requests; n != 0 {
		t.Fatalf("sent %d requests", n)
	}
	ev, _ := os.ReadFile(filepath.Join(dir, rundir.EventsFile))
	if !bytes.Contains(ev, []byte(`"kind":"blocked"`)) || !strings.Contains(errb.String(), "at least 2 orgs") {
		t.Fatalf("events:\n%s\nstderr:\n%s", ev, errb.String())
	}
}

func TestABStormTestRefusal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	broken := func(c *ab.Config) {
		smallStorm(c)
		c.StormTest.Sim = func(sc *sim.Config) { sc.Faults = append(sc.Faults, sim.Fault{Kind: sim.FaultKeyRevoked}) }
	}
	args := []string{"--sim", "--n", "100", "--speed", "50", "--dir", dir}
	if code := runAB(context.Background(), args, &out, &errb, broken); code != exitRefused {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitRefused, errb.String())
	}
	ev, _ := os.ReadFile(filepath.Join(dir, rundir.EventsFile))
	if !bytes.Contains(ev, []byte(`"kind":"blocked"`)) || !bytes.Contains(ev, []byte("storm self-test failed")) {
		t.Fatalf("events:\n%s", ev)
	}
	if _, err := os.Stat(filepath.Join(dir, ab.ArmBaseline)); err == nil {
		t.Fatal("an arm ran after the self-test failed")
	}
}

func TestABSimEndToEnd(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ab")
	status := filepath.Join(t.TempDir(), "status.md")
	var secrets []string
	tune := func(c *ab.Config) {
		smallStorm(c)
		c.OnSim = func(r *sim.Running) {
			for _, ks := range r.Server.Keys() {
				secrets = append(secrets, ks...)
			}
		}
	}
	var out, errb bytes.Buffer
	args := []string{"--sim", "--n", "300", "--speed", "50", "--dir", dir, "--status-file", status, "--json", "--quiet"}
	if code := runAB(context.Background(), args, &out, &errb, tune); code != exitOK {
		t.Fatalf("exit %d; stderr %s", code, errb.String())
	}
	var res ab.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("stdout is not the result JSON: %v\n%s", err, out.String())
	}
	if !res.Complete || !res.Simulated || res.Arms.Baseline.Succeeded != 300 || res.Arms.Dispatcher.Succeeded != 300 {
		t.Fatalf("result %+v", res)
	}
	if page, err := os.ReadFile(filepath.Join(dir, "report.html")); err != nil || !bytes.Contains(page, []byte("<svg")) {
		t.Errorf("no HTML report with plots in the A/B directory: %v", err)
	}
	if !strings.Contains(errb.String(), "SIMULATION") || !strings.Contains(errb.String(), "nothing to rotate") {
		t.Errorf("stderr:\n%s", errb.String())
	}
	if len(secrets) != 3 {
		t.Fatalf("keys %v", len(secrets))
	}
	for _, s := range secrets {
		if strings.Contains(out.String(), s) || strings.Contains(errb.String(), s) {
			t.Fatal("a key was printed")
		}
	}
	for _, root := range []string{dir, filepath.Dir(status)} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, _ := os.ReadFile(p)
			for _, s := range secrets {
				if bytes.Contains(b, []byte(s)) {
					t.Errorf("%s contains a key", p)
				}
			}
			return nil
		})
	}
}

// TestABLiveReminder: a live A/B (here against a simulator playing the
// API) ends with the reminder to rotate the keys, by fingerprint.
func TestABLiveReminder(t *testing.T) {
	t.Parallel()
	r, orgs := liveSetup(t, "high_prio", "batch", "low_prio")
	var out, errb bytes.Buffer
	args := []string{"--n", "200", "--orgs", orgs, "--base-url", r.URL, "--speed", "50", "--dir", t.TempDir(), "--quiet"}
	if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitOK {
		t.Fatalf("exit %d; stderr %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "rotate them") {
		t.Fatalf("no rotation reminder:\n%s", errb.String())
	}
	for name, ks := range r.Server.Keys() {
		fp := org.Fingerprint(ks[0])
		if !strings.Contains(errb.String(), name+" ("+fp+")") {
			t.Errorf("reminder does not name %s by fingerprint %s", name, fp)
		}
		if strings.Contains(errb.String()+out.String(), ks[0]) {
			t.Fatal("a key was printed")
		}
	}
	if !strings.Contains(out.String(), "speed-up") {
		t.Errorf("stdout:\n%s", out.String())
	}
}

// A clean ab run ended on "stopping: the arm in progress winds down": the
// watcher took the deferred stop() at return for a signal. It must speak
// only when the context ends before the run does.
func TestABCleanRunDoesNotEndOnStopping(t *testing.T) {
	t.Parallel()
	var clean bytes.Buffer
	ctx, stop := context.WithCancel(context.Background())
	done := watchStop(ctx, stop, &clean)
	done() // the run returned
	stop() // then the deferred stop of abCmd
	if clean.Len() != 0 {
		t.Errorf("clean run printed %q", clean.String())
	}

	var signalled bytes.Buffer
	ctx, stop = context.WithCancel(context.Background())
	stopped := make(chan struct{})
	done = watchStop(ctx, func() { close(stopped); stop() }, &signalled)
	stop() // the signal
	<-stopped
	done()
	if !strings.HasPrefix(signalled.String(), "stopping: the arm in progress winds down") {
		t.Errorf("signalled run printed %q", signalled.String())
	}
}

// TestABArmsFlagNamed: a bad --arms list is refused with an error naming
// the flag, before anything is sent.
func TestABArmsFlagNamed(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ab")
	var out, errb bytes.Buffer
	code := runAB(context.Background(), []string{"--sim", "--n", "10", "--dir", dir, "--arms", "legacy,dispatcher,sync"}, &out, &errb, smallStorm)
	if code != exitUsage || !strings.Contains(errb.String(), "--arms") || !strings.Contains(errb.String(), `"sync"`) {
		t.Fatalf("exit %d; stderr %s", code, errb.String())
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("the A/B directory was made for a refused --arms")
	}
}

// TestABDispatcherArmUsesTheCache: --cache reaches the dispatcher arm
// (ab.Config.Cache, no longer a closure of the command's), and only it.
func TestABDispatcherArmUsesTheCache(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ab")
	cachePath := filepath.Join(t.TempDir(), "cache.db")
	var out, errb bytes.Buffer
	args := []string{"--sim", "--n", "60", "--speed", "50", "--dir", dir, "--quiet", "--cache", cachePath}
	if code := runAB(context.Background(), args, &out, &errb, smallStorm); code != exitOK {
		t.Fatalf("exit %d; stderr %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "the dispatcher arm uses the result cache") {
		t.Errorf("no note about the cache:\n%s", errb.String())
	}
	var s struct {
		Cache *struct {
			Mode         string `json:"mode"`
			Hits, Misses int64
		} `json:"cache"`
	}
	b, err := os.ReadFile(filepath.Join(dir, ab.ArmDispatcher, "summary.json"))
	if err != nil || json.Unmarshal(b, &s) != nil {
		t.Fatalf("the dispatcher arm's summary: %v", err)
	}
	if s.Cache == nil || s.Cache.Mode != "readwrite" || s.Cache.Hits+s.Cache.Misses != 60 {
		t.Fatalf("the dispatcher arm's cache: %+v", s.Cache)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ab.ArmBaseline, "summary.json")); bytes.Contains(b, []byte(`"cache"`)) {
		t.Error("the legacy arm has a cache")
	}
}
