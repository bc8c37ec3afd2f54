package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/sim"
)

// TestProbeCommand probes the simulator's origin-3org preset at K=20: the
// limits file holds the preset's limits × K and the speed factor, a model
// the orgs lack is recorded as a 404, and no key appears anywhere.
func TestProbeCommand(t *testing.T) {
	t.Parallel()
	const k = 20
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = k
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	keys := simKeys(r)
	out := filepath.Join(t.TempDir(), "limits.json")
	code, stdout, stderr := runCLI("probe", "--orgs", orgsFile(t, keys), "--base-url", r.URL, "--out", out,
		"--models", "claude-sonnet-4-5-20250929,claude-haiku-4-5-20251001,claude-opus-4-8,claude-sonnet-5")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	l, err := plan.LoadLimits(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, oc := range cfg.Orgs {
		for _, m := range []string{"claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", "claude-opus-4-8"} {
			want := oc.Limits[anthropic.PoolOf(m)]
			got := l.Orgs[oc.Name][m]
			if got.Status != 200 || got.RPM != want.RPM*k || got.ITPM != want.ITPM*k || got.OTPM != want.OTPM*k || got.OrgID != oc.ID {
				t.Errorf("%s/%s = %+v, preset %+v × %d", oc.Name, m, got, want, k)
			}
		}
		if got := l.Orgs[oc.Name]["claude-sonnet-5"]; got.Status != 404 {
			t.Errorf("%s/claude-sonnet-5 status %d, want 404 (not served by the preset)", oc.Name, got.Status)
		}
	}
	if l.SpeedFactor != k || !l.OrgsDistinctAdditive {
		t.Errorf("speed %g additive %v", l.SpeedFactor, l.OrgsDistinctAdditive)
	}
	for _, s := range []string{"high_prio", "claude-opus-4-8", "probes cost $", "speed K=20", "wrote " + out} {
		if !strings.Contains(stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, stdout)
		}
	}
	for _, key := range keys {
		if strings.Contains(stdout+stderr, key) {
			t.Fatal("a key was printed")
		}
	}

	// Every key refused: the file records the 401s and the command fails.
	bad := filepath.Join(t.TempDir(), "bad.json")
	code, _, stderr = runCLI("probe", "--orgs", orgsFile(t, map[string]string{"x": "sk-ant-wrong"}), "--base-url", r.URL, "--out", bad, "--models", "claude-sonnet-4-5")
	if code != exitUsage || !strings.Contains(stderr, "no probe was answered with 200") {
		t.Errorf("bad key: exit %d %s", code, stderr)
	}
	if l, err := plan.LoadLimits(bad); err != nil || l.Orgs["x"]["claude-sonnet-4-5"].Status != 401 {
		t.Errorf("bad key file: %v %+v", err, l)
	}
	// Plain http to a non-loopback host is refused before anything is sent.
	if code, _, stderr := runCLI("probe", "--orgs", orgsFile(t, keys), "--base-url", "http://example.com", "--out", bad); code != exitUsage || !strings.Contains(stderr, "loopback") {
		t.Errorf("insecure URL: exit %d %s", code, stderr)
	}
}
