package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"

	"github.com/apidispatch/apidispatch/anthropic"
)

// Preset names.
const (
	// PresetOrigin3Org is the three orgs measured in docs/design.md §24 (high_prio,
	// batch, low_prio) with their Sonnet 4.x, Haiku 4.5 and Opus 4.x limits,
	// the calibrated latency and a service capacity of 120 per org, and
	// Scale-tier Message Batches limits (4,000 RPM, 500,000 queued).
	PresetOrigin3Org = "origin-3org"
	// PresetBuild3Org is limit-bound: three orgs whose limits, for the judge
	// workload (~300 input and ~90 output tokens a call, caps of 100
	// concurrent), bind before the concurrency caps (about 2,300 requests
	// per minute per org at the calibrated latency) do:
	//   rpm_bound:  Start-tier 1,000 RPM / 2M ITPM / 400k OTPM → RPM binds at 1,000/min;
	//   otpm_bound: Build-tier 5,000 RPM / 5M ITPM with a 90k OTPM workspace
	//               cap → OTPM binds at ~1,000/min;
	//   itpm_bound: Build-tier 5,000 RPM / 1M OTPM with a 450k ITPM workspace
	//               cap → ITPM binds at ~1,500/min.
	// Message Batches limits: Start tier for rpm_bound (1,000 RPM, 200,000
	// queued), Build for the others (2,000 RPM, 300,000 queued).
	// The same limits apply to every pool.
	PresetBuild3Org = "build-3org"
	// PresetColleague is origin-3org plus colleagues using 40% of
	// high_prio's budget in every pool, from the start until cleared.
	PresetColleague = "colleague"
)

// PresetNames lists the presets Preset knows.
func PresetNames() []string {
	return []string{PresetOrigin3Org, PresetBuild3Org, PresetColleague}
}

// Preset returns a named configuration (see the Preset* constants) with
// Speed 1, Seed 0, prompt caching on (as on the API), and orgs with deterministic ids and one generated key
// each (see WithSeed for others).
func Preset(name string) (Config, error) {
	switch name {
	case PresetOrigin3Org:
		return origin3Org(), nil
	case PresetBuild3Org:
		limits := func(rpm, itpm, otpm int64) map[anthropic.Pool]Limits {
			return map[anthropic.Pool]Limits{AnyPool: {RPM: rpm, ITPM: itpm, OTPM: otpm}}
		}
		cfg := Config{Latency: DefaultLatency(), PromptCaching: true, Orgs: []OrgConfig{
			{Name: "rpm_bound", Limits: limits(1000, 2000000, 400000), ServiceCapacity: 120, Batch: batchStart},
			{Name: "otpm_bound", Limits: limits(5000, 5000000, 90000), ServiceCapacity: 120, Batch: batchBuild},
			{Name: "itpm_bound", Limits: limits(5000, 450000, 1000000), ServiceCapacity: 120, Batch: batchBuild},
		}}
		return cfg.withDefaults(), nil
	case PresetColleague:
		cfg := origin3Org()
		cfg.Faults = []Fault{{ID: "colleague", Kind: FaultColleague, Org: "high_prio", Fraction: 0.4}}
		return cfg, nil
	}
	names := PresetNames()
	sort.Strings(names)
	return Config{}, fmt.Errorf("%w: unknown preset %q (known: %v)", ErrConfig, name, names)
}

// Message Batches limits by tier (docs/design.md §14 "Other pools"):
// batch endpoint RPM and processing-queue cap.
var (
	batchStart = BatchLimits{RPM: 1000, Queue: 200_000}
	batchBuild = BatchLimits{RPM: 2000, Queue: 300_000}
	batchScale = BatchLimits{RPM: 4000, Queue: 500_000}
)

// origin3Org: docs/design.md §24 phase0_limits.json. high_prio's Haiku ITPM had no
// header at the probe; 8M makes the three orgs sum to the ~40M the
// guidelines cite.
func origin3Org() Config {
	type row struct{ rpm, itpm, otpm int64 }
	mk := func(sonnet, haiku, opus row) map[anthropic.Pool]Limits {
		return map[anthropic.Pool]Limits{
			anthropic.PoolSonnet4: {sonnet.rpm, sonnet.itpm, sonnet.otpm},
			anthropic.PoolHaiku45: {haiku.rpm, haiku.itpm, haiku.otpm},
			anthropic.PoolOpus4:   {opus.rpm, opus.itpm, opus.otpm},
		}
	}
	cfg := Config{Latency: DefaultLatency(), PromptCaching: true, Orgs: []OrgConfig{
		{Name: "high_prio", ID: orgUUID("b94495b5", "high_prio", 0), ServiceCapacity: 120, Limits: mk(
			row{30000, 10000000, 1000000}, row{30000, 8000000, 1200000}, row{150000, 60000000, 10000000}), Batch: batchScale},
		{Name: "batch", ID: orgUUID("b4bbba0c", "batch", 0), ServiceCapacity: 120, Limits: mk(
			row{90000, 8000000, 800000}, row{4000, 8000000, 800000}, row{4000, 10000000, 2000000}), Batch: batchScale},
		{Name: "low_prio", ID: orgUUID("af04cd8f", "low_prio", 0), ServiceCapacity: 120, Limits: mk(
			row{30000, 15000000, 1200000}, row{30000, 24000000, 2400000}, row{150000, 120000000, 12000000}), Batch: batchScale},
	}}
	return cfg.withDefaults()
}

// WithSeed returns c with Seed set and the org ids and keys that were
// generated from the old seed regenerated from the new one (an id keeps its
// first 8 hex digits, a preset's measured prefix). Ids and keys given
// explicitly are kept.
func (c Config) WithSeed(seed int64) Config {
	old := c.Seed
	c.Seed = seed
	orgs := make([]OrgConfig, len(c.Orgs))
	for i, o := range c.Orgs {
		if len(o.ID) == 36 && o.ID == orgUUID(o.ID[:8], o.Name, old) {
			o.ID = orgUUID(o.ID[:8], o.Name, seed)
		}
		keys := make([]string, len(o.Keys))
		for j, k := range o.Keys {
			if k == simKey(o.Name, old, j) {
				k = simKey(o.Name, seed, j)
			}
			keys[j] = k
		}
		o.Keys = keys
		orgs[i] = o
	}
	c.Orgs = orgs
	return c
}

// orgUUID is a deterministic version-4-shaped UUID for an org, starting with
// prefix (8 hex digits) when given.
func orgUUID(prefix, name string, seed int64) string {
	sum := sha256.Sum256([]byte("org/" + strconv.FormatInt(seed, 10) + "/" + name))
	h := hex.EncodeToString(sum[:])
	if len(prefix) == 8 {
		h = prefix + h[8:]
	}
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

// simKey is the simulator's fake API key number i of org name.
func simKey(name string, seed int64, i int) string {
	sum := sha256.Sum256([]byte("key/" + strconv.FormatInt(seed, 10) + "/" + name + "/" + strconv.Itoa(i)))
	return "sk-ant-sim-" + name + "-" + hex.EncodeToString(sum[:12])
}
