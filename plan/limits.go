package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/upstream"
)

// LimitsFormat is the "format" of a limits file written by this package.
const LimitsFormat = "apidispatch-limits/1"

// Limits is a limits file: for each org, for each probed model, the rate
// limits the API reported. 'apidispatch probe' writes it; plan and run read
// it with LoadLimits, which also accepts the original system's
// phase0_limits.json. A Limits is plain data: safe for concurrent reads.
type Limits struct {
	Format string `json:"format"`
	// Orgs maps org name → model id → limits.
	Orgs map[string]map[string]ModelLimits `json:"orgs"`
	// OrgIDs maps org name → anthropic-organization-id, when known.
	OrgIDs map[string]string `json:"org_ids,omitempty"`
	// SharedOrgs lists groups of org names whose keys reach the same
	// organisation: their limits do not add (the engine uses only the
	// first of each group). Recomputed by LoadLimits from the org ids.
	SharedOrgs [][]string `json:"shared_orgs,omitempty"`
	// OrgsDistinctAdditive is true when every org name reaches a different
	// organisation, so limits add across orgs.
	OrgsDistinctAdditive bool `json:"orgs_distinct_additive"`
	// ProbedAt is when the probe ran (zero when unknown).
	ProbedAt time.Time `json:"probed_at,omitzero"`
	// BaseURL is the API root probed.
	BaseURL string `json:"base_url,omitempty"`
	// SpeedFactor is the simulator's K reported by x-sim-speed-factor
	// (0 when the server did not say: the real API).
	SpeedFactor float64 `json:"speed_factor,omitempty"`
	// Source says where the file came from: "probe" or "phase0_limits.json".
	Source string `json:"source,omitempty"`
	// PricesSource names the price table the probe used ("embedded" or a
	// --prices path), and Prices records it, $ per million tokens.
	PricesSource string                 `json:"prices_source,omitempty"`
	Prices       map[string]PriceRecord `json:"prices,omitempty"`
	// ProbeCostNanos is what the probe requests cost, from their usage.
	ProbeCostNanos cost.Nanos `json:"probe_cost_nanos,omitempty"`
	ProbeCostUSD   float64    `json:"probe_cost_usd,omitempty"`
	// Notes are free-form remarks ("high_prio/claude-haiku-4-5: HTTP 429 at probe").
	Notes []string `json:"notes,omitempty"`
	// Batch overrides the Message Batches processing model every org is
	// assumed to have (the "batch" object: queue_wait_s, per_minute, queue,
	// max_batch, poll_s, in API units even for a simulator probed at speed
	// K); nil or a zero field takes DefaultBatchModel. Read it with
	// Limits.BatchModel.
	Batch *BatchModel `json:"batch,omitempty"`
}

// BatchModel returns the batch processing model of the file: its "batch"
// object with defaults for what it leaves out; DefaultBatchModel for a nil
// Limits or a file without one.
func (l *Limits) BatchModel() BatchModel {
	if l == nil || l.Batch == nil {
		return DefaultBatchModel()
	}
	return l.Batch.WithDefaults()
}

// ModelLimits is what one probe of one (org, model) saw. A limit of 0 means
// unknown (the header was absent), not "no capacity".
type ModelLimits struct {
	Pool string `json:"pool,omitempty"`
	// Status is the HTTP status of the probe (0: no response).
	Status int `json:"status"`
	// RPM, ITPM and OTPM are the per-minute limits of requests, input
	// tokens and output tokens; TPM is the anthropic-ratelimit-tokens-limit
	// (the most restrictive token limit, e.g. a workspace's).
	RPM  int64 `json:"rpm"`
	ITPM int64 `json:"itpm"`
	OTPM int64 `json:"otpm"`
	TPM  int64 `json:"tpm,omitempty"`
	// Remaining is what was left at the probe.
	Remaining Remaining `json:"remaining"`
	// OrgID is the anthropic-organization-id the key reached.
	OrgID string `json:"org_id,omitempty"`
	// ServiceTier is usage.service_tier of the probe's response.
	ServiceTier string `json:"service_tier,omitempty"`
	// KeyFingerprint names the key probed (never the key).
	KeyFingerprint string `json:"key_fingerprint,omitempty"`
	// CostNanos is the probe's cost from its usage.
	CostNanos cost.Nanos `json:"cost_nanos,omitempty"`
	// Error is the error type and message of a non-200 probe.
	Error string `json:"error,omitempty"`
}

