package plan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/upstream"
)

// DefaultProbeModels are probed when no models are given: one model of each
// current rate-limit pool (Sonnet 4.x, Haiku 4.5, Opus 4.x, Sonnet 5,
// Opus 5). Models of one pool share one limit, so one probe a pool is
// enough.
var DefaultProbeModels = []string{
	"claude-sonnet-4-5-20250929",
	"claude-haiku-4-5-20251001",
	"claude-opus-4-8",
	"claude-sonnet-5",
	"claude-opus-5",
}

// DefaultOpenAIProbeModels are probed on OpenAI orgs when the models
// given name none of OpenAI's: OpenAI's limits are per model, so these are
// the judge models most used, each its own pool.
var DefaultOpenAIProbeModels = []string{"gpt-4.1-mini", "gpt-4.1", "gpt-5-mini", "o4-mini"}

// probeConcurrency bounds the probes in flight at once.
const probeConcurrency = 8

// ProbeConfig configures Probe.
type ProbeConfig struct {
	Orgs    []org.Org
	BaseURL string // "" is https://api.anthropic.com
	// Models are probed on each org of their provider (an OpenAI model
	// on the OpenAI orgs, a Claude model on the Anthropic ones). nil:
	// DefaultProbeModels; a provider none of whose models is given takes
	// its defaults (DefaultOpenAIProbeModels).
	Models []string
	// Prices prices each probe from its usage; PricesSource names the
	// table in the limits file ("embedded" or a path).
	Prices       *cost.Table
	PricesSource string
	// Client defaults to a client with a 60 s timeout.
	Client *http.Client
	// WrapTransport, when set, wraps the client's transport; 'probe
	// --debug-http' uses it to write the headers of every exchange.
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// Now is when the probe ran (recorded in the file).
	Now time.Time
}

// ProbeCall is one probe request's outcome.
type ProbeCall struct {
	Org, Model string
	Limits     ModelLimits
	// Usage of a 200 (OpenAIUsage for an OpenAI org's); Cost from it
	// when the model has a price (CostKnown).
	Usage       anthropic.Usage
	OpenAIUsage *openai.Usage
	Cost        cost.Nanos
	CostKnown   bool
	// Err is a transport failure (no HTTP response).
	Err string
}

// probeBody is the smallest request of p: one "hi", one output token
// (max_tokens, or an OpenAI chat completion's max_completion_tokens).
func probeBody(p *upstream.Provider, model string) []byte {
	limit := "max_tokens"
	if p == upstream.OpenAI {
		limit = "max_completion_tokens"
	}
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		limit:      1,
		"messages": []map[string]string{{"role": "user", "content": "hi"}},
	})
	return b
}

// IsOpenAIModel reports whether model is an OpenAI model: one of the
// OpenAI price table, or of an OpenAI model family (gpt-…, o1, o3 …).
func IsOpenAIModel(model string) bool {
	if _, err := cost.OpenAI().Lookup(model); err == nil {
		return true
	}
	return upstream.OpenAI.Family(model) != upstream.FamilyOpenAI
}

// modelsFor splits models by provider: each provider's own, or its
// defaults when models names none of them.
func modelsFor(models []string) map[*upstream.Provider][]string {
	out := map[*upstream.Provider][]string{}
	for _, m := range models {
		p := upstream.Anthropic
		if IsOpenAIModel(m) {
			p = upstream.OpenAI
		}
		out[p] = append(out[p], m)
	}
	if len(out[upstream.Anthropic]) == 0 {
		out[upstream.Anthropic] = DefaultProbeModels
	}
	if len(out[upstream.OpenAI]) == 0 {
		out[upstream.OpenAI] = DefaultOpenAIProbeModels
	}
	return out
}

