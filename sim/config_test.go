package sim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

func TestPresetOrigin3Org(t *testing.T) {
	t.Parallel()
	cfg, err := Preset(PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		prefix              string
		sonnet, haiku, opus Limits
	}{
		"high_prio": {"b94495b5", Limits{30000, 10000000, 1000000}, Limits{30000, 8000000, 1200000}, Limits{150000, 60000000, 10000000}},
		"batch":     {"b4bbba0c", Limits{90000, 8000000, 800000}, Limits{4000, 8000000, 800000}, Limits{4000, 10000000, 2000000}},
		"low_prio":  {"af04cd8f", Limits{30000, 15000000, 1200000}, Limits{30000, 24000000, 2400000}, Limits{150000, 120000000, 12000000}},
	}
	if len(cfg.Orgs) != 3 {
		t.Fatalf("%d orgs", len(cfg.Orgs))
	}
	keys := map[string]bool{}
	for _, o := range cfg.Orgs {
		w, ok := want[o.Name]
		if !ok {
			t.Fatalf("unexpected org %q", o.Name)
		}
		if !strings.HasPrefix(o.ID, w.prefix+"-") || len(o.ID) != 36 {
			t.Errorf("%s id %q", o.Name, o.ID)
		}
		if o.Limits[anthropic.PoolSonnet4] != w.sonnet || o.Limits[anthropic.PoolHaiku45] != w.haiku || o.Limits[anthropic.PoolOpus4] != w.opus {
			t.Errorf("%s limits %+v", o.Name, o.Limits)
		}
		if len(o.Keys) != 1 || !strings.HasPrefix(o.Keys[0], "sk-ant-sim-"+o.Name+"-") || keys[o.Keys[0]] {
			t.Errorf("%s keys %v", o.Name, o.Keys)
		}
		keys[o.Keys[0]] = true
	}
	again, _ := Preset(PresetOrigin3Org)
	if again.Orgs[0].Keys[0] != cfg.Orgs[0].Keys[0] || again.Orgs[0].ID != cfg.Orgs[0].ID {
		t.Error("preset keys or ids are not deterministic")
	}
	seeded := cfg.WithSeed(9)
	if seeded.Orgs[0].Keys[0] == cfg.Orgs[0].Keys[0] || !strings.HasPrefix(seeded.Orgs[0].ID, "b94495b5-") || seeded.Orgs[0].ID == cfg.Orgs[0].ID {
		t.Errorf("WithSeed: keys %v id %s", seeded.Orgs[0].Keys, seeded.Orgs[0].ID)
	}
	if _, err := Preset("nope"); !errors.Is(err, ErrConfig) {
		t.Errorf("unknown preset: %v", err)
	}
}

// build-3org binds on limits, not on concurrency caps, for the judge
// workload: each org's ceiling is below what 100 concurrent requests at the
// calibrated latency (~2,300 a minute) would do, and the binding limit is
// the one the org is named after.
func TestPresetBuild3OrgIsLimitBound(t *testing.T) {
	t.Parallel()
	cfg, err := Preset(PresetBuild3Org)
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.Latency
	meanLatency := (l.TTFT+90*l.PerToken).Seconds()*1.13 + l.TailProb*l.TailMean.Seconds()
	concurrencyCeiling := 100 / meanLatency * 60
	for _, o := range cfg.Orgs {
		lim := o.Limits[AnyPool]
		ceil := map[string]float64{
			"rpm":  float64(lim.RPM),
			"itpm": float64(lim.ITPM) / 300,
			"otpm": float64(lim.OTPM) / 90,
		}
		binding, low := "", 1e18
		for k, v := range ceil {
			if v < low {
				binding, low = k, v
			}
		}
		if o.Name != binding+"_bound" || low >= 0.75*concurrencyCeiling {
			t.Errorf("%s: binds on %s at %.0f/min vs concurrency ceiling %.0f/min", o.Name, binding, low, concurrencyCeiling)
		}
	}
}

