package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// OTPMMode says how output tokens are charged to the OTPM bucket.
type OTPMMode string

const (
	// OTPMActual charges the output tokens a request actually produced, at
	// completion; the bucket may go negative, refusing later requests until it
	// refills (the API's behaviour since early 2026). The default.
	OTPMActual OTPMMode = "actual"
	// OTPMReserveMaxTokens reserves max_tokens at admission and refunds the
	// unused part at completion (the API's behaviour until early 2026).
	OTPMReserveMaxTokens OTPMMode = "reserve_max_tokens"
)

// Limits are one org's per-minute limits for one model pool, in API units.
// A zero field means that dimension is not limited.
type Limits struct {
	RPM  int64 `json:"rpm"`
	ITPM int64 `json:"itpm"`
	OTPM int64 `json:"otpm"`
}

// AnyPool is the Limits key that applies to every pool an org does not list
// explicitly. An org without it serves only the pools it lists; a model of
// any other pool is a 404 not_found_error for that org, as old models were
// for the orgs of docs/design.md §24.
const AnyPool anthropic.Pool = "*"

// OrgConfig is one simulated organisation.
type OrgConfig struct {
	// Name is the org's short name ("high_prio"): letters, digits, _ or -.
	Name string `json:"name"`
	// ID is the org UUID sent in anthropic-organization-id and named in 429
	// messages. Empty: derived from Name and Config.Seed.
	ID string `json:"id,omitempty"`
	// Keys are the API keys that reach this org. Empty: one key is generated
	// from Name and Config.Seed ("sk-ant-sim-<name>-<hex>").
	Keys []string `json:"keys,omitempty"`
	// Limits per pool (see AnyPool).
	Limits map[anthropic.Pool]Limits `json:"limits"`
	// ServiceCapacity is how many requests of this org are served at full
	// speed at once. Above it latency grows as (in flight/capacity)^
	// Latency.CongestionExponent, decided when a request is admitted.
	// Zero means unlimited.
	ServiceCapacity int `json:"service_capacity,omitempty"`
	// Batch is the org's Message Batches limits and processing speed; zero
	// fields take the defaults of BatchLimits. An OpenAI org's batches use
	// PerMinute, QueueWaitS (how long a batch validates) and CancelS.
	Batch BatchLimits `json:"batch,omitzero"`
	// Provider is "anthropic" (the default) or "openai". An OpenAI org
	// serves the OpenAI surface (openai.go) with Bearer keys, ModelLimits
	// instead of Limits, and Projects.
	Provider string `json:"provider,omitempty"`
	// ModelLimits are an OpenAI org's limits per model id ("gpt-4.1"; a
	// dated snapshot shares its model's) or "*" for every model it does
	// not list. An org without "*" serves only the models it lists.
	ModelLimits map[string]OpenAILimits `json:"model_limits,omitempty"`
	// Projects are an OpenAI org's project ids; a request's
	// OpenAI-Project header must name one. Empty: one is generated.
	Projects []string `json:"projects,omitempty"`
}

// LatencyConfig is the latency model, in API-equivalent time. A request that
// produces n output tokens takes
//
//	(TTFT + n·PerToken) · exp(Sigma·Z) + B·Exp(TailMean)
//
// where Z is standard normal and B is 1 with probability TailProb, all drawn
// from the server's seeded generator; then it is slowed by congestion (see
// OrgConfig.ServiceCapacity) and divided by the speed factor.
// DefaultLatency gives the calibrated values.
type LatencyConfig struct {
	// Zero: no latency at all (for overhead benchmarks).
	Zero bool `json:"zero,omitempty"`
	// TTFT is the median time to first token.
	TTFT time.Duration `json:"-"`
	// PerToken is the median time per output token.
	PerToken time.Duration `json:"-"`
	// Sigma is the shape of the lognormal jitter (0: none).
	Sigma float64 `json:"sigma"`
	// TailProb is the probability of an extra stall.
	TailProb float64 `json:"tail_prob"`
	// TailMean is the mean of an extra stall (exponentially distributed).
	TailMean time.Duration `json:"-"`
	// CongestionExponent shapes the slowdown above ServiceCapacity; 0 means 1.
	CongestionExponent float64 `json:"congestion_exponent,omitempty"`
}

// latencyJSON is LatencyConfig on the wire: durations as seconds.
type latencyJSON struct {
	Zero               bool    `json:"zero,omitempty"`
	TTFTS              float64 `json:"ttft_s"`
	PerTokenS          float64 `json:"per_token_s"`
	Sigma              float64 `json:"sigma"`
	TailProb           float64 `json:"tail_prob"`
	TailMeanS          float64 `json:"tail_mean_s"`
	CongestionExponent float64 `json:"congestion_exponent,omitempty"`
}

// MarshalJSON writes durations as seconds (ttft_s, per_token_s, tail_mean_s).
func (l LatencyConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(latencyJSON{l.Zero, l.TTFT.Seconds(), l.PerToken.Seconds(), l.Sigma, l.TailProb, l.TailMean.Seconds(), l.CongestionExponent})
}