// Remaining is the *-remaining headers at the probe (0 when absent).
type Remaining struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Tokens       int64 `json:"tokens,omitempty"`
}

// Usable reports whether the probe says the model can be served by the org
// now or soon: a 200, or a 429 (the limits are real, the buckets were
// momentarily empty). A 401/403/404 or no response is not usable.
func (m ModelLimits) Usable() bool {
	return m.Status == http.StatusOK || m.Status == http.StatusTooManyRequests
}

// PriceRecord is one model's prices in a limits file, US dollars per
// million tokens.
type PriceRecord struct {
	Aliases      []string `json:"aliases,omitempty"`
	Input        float64  `json:"input"`
	Output       float64  `json:"output"`
	CacheWrite5m float64  `json:"cache_write_5m"`
	CacheWrite1h float64  `json:"cache_write_1h"`
	CacheRead    float64  `json:"cache_read"`
}

// PriceRecords returns the table as PriceRecords keyed by canonical model id.
func PriceRecords(t *cost.Table) map[string]PriceRecord {
	out := map[string]PriceRecord{}
	perM := func(n cost.Nanos) float64 { return float64(n) / 1000 } // n$/token → $/Mtok
	for _, p := range t.Models() {
		out[p.Model] = PriceRecord{
			Aliases: append([]string(nil), p.Aliases...),
			Input:   perM(p.Standard.Input), Output: perM(p.Standard.Output),
			CacheWrite5m: perM(p.Standard.CacheWrite5m), CacheWrite1h: perM(p.Standard.CacheWrite1h),
			CacheRead: perM(p.Standard.CacheRead),
		}
	}
	return out
}

// ErrLimitsFile is wrapped by every LoadLimits error about the file's
// content (as opposed to I/O errors).
var ErrLimitsFile = errors.New("plan: invalid limits file")

// fileEntry decodes one (org, model) entry of either format: ours, or the
// original's {"callable","status","headers":{...},"error","service_tier"}.
type fileEntry struct {
	ModelLimits
	Headers  map[string]string `json:"headers"`
	Callable *bool             `json:"callable"`
}

type fileDoc struct {
	Limits
	Orgs map[string]map[string]fileEntry `json:"orgs"`
}

// LoadLimits reads a limits file: the format 'apidispatch probe' writes, or
// the original system's phase0_limits.json, whose entries hold the raw
// response headers (orgs → model → {status, headers, service_tier, error}).
// Limits and org ids are read from the headers; an absent header leaves its
// limit 0 (unknown). Orgs whose keys reach the same organisation id are
// listed in SharedOrgs. Errors about the content wrap ErrLimitsFile.
func LoadLimits(path string) (*Limits, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plan: limits file: %w", err)
	}
	l, err := ParseLimits(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

var dateSuffix = regexp.MustCompile(`-[0-9]{8}$`)

// ParseLimits is LoadLimits on the bytes of a file.
func ParseLimits(b []byte) (*Limits, error) {
	var doc fileDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLimitsFile, err)
	}
	if len(doc.Orgs) == 0 {
		return nil, fmt.Errorf("%w: no \"orgs\"", ErrLimitsFile)
	}
	l := doc.Limits
	if l.Batch != nil {
		if err := l.Batch.check(); err != nil {
			return nil, fmt.Errorf("%w: \"batch\": %w", ErrLimitsFile, err)
		}
	}
	l.Orgs = map[string]map[string]ModelLimits{}
	ids := map[string]string{}
	for k, v := range doc.Limits.OrgIDs {
		ids[k] = v
	}
	fromHeaders := false
	for on, models := range doc.Orgs {
		if on == "" {
			return nil, fmt.Errorf("%w: an org with an empty name", ErrLimitsFile)
		}
		l.Orgs[on] = map[string]ModelLimits{}
		for model, e := range models {
			if model == "" {
				return nil, fmt.Errorf("%w: org %s: a model with an empty name", ErrLimitsFile, on)
			}
			m := e.ModelLimits
			if e.Headers != nil {
				fromHeaders = true
				m = fromPhase0(e)
			}
			for _, v := range []int64{m.RPM, m.ITPM, m.OTPM, m.TPM, m.Remaining.Requests, m.Remaining.InputTokens, m.Remaining.OutputTokens, m.Remaining.Tokens} {
				if v < 0 {
					return nil, fmt.Errorf("%w: org %s, model %s: negative limit %d", ErrLimitsFile, on, model, v)
				}
			}
			if m.Pool == "" {
				m.Pool = string(PoolOf(model))
			}
			if m.OrgID != "" && ids[on] == "" {
				ids[on] = m.OrgID
			}
			l.Orgs[on][model] = m
		}
	}
	if len(ids) > 0 {
		l.OrgIDs = ids
	}
	if fromHeaders && l.Source == "" {
		l.Source = "phase0_limits.json"
	}
	if l.Format == "" && fromHeaders {
		l.Format = "phase0"
	}
	l.SharedOrgs = sharedOrgs(ids)
	l.OrgsDistinctAdditive = len(l.SharedOrgs) == 0
	return &l, nil
}