func TestPresetColleague(t *testing.T) {
	t.Parallel()
	cfg, _ := Preset(PresetColleague)
	if len(cfg.Faults) != 1 || cfg.Faults[0].Kind != FaultColleague || cfg.Faults[0].Org != "high_prio" || cfg.Faults[0].Fraction != 0.4 {
		t.Fatalf("faults %+v", cfg.Faults)
	}
	cfg.Latency = LatencyConfig{Zero: true}
	cfg.Speed = 10
	run := startSim(t, cfg)
	post(t, run, run.Server.Keys()["high_prio"][0], judgeBody(1, 64))
	time.Sleep(400 * time.Millisecond)
	// At K=10 the colleague draws 300 every 0.15 s (40% of 300,000/min)
	// from the full bucket; ours was one.
	st := run.Server.Stats().Org("high_prio")
	for _, p := range st.Pools {
		if p.Pool == "sonnet-4" && (p.ColleagueUsed[0] < 10 || p.ColleagueRefused[0] != 0) {
			t.Errorf("colleague used %d, refused %d; want its draws served", p.ColleagueUsed[0], p.ColleagueRefused[0])
		}
	}
	if r := post(t, run, run.Server.Keys()["batch"][0], judgeBody(1, 64)); r.header.Get("anthropic-ratelimit-requests-remaining") < "89900" {
		t.Errorf("batch has no colleagues: remaining %q", r.header.Get("anthropic-ratelimit-requests-remaining"))
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadConfig(write("a.json", `{"preset":"origin-3org","speed":20,"seed":4,
		"latency":{"ttft_s":0.5},
		"faults":[{"kind":"storm_429","org":"batch","start":"30s","duration":10,"retry_after":"2s","probability":0.5}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Speed != 20 || cfg.Seed != 4 || len(cfg.Orgs) != 3 || cfg.Latency.TTFT != 500*time.Millisecond ||
		cfg.Latency.PerToken != DefaultLatency().PerToken {
		t.Errorf("overlay: %+v", cfg)
	}
	p, _ := Preset(PresetOrigin3Org)
	if cfg.Orgs[0].Keys[0] == p.Orgs[0].Keys[0] || cfg.Orgs[0].Keys[0] != p.WithSeed(4).Orgs[0].Keys[0] {
		t.Errorf("seed 4 in the file kept the preset's seed-0 keys")
	}
	f := cfg.Faults[0]
	if f.Kind != FaultRateLimitStorm || f.Start != 30*time.Second || f.Duration != 10*time.Second || f.RetryAfter != 2*time.Second || f.Probability != 0.5 {
		t.Errorf("fault %+v", f)
	}
	cfg, err = LoadConfig(write("b.json", `{"orgs":[{"name":"solo","limits":{"sonnet-4":{"rpm":50,"itpm":30000,"otpm":8000},"*":{"rpm":5}}}]}`))
	if err != nil || len(cfg.Orgs) != 1 || cfg.Orgs[0].Limits[AnyPool].RPM != 5 {
		t.Fatalf("plain config: %v %+v", err, cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if keys := s.Keys()["solo"]; len(keys) != 1 || !strings.HasPrefix(keys[0], "sk-ant-sim-solo-") {
		t.Errorf("generated keys %v", keys)
	}
	if lines := s.EnvLines(); len(lines) != 1 || !strings.HasPrefix(lines[0], "ANTHROPIC_API_KEY_SOLO=sk-ant-sim-solo-") {
		t.Errorf("env lines %v", lines)
	}
	for name, body := range map[string]string{
		"unknown field": `{"orgs":[],"nope":1}`,
		"no orgs":       `{"speed":2}`,
		"bad preset":    `{"preset":"x"}`,
		"bad fault":     `{"preset":"origin-3org","faults":[{"kind":"colleague","fraction":1.5}]}`,
		"bad otpm mode": `{"preset":"origin-3org","otpm_mode":"sometimes"}`,
		"shared key":    `{"orgs":[{"name":"a","keys":["k"]},{"name":"b","keys":["k"]}]}`,
	} {
		if _, err := LoadConfig(write("bad.json", body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