// UnmarshalJSON reads durations as seconds; absent fields keep their value.
func (l *LatencyConfig) UnmarshalJSON(b []byte) error {
	j := latencyJSON{l.Zero, l.TTFT.Seconds(), l.PerToken.Seconds(), l.Sigma, l.TailProb, l.TailMean.Seconds(), l.CongestionExponent}
	if err := strictUnmarshal(b, &j); err != nil {
		return err
	}
	*l = LatencyConfig{j.Zero, seconds(j.TTFTS), seconds(j.PerTokenS), j.Sigma, j.TailProb, seconds(j.TailMeanS), j.CongestionExponent}
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// DefaultLatency is the latency model calibrated to docs/design.md §24 Phase 1
// n2500 (one org, concurrency 100, max_tokens 64, ~45-token prompt:
// ≈3,070 requests/min, p50 ≈1.52 s, p95 ≈3.5 s). See CALIBRATION.md.
func DefaultLatency() LatencyConfig {
	return LatencyConfig{
		TTFT:               690 * time.Millisecond,
		PerToken:           13 * time.Millisecond,
		Sigma:              0.49,
		TailProb:           0.01,
		TailMean:           2 * time.Second,
		CongestionExponent: 1.25,
	}
}

// Config describes a simulator. The zero value is not usable (it has no
// orgs); start from Preset or LoadConfig. New fills unset fields with
// defaults: Speed 1, OTPMMode actual, BurstFraction 1, Seed 0 is a valid seed.
type Config struct {
	// Speed is the speed factor K (see the package doc). 0 means 1.
	Speed float64 `json:"speed,omitempty"`
	// Seed seeds latency jitter, fault probabilities, ids and generated keys.
	Seed int64 `json:"seed"`
	// OTPMMode is how output tokens are charged. Empty means OTPMActual.
	OTPMMode OTPMMode `json:"otpm_mode,omitempty"`
	// BurstFraction is each bucket's capacity as a fraction of its API
	// limit per minute, not multiplied by Speed (the API does not publish
	// it). 0 means 1: capacity = one minute of the limit.
	BurstFraction float64 `json:"burst_fraction,omitempty"`
	// Latency is the latency model.
	Latency LatencyConfig `json:"latency"`
	// Orgs are the simulated organisations; names must be unique.
	Orgs []OrgConfig `json:"orgs"`
	// Unlimited switches rate limiting off entirely (no buckets, no
	// rate-limit headers), for overhead benchmarks.
	Unlimited bool `json:"unlimited,omitempty"`
	// Faults active from the start (see Fault).
	Faults []Fault `json:"faults,omitempty"`
	// PromptCaching simulates prompt caching: a prefix ending in a block with
	// cache_control and at least 1,024 tokens (2,048 for Haiku) is written on
	// first use and read for 5 API-minutes after (1 h with "ttl":"1h"), each
	// read refreshing it. Each org has its own cache, per model; a request
	// refused before admission writes nothing, and a written prefix is
	// readable only once its writer's response has begun (its first
	// token), so requests sent together all write it.
	// Every preset turns it on, as the API always caches; a Config built
	// by hand has it off unless set. A cached prefix bills differently on
	// its second use, so the arms of an A/B cost the same only when their
	// prompts are below the minimum (the judge workload's are).
	PromptCaching bool `json:"prompt_caching,omitempty"`
	// LedgerPath, when set, receives every ledger entry as a JSON line,
	// appended while the server runs and flushed by Close.
	LedgerPath string `json:"ledger_path,omitempty"`
	// LedgerRetain bounds how many ledger entries are kept in memory per
	// org for Ledger and /sim/ledger (between it and twice it; the oldest
	// are dropped first). Totals and duplicate counts always cover every
	// entry, and LedgerPath gets every entry. 0 keeps all; negative keeps
	// none (the cheapest, for throughput benchmarks). Duplicate detection
	// keeps 20 bytes per distinct body billed, whatever this is.
	LedgerRetain int `json:"ledger_retain,omitempty"`
	// BillAbandoned: a request whose client goes away (a timeout, a killed
	// process) while it is being generated is finished and billed anyway,
	// the answer going nowhere. Whether the API bills such requests is not
	// documented; this is the worse case, for tests of what a crash can
	// cost. Off: an abandoned request is dropped unbilled (status 499).
	BillAbandoned bool `json:"bill_abandoned,omitempty"`
}

// configJSON is the file form: a Config plus the preset it starts from.
type configJSON struct {
	Preset string `json:"preset"`
}

var orgNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// LoadConfig reads a JSON config file. If it names "preset", the preset is
// loaded first and the file's fields replace the preset's (a field absent
// from the file keeps the preset's value; "orgs" and "faults" replace the
// whole list). Unknown fields are an error. Example:
//
//	{
//	  "preset": "origin-3org",
//	  "speed": 20,
//	  "seed": 7,
//	  "otpm_mode": "actual",
//	  "burst_fraction": 1,
//	  "latency": {"ttft_s": 0.6, "per_token_s": 0.013, "sigma": 0.43,
//	              "tail_prob": 0.025, "tail_mean_s": 6, "congestion_exponent": 1.15},
//	  "orgs": [{"name": "solo", "id": "", "keys": ["sk-ant-sim-solo-1"],
//	            "limits": {"sonnet-4": {"rpm": 50, "itpm": 30000, "otpm": 8000},
//	                       "*": {"rpm": 1000, "itpm": 2000000, "otpm": 400000}},
//	            "service_capacity": 120}],
//	  "faults": [{"kind": "overloaded_529", "org": "solo", "start": "10s",
//	              "duration": "5s", "probability": 0.2}],
//	  "prompt_caching": false,
//	  "unlimited": false
//	}
//
// Pool names are those of the anthropic package ("sonnet-4", "haiku-4-5",
// "opus-4", "sonnet-5", "opus-5", "fable-5", "haiku-3-5") or "*".
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("sim: config: %w", err)
	}
	return parseConfig(b, path)
}