// fromPhase0 reads an entry of the original's file from its raw headers.
func fromPhase0(e fileEntry) ModelLimits {
	h := http.Header{}
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	rl := anthropic.ParseRateLimits(h)
	m := ModelLimits{Status: e.Status, ServiceTier: e.ServiceTier, OrgID: rl.OrganizationID, Error: e.Error}
	if m.Status == 0 && e.Callable != nil && *e.Callable {
		m.Status = http.StatusOK
	}
	// A limit header counts even without its -remaining.
	m.RPM = headerInt(h, anthropic.HeaderRequestsLimit)
	m.ITPM = headerInt(h, anthropic.HeaderInputLimit)
	m.OTPM = headerInt(h, anthropic.HeaderOutputLimit)
	m.TPM = headerInt(h, anthropic.HeaderTokensLimit)
	m.Remaining = Remaining{
		Requests: rl.Requests.Remaining, InputTokens: rl.Input.Remaining,
		OutputTokens: rl.Output.Remaining, Tokens: rl.Tokens.Remaining,
	}
	if len(m.Error) > 300 {
		m.Error = m.Error[:300] + "…"
	}
	return m
}

// headerInt reads an integer header (0 when absent or malformed).
func headerInt(h http.Header, name string) int64 {
	v, err := strconv.ParseInt(strings.TrimSpace(h.Get(name)), 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// sharedOrgs groups org names by organisation id; groups of two or more
// are returned, each sorted, ordered by their first name.
func sharedOrgs(ids map[string]string) [][]string {
	by := map[string][]string{}
	for name, id := range ids {
		if id != "" {
			by[id] = append(by[id], name)
		}
	}
	var out [][]string
	for _, names := range by {
		if len(names) > 1 {
			sort.Strings(names)
			out = append(out, names)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// OrgNames returns the org names of the file, sorted.
func (l *Limits) OrgNames() []string {
	names := make([]string, 0, len(l.Orgs))
	for n := range l.Orgs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// For returns the limits org reported for model: the entry of model itself,
// else of the same model without its date suffix (or with it), else of
// another model of the same rate-limit pool (they share one limit),
// preferring a usable probe. ok is false when the file has nothing for the
// org's pool.
func (l *Limits) For(orgName, model string) (m ModelLimits, from string, ok bool) {
	if l == nil {
		return ModelLimits{}, "", false
	}
	ms := l.Orgs[orgName]
	if len(ms) == 0 {
		return ModelLimits{}, "", false
	}
	if m, ok := ms[model]; ok {
		return m, model, true
	}
	base := dateSuffix.ReplaceAllString(model, "")
	for _, name := range sortedKeys(ms) {
		if dateSuffix.ReplaceAllString(name, "") == base {
			return ms[name], name, true
		}
	}
	pool := PoolOf(model)
	found := false
	for _, name := range sortedKeys(ms) {
		e := ms[name]
		if anthropic.Pool(e.Pool) != pool && PoolOf(name) != pool {
			continue
		}
		if !found || (!m.Usable() && e.Usable()) {
			m, from, found = e, name, true
		}
	}
	return m, from, found
}

// PoolOf is the rate-limit pool of model, of either provider: an OpenAI
// model's own pool ("openai:<model>", its limits are per model), else the
// Anthropic pool.
func PoolOf(model string) anthropic.Pool {
	if IsOpenAIModel(model) {
		return upstream.OpenAI.PoolOf(model)
	}
	return anthropic.PoolOf(model)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Marshal returns the file's JSON, indented, with a final newline.
func (l *Limits) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