// Probe sends one max_tokens 1 request per org × model of the org's
// provider (an OpenAI org a chat completion with max_completion_tokens 1)
// and returns the
// limits file they make: each (org, model)'s rate limits, remaining,
// status, organisation id and service tier, the price table, the groups of
// orgs that reach one organisation (their limits do not add), and every
// call's cost from its usage. A probe answered with an error (a 429, a 404
// for a model the org cannot use, a 401 for a bad key) is recorded as that
// model's status, not returned as an error; a transport failure is retried
// twice and then recorded with status 0. Up to 8 probes run at once.
func Probe(ctx context.Context, cfg ProbeConfig) (*Limits, []ProbeCall, error) {
	if len(cfg.Orgs) == 0 {
		return nil, nil, errors.New("plan: probe: no orgs")
	}
	byProvider := modelsFor(cfg.Models)
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = "https://api.anthropic.com"
	}
	client := apihttp.Guard(cfg.Client)
	if client == nil {
		client = newClient()
		defer client.CloseIdleConnections()
	}
	if cfg.WrapTransport != nil {
		c := *client
		c.Transport = cfg.WrapTransport(c.Transport)
		client = &c
	}
	prices := cfg.Prices
	if prices == nil {
		prices = cost.Default()
	}
	calls := make([][]ProbeCall, len(cfg.Orgs))
	speeds := make([][]float64, len(cfg.Orgs))
	sem := make(chan struct{}, probeConcurrency)
	var wg sync.WaitGroup
	for i, o := range cfg.Orgs {
		models := byProvider[upstream.For(o)]
		calls[i] = make([]ProbeCall, len(models))
		speeds[i] = make([]float64, len(models))
		for j, m := range models {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				calls[i][j], speeds[i][j] = probeOne(ctx, client, base, o, m, prices)
			})
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}

	l := &Limits{
		Format: LimitsFormat, Orgs: map[string]map[string]ModelLimits{}, OrgIDs: map[string]string{},
		ProbedAt: cfg.Now.UTC(), BaseURL: base, Source: "probe",
		PricesSource: cfg.PricesSource, Prices: PriceRecords(prices),
	}
	if l.PricesSource == "" {
		l.PricesSource = "embedded"
	}
	var all []ProbeCall
	for i, o := range cfg.Orgs {
		l.Orgs[o.Name] = map[string]ModelLimits{}
		for _, c := range calls[i] {
			l.Orgs[o.Name][c.Model] = c.Limits
			if c.Limits.OrgID != "" && l.OrgIDs[o.Name] == "" {
				l.OrgIDs[o.Name] = c.Limits.OrgID
			}
			l.ProbeCostNanos += c.Cost
			switch {
			case c.Err != "":
				l.Notes = append(l.Notes, fmt.Sprintf("%s/%s: no response: %s", o.Name, c.Model, c.Err))
			case c.Limits.Status != http.StatusOK:
				l.Notes = append(l.Notes, fmt.Sprintf("%s/%s: HTTP %d %s", o.Name, c.Model, c.Limits.Status, c.Limits.Error))
			}
			all = append(all, c)
		}
		for _, k := range speeds[i] {
			if k > 0 {
				l.SpeedFactor = k
			}
		}
	}
	l.ProbeCostUSD = usdF(l.ProbeCostNanos)
	l.SharedOrgs = sharedOrgs(l.OrgIDs)
	l.OrgsDistinctAdditive = len(l.SharedOrgs) == 0
	for _, g := range l.SharedOrgs {
		l.Notes = append(l.Notes, fmt.Sprintf("orgs %s reach the same organisation %s: their limits do not add", strings.Join(g, ", "), l.OrgIDs[g[0]]))
	}
	return l, all, nil
}