func parseConfig(b []byte, where string) (Config, error) {
	var head configJSON
	if err := json.Unmarshal(b, &head); err != nil {
		return Config{}, fmt.Errorf("sim: config %s: %w", where, err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return Config{}, fmt.Errorf("sim: config %s: %w", where, err)
	}
	var cfg Config
	presetSeed := int64(0)
	if head.Preset != "" {
		p, err := Preset(head.Preset)
		if err != nil {
			return Config{}, fmt.Errorf("sim: config %s: %w", where, err)
		}
		cfg = p
		presetSeed = p.Seed
	}
	// Lists in the file replace the preset's; they are not merged element-wise.
	if _, ok := keys["orgs"]; ok {
		cfg.Orgs = nil
	}
	if _, ok := keys["faults"]; ok {
		cfg.Faults = nil
	}
	// Decode onto the preset. "preset" is known to the wrapper only.
	var wrapper struct {
		Preset string `json:"preset"`
		*Config
	}
	wrapper.Config = &cfg
	if err := strictUnmarshal(b, &wrapper); err != nil {
		return Config{}, fmt.Errorf("sim: config %s: %w", where, err)
	}
	if _, own := keys["orgs"]; head.Preset != "" && !own && cfg.Seed != presetSeed {
		// The preset's keys and ids were generated from its seed.
		seed := cfg.Seed
		cfg.Seed = presetSeed
		cfg = cfg.WithSeed(seed)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("sim: config %s: %w", where, err)
	}
	return cfg, nil
}

func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid simulator config")

func (c *Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	if !(c.Speed >= 0) || math.IsInf(c.Speed, 0) {
		return bad("speed %v must be positive", c.Speed)
	}
	switch c.OTPMMode {
	case "", OTPMActual, OTPMReserveMaxTokens:
	default:
		return bad("otpm_mode %q: use %q or %q", c.OTPMMode, OTPMActual, OTPMReserveMaxTokens)
	}
	if !(c.BurstFraction >= 0) || math.IsInf(c.BurstFraction, 0) {
		return bad("burst_fraction %v must be positive", c.BurstFraction)
	}
	l := c.Latency
	if l.TTFT < 0 || l.PerToken < 0 || l.TailMean < 0 || l.Sigma < 0 || l.TailProb < 0 || l.TailProb > 1 || l.CongestionExponent < 0 {
		return bad("latency parameters must be non-negative (tail_prob at most 1)")
	}
	if len(c.Orgs) == 0 {
		return bad("no orgs")
	}
	names := map[string]bool{}
	keys := map[string]string{}
	for i, o := range c.Orgs {
		if !orgNameRE.MatchString(o.Name) {
			return bad("org #%d: name %q must be 1-64 of letters, digits, _ or -", i+1, o.Name)
		}
		if names[strings.ToLower(o.Name)] {
			return bad("org %q appears twice", o.Name)
		}
		names[strings.ToLower(o.Name)] = true
		for _, k := range o.Keys {
			if strings.TrimSpace(k) == "" || strings.ContainsAny(k, " \t\r\n") {
				return bad("org %q: a key is blank or holds whitespace", o.Name)
			}
			if other, dup := keys[k]; dup {
				return bad("orgs %q and %q share a key", other, o.Name)
			}
			keys[k] = o.Name
		}
		for p, lim := range o.Limits {
			if lim.RPM < 0 || lim.ITPM < 0 || lim.OTPM < 0 {
				return bad("org %q pool %q: limits must not be negative", o.Name, p)
			}
		}
		if o.ServiceCapacity < 0 {
			return bad("org %q: service_capacity must not be negative", o.Name)
		}
		if err := o.Batch.check(); err != nil {
			return bad("org %q: batch: %v", o.Name, err)
		}
		if err := o.checkProvider(); err != nil {
			return bad("org %q: %v", o.Name, err)
		}
	}
	for i := range c.Faults {
		if err := c.Faults[i].check(); err != nil {
			return bad("fault #%d: %v", i+1, err)
		}
	}
	return nil
}