// probeOne sends one probe; speed is the x-sim-speed-factor header (0 if absent).
func probeOne(ctx context.Context, client *http.Client, base string, o org.Org, model string, prices *cost.Table) (c ProbeCall, speed float64) {
	p := upstream.For(o)
	c = ProbeCall{Org: o.Name, Model: model}
	c.Limits.Pool = string(p.PoolOf(model))
	c.Limits.KeyFingerprint = o.Key.Fingerprint()
	body := probeBody(p, model)
	var resp *http.Response
	var b []byte
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+p.Endpoint(), bytes.NewReader(body))
		if err != nil {
			c.Err = err.Error()
			return c, 0
		}
		p.SetHeaders(req.Header, o, true)
		resp, err = client.Do(req)
		if err == nil {
			b, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
		}
		retry := err != nil || resp.StatusCode >= 500
		if !retry || attempt == 3 || ctx.Err() != nil {
			if err != nil {
				c.Err = scrub(err.Error(), o.Key)
				return c, 0
			}
			break
		}
		wait := time.Second
		if resp != nil {
			if d, ok := anthropic.ParseRetryAfter(resp.Header, time.Now()); ok {
				wait = min(d, 10*time.Second)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	if v, err := strconv.ParseFloat(strings.TrimSpace(resp.Header.Get("x-sim-speed-factor")), 64); err == nil && v > 0 {
		speed = v
	}
	if p == upstream.OpenAI {
		probeOpenAI(&c, resp, b)
		return c, speed
	}
	rl := anthropic.ParseRateLimits(resp.Header)
	m := &c.Limits
	m.Status = resp.StatusCode
	m.OrgID = rl.OrganizationID
	// A limit header counts even without its -remaining.
	m.RPM = headerInt(resp.Header, anthropic.HeaderRequestsLimit)
	m.ITPM = headerInt(resp.Header, anthropic.HeaderInputLimit)
	m.OTPM = headerInt(resp.Header, anthropic.HeaderOutputLimit)
	m.TPM = headerInt(resp.Header, anthropic.HeaderTokensLimit)
	m.Remaining = Remaining{Requests: rl.Requests.Remaining, InputTokens: rl.Input.Remaining, OutputTokens: rl.Output.Remaining, Tokens: rl.Tokens.Remaining}
	if resp.StatusCode != http.StatusOK {
		m.Error = errorText(b)
		return c, speed
	}
	var msg anthropic.Message
	if err := json.Unmarshal(b, &msg); err != nil {
		m.Error = "unreadable 200 body: " + err.Error()
		return c, speed
	}
	c.Usage = msg.Usage
	m.ServiceTier = msg.Usage.ServiceTier
	if n, err := prices.Cost(model, msg.Usage, false); err == nil {
		c.Cost, c.CostKnown = n, true
		m.CostNanos = n
	}
	return c, speed
}

// probeOpenAI reads an OpenAI org's probe answer into c: its
// x-ratelimit-* limits (requests → RPM, tokens → TPM: one bucket of
// prompt and completion tokens together, so ITPM and OTPM stay unknown),
// what remained, the openai-organization id, and for a 200 the service
// tier and the cost from its usage at the OpenAI price table.
func probeOpenAI(c *ProbeCall, resp *http.Response, b []byte) {
	m := &c.Limits
	m.Status = resp.StatusCode
	rl := openai.ParseRateLimits(resp.Header, time.Now())
	m.OrgID = rl.Organization
	m.RPM = headerInt(resp.Header, openai.HeaderRequestsLimit)
	m.TPM = headerInt(resp.Header, openai.HeaderTokensLimit)
	m.Remaining = Remaining{Requests: rl.Requests.Remaining, Tokens: rl.Tokens.Remaining}
	if resp.StatusCode != http.StatusOK {
		m.Error = errorText(b)
		return
	}
	var cc openai.ChatCompletion
	if err := json.Unmarshal(b, &cc); err != nil || cc.Usage == nil {
		m.Error = "unreadable 200 body: not a chat completion with usage"
		return
	}
	c.OpenAIUsage = cc.Usage
	m.ServiceTier = cc.ServiceTier
	if n, err := cost.OpenAI().CostTier(c.Model, *cc.Usage, cc.ServiceTier, false); err == nil {
		c.Cost, c.CostKnown = n, true
		m.CostNanos = n
	}
}

// scrub removes the key from a message, in case a transport error quotes
// a request header.
func scrub(s string, k org.Key) string {
	if sec := k.Reveal(); sec != "" {
		s = strings.ReplaceAll(s, sec, k.String())
	}
	return s
}

// SortedCalls orders probe calls by org, then model.
func SortedCalls(calls []ProbeCall) []ProbeCall {
	out := append([]ProbeCall(nil), calls...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Org != out[j].Org {
			return out[i].Org < out[j].Org
		}
		return out[i].Model < out[j].Model
	})
	return out
}
