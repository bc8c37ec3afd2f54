package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/ratelimit"
	"github.com/apidispatch/apidispatch/workload"
)

// A Provider is everything the upstream layer knows of one API: how a
// request is addressed and authenticated, how an answer is classified
// into the one outcome every route acts on (anthropic.Outcome), how its
// rate-limit headers feed the gate's bucket mirrors, how its usage is
// counted and priced, the worst case a request can cost, and the rate
// pool and cap family of a model. Every route (the engine of run, the
// gateway's requests, the batch routes) takes these from the org's
// Provider (For), so a second API is a value here, not a second copy of
// a route. The attempt itself (Begin, Finish, Send) stays one
// implementation, parameterised by the provider's classifier.
type Provider struct {
	p provider
}

type provider interface {
	name() string
	endpoint() string
	setHeaders(h http.Header, o org.Org, hasBody bool)
	classify(status int, h http.Header, body []byte, err error, now time.Time) (anthropic.Outcome, *Usage)
	limits(h http.Header, now time.Time) anthropic.RateLimits
	requestID(h http.Header) string
	demand(it Item) gate.Demand
	actual(u *Usage, it Item) ratelimit.Need
	cost(prices *cost.Table, model string, u *Usage, batch bool) (cost.Nanos, error)
	worstCase(prices *cost.Table, it Item, body []byte, batch bool) (cost.Nanos, error)
	pool(model string) anthropic.Pool
	family(model string) string
}

// The providers.
var (
	Anthropic = &Provider{anthropicProvider{}}
	OpenAI    = &Provider{openaiProvider{}}
)

// For is the provider of o's key.
func For(o org.Org) *Provider { return Named(o.ProviderName()) }

// Named is the provider called name ("" is Anthropic), or nil when none is.
func Named(name string) *Provider {
	switch name {
	case "", org.Anthropic:
		return Anthropic
	case org.OpenAI:
		return OpenAI
	}
	return nil
}

// OfPool is the provider whose model pool is pool (PoolOf).
func OfPool(pool anthropic.Pool) *Provider {
	if strings.HasPrefix(string(pool), openaiPoolPrefix) {
		return OpenAI
	}
	return Anthropic
}

// Name is the provider's name, as org.Org.Provider spells it.
func (p *Provider) Name() string { return p.p.name() }

// Endpoint is the path of the provider's one-request endpoint:
// /v1/messages or /v1/chat/completions.
func (p *Provider) Endpoint() string { return p.p.endpoint() }

// SetHeaders sets the headers that authenticate a request with o's key
// (Anthropic: x-api-key and anthropic-version; OpenAI: Authorization
// Bearer and, when o names them, OpenAI-Organization and OpenAI-Project),
// and the JSON content type when hasBody.
func (p *Provider) SetHeaders(h http.Header, o org.Org, hasBody bool) { p.p.setHeaders(h, o, hasBody) }

// Classify maps one attempt's answer to the common outcome, and the
// usage of a success (nil when it reported none).
func (p *Provider) Classify(status int, h http.Header, body []byte, err error, now time.Time) (anthropic.Outcome, *Usage) {
	return p.p.classify(status, h, body, err, now)
}

// Limits reads an answer's rate-limit headers, received at now, into the
// shape the gate's bucket mirrors read (see the OpenAI mapping on
// openaiProvider.limits).
func (p *Provider) Limits(h http.Header, now time.Time) anthropic.RateLimits {
	return p.p.limits(h, now)
}

// RequestID is the answer's request id (request-id, x-request-id).
func (p *Provider) RequestID(h http.Header) string { return p.p.requestID(h) }

// Demand is what a lane is asked to admit for it.
func (p *Provider) Demand(it Item) gate.Demand { return p.p.demand(it) }

// Cost prices usage u of model (prices is the Anthropic table; OpenAI
// models are priced by cost.OpenAI()), at the batch rates when batch.
func (p *Provider) Cost(prices *cost.Table, model string, u *Usage, batch bool) (cost.Nanos, error) {
	if u == nil {
		return 0, fmt.Errorf("upstream: no usage to price")
	}
	return p.p.cost(prices, model, u, batch)
}

// WorstCase is the most it can cost, at every multiplier its body asks
// for (body nil: not read, so at every multiplier): the one worst case of
// every route for this provider. An unpriceable request is an error.
func (p *Provider) WorstCase(prices *cost.Table, it Item, body []byte, batch bool) (cost.Nanos, error) {
	return p.p.worstCase(prices, it, body, batch)
}

// PoolOf is the rate-limit pool of model: the lanes of one pool share a
// cap per key. OpenAI's limits are per model, so each model is a pool
// ("openai:<model>", a dated snapshot with its model).
func (p *Provider) PoolOf(model string) anthropic.Pool { return p.p.pool(model) }

// Family is model's cap family, the key of a caps table (DefaultCaps).
func (p *Provider) Family(model string) string { return p.p.family(model) }

// CapFor is the polite cap of model: caps' value for its family when
// positive, else DefaultCaps'.
func (p *Provider) CapFor(caps map[string]int, model string) int {
	f := p.Family(model)
	if v, ok := caps[f]; ok && v > 0 {
		return v
	}
	if v := DefaultCaps[f]; v > 0 {
		return v
	}
	return DefaultCaps["other"]
}

// Feedback is what an attempt of it with outcome o teaches its lane: the
// rate limits of its answer's headers h (nil: no answer), read at, and
// for a success with usage u (nil: none known) what it drew from the
// buckets and its cost c.
func (p *Provider) Feedback(o anthropic.Outcome, h http.Header, at time.Time, u *Usage, it Item, c cost.Nanos) gate.Feedback {
	fb := gate.Feedback{Outcome: o}
	if h != nil {
		fb.Limits = p.Limits(h, at)
	}
	if u != nil {
		fb.Billed = true
		fb.Actual = p.p.actual(u, it)
		fb.Cost = c
	}
	return fb
}

// Item is what the upstream layer needs of one request to admit, bound
// and account it, whatever its route.
type Item struct {
	Model string
	// EstInput is the local estimate of its input tokens; Length the
	// bytes of its line (a token is at least a byte, so it bounds them).
	EstInput, Length int64
	// MaxTokens is its output limit per choice: Anthropic's max_tokens,
	// OpenAI's max_completion_tokens (else max_tokens; 0 when it sets
	// neither, and the model's own maximum applies).
	MaxTokens int64
	// Choices is OpenAI's n (0 means 1).
	Choices int64
}

// Usage is a success's usage as every route counts it, with the
// provider's own for pricing.
type Usage struct {
	// Input is the uncached input; CacheRead the input read from the
	// prompt cache; CacheWrite the input written to it (Anthropic);
	// Output every output token, reasoning included; Reasoning those of
	// Output spent reasoning (OpenAI).
	Input, CacheRead, CacheWrite, Output, Reasoning int64
	Anthropic                                       *anthropic.Usage
	OpenAI                                          *openai.Usage
	// Tier is the service tier that served an OpenAI request (its
	// answer's service_tier), which its rates depend on.
	Tier string
}

// --- Anthropic ---------------------------------------------------------------

type anthropicProvider struct{}

func (anthropicProvider) name() string     { return org.Anthropic }
func (anthropicProvider) endpoint() string { return "/v1/messages" }

func (anthropicProvider) setHeaders(h http.Header, o org.Org, hasBody bool) {
	anthropic.SetHeaders(h, o.Key, hasBody)
}

func (anthropicProvider) classify(status int, h http.Header, body []byte, err error, now time.Time) (anthropic.Outcome, *Usage) {
	o := anthropic.Classify(status, h, body, err, now)
	if o.Message == nil {
		return o, nil
	}
	u := o.Message.Usage
	return o, &Usage{Input: u.InputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens,
		Output: u.OutputTokens, Anthropic: &u}
}

func (anthropicProvider) limits(h http.Header, _ time.Time) anthropic.RateLimits {
	return anthropic.ParseRateLimits(h)
}

func (anthropicProvider) requestID(h http.Header) string { return h.Get(anthropic.HeaderRequestID) }

func (anthropicProvider) demand(it Item) gate.Demand {
	return gate.Demand{EstInput: it.EstInput, MaxTokens: it.MaxTokens}
}

func (anthropicProvider) actual(u *Usage, _ Item) ratelimit.Need {
	return ratelimit.Need{Requests: 1, Input: float64(u.Input + u.CacheWrite), Output: float64(u.Output)}
}

func (anthropicProvider) cost(prices *cost.Table, model string, u *Usage, batch bool) (cost.Nanos, error) {
	if u.Anthropic == nil {
		return 0, fmt.Errorf("upstream: not an Anthropic usage")
	}
	return prices.Cost(model, *u.Anthropic, batch)
}

func (anthropicProvider) worstCase(prices *cost.Table, it Item, body []byte, batch bool) (cost.Nanos, error) {
	// Tokens never outnumber bytes, so the line's length bounds the input.
	b := cost.Bound{Model: it.Model, Input: max(it.EstInput, it.Length), MaxTokens: it.MaxTokens, Batch: batch,
		CacheWrite: cost.CacheWrite1h, GeoUS: true}
	if body != nil {
		b = workload.BoundOf(it.Model, body, it.MaxTokens, batch)
		b.Input = max(b.Input, it.EstInput)
	}
	return prices.WorstCase(b)
}

func (anthropicProvider) pool(model string) anthropic.Pool { return anthropic.PoolOf(model) }
func (anthropicProvider) family(model string) string       { return anthropic.Family(model) }

// --- OpenAI ------------------------------------------------------------------

type openaiProvider struct{}

// openaiPoolPrefix starts every OpenAI pool's name.
const openaiPoolPrefix = "openai:"

func (openaiProvider) name() string     { return org.OpenAI }
func (openaiProvider) endpoint() string { return "/v1/chat/completions" }

func (openaiProvider) setHeaders(h http.Header, o org.Org, hasBody bool) {
	h.Set(openai.HeaderAuthorization, "Bearer "+o.Key.Reveal())
	if o.Organization != "" {
		h.Set(openai.HeaderOrganization, o.Organization)
	}
	if o.Project != "" {
		h.Set(openai.HeaderProject, o.Project)
	}
	if hasBody {
		h.Set("content-type", "application/json")
	}
}

// classify maps openai.Classify's outcome onto the common one: the kinds
// and scopes have the same meaning; the two 429s stay apart (a rate limit
// is retryable and RateLimited, insufficient_quota stops every lane of
// the org, with a reason that says the org's billing, not the request, is
// the problem); the local error types share their names, so that
// MayHaveBilled reads a cut 2xx or a lost connection alike.
func (openaiProvider) classify(status int, h http.Header, body []byte, err error, now time.Time) (anthropic.Outcome, *Usage) {
	x := openai.Classify(status, h, body, err, now)
	o := anthropic.Outcome{Status: x.Status, ErrorType: x.ErrorType, Reason: org.Scrub(x.Reason),
		RetryAfter: x.RetryAfter, HasRetryAfter: x.HasRetryAfter, RateLimited: x.RateLimited}
	switch x.Kind {
	case openai.Success:
		o.Kind = anthropic.Success
	case openai.Retryable:
		o.Kind = anthropic.Retryable
	case openai.Terminal:
		o.Kind = anthropic.Terminal
	case openai.LaneFatal:
		o.Kind, o.Scope = anthropic.LaneFatal, anthropic.ScopeLane
		if x.Scope == openai.ScopeOrg {
			o.Scope = anthropic.ScopeOrg
		}
	}
	switch x.ErrorType {
	case openai.ErrTypeTruncated:
		o.ErrorType = anthropic.ErrTypeTruncated
	case openai.ErrTypeNotCompletion:
		o.ErrorType = anthropic.ErrTypeNotMessage
	case openai.ErrTypeConnection:
		o.ErrorType = anthropic.ErrTypeConnection
	}
	if x.Quota {
		o.Reason = "the OpenAI organisation's quota is used up (billing: add credit or raise its limit); its other keys' work goes to other orgs: " + o.Reason
	}
	if x.Kind != openai.Success || x.Completion == nil || x.Completion.Usage == nil {
		return o, nil
	}
	return o, OpenAIUsage(*x.Completion.Usage, x.Completion.ServiceTier)
}

// limits maps OpenAI's x-ratelimit-* headers onto the gate's mirrors.
// OpenAI keeps two buckets per organisation (and project) and model:
// requests per minute, and tokens per minute counting a request's prompt
// and its completion together. The tokens bucket is charged when a
// request is admitted, with its prompt and, when it sets one, its whole
// max_completion_tokens × n (a request without one pays its completion
// when it ends). So:
//
//   - requests → Requests, as for Anthropic;
//   - tokens → Input, the mirror's bucket charged at admission (what a
//     request is expected to draw there is Demand's EstInput: its prompt
//     estimate plus the completion charged at admission), and Tokens, for
//     whoever reads the combined limit;
//   - Output is absent: no second token bucket exists, and the mirror
//     keeps none.
//
// The organisation is the openai-organization header.
func (openaiProvider) limits(h http.Header, now time.Time) anthropic.RateLimits {
	x := openai.ParseRateLimits(h, now)
	tok := anthropic.Limit(x.Tokens)
	return anthropic.RateLimits{Requests: anthropic.Limit(x.Requests), Tokens: tok, Input: tok, OrganizationID: x.Organization}
}

func (openaiProvider) requestID(h http.Header) string { return h.Get(openai.HeaderRequestID) }

// charged is the completion the tokens bucket is charged at admission:
// max × n when the request sets a maximum, else none.
func (it Item) charged() int64 { return it.MaxTokens * max(it.Choices, 1) }

func (openaiProvider) demand(it Item) gate.Demand {
	// One token bucket, charged at admission (limits): all of it is
	// "input" to the mirror, and no output is expected by the mirrors; what
	// it may generate bounds how long it may run (a shared lane's grace).
	return gate.Demand{EstInput: it.EstInput + it.charged(), Generates: it.charged()}
}

func (openaiProvider) actual(u *Usage, it Item) ratelimit.Need {
	drawn := it.charged()
	if drawn == 0 {
		drawn = u.Output
	}
	return ratelimit.Need{Requests: 1, Input: float64(u.Input + u.CacheRead + drawn)}
}

func (openaiProvider) cost(_ *cost.Table, model string, u *Usage, batch bool) (cost.Nanos, error) {
	if u.OpenAI == nil {
		return 0, fmt.Errorf("upstream: not an OpenAI usage")
	}
	return cost.OpenAI().CostTier(model, *u.OpenAI, u.Tier, batch)
}

// worstCase: every prompt token uncached (the input bounded by the larger
// of the estimate and the body's bytes), and for each of its n choices its
// max_completion_tokens (else max_tokens, else the model's maximum
// output), at the batch rates when batch, else at the dearest rates of
// the service tier its body asks for (priority's for "priority", or for a
// body not read).
func (openaiProvider) worstCase(_ *cost.Table, it Item, body []byte, batch bool) (cost.Nanos, error) {
	p, err := cost.OpenAI().Lookup(it.Model)
	if err != nil {
		return 0, err
	}
	in := max(it.EstInput, it.Length, int64(len(body))) + imageParts(body)*p.MaxImageTokens()
	out := it.MaxTokens
	if out <= 0 {
		out = p.MaxOutput
	}
	return cost.OpenAI().WorstCaseTier(it.Model, in, out, max(it.Choices, 1), serviceTier(body), batch)
}

// serviceTier is the service_tier a chat completion's body asks for (""
// when it sets none; cost.TierUnknown for a nil body, or one that cannot
// be read, which may ask for any).
func serviceTier(body []byte) string {
	if body == nil {
		return cost.TierUnknown
	}
	// Read whole, never by a byte search: JSON may spell the key with \u
	// escapes, and the API reads "service\u005ftier" as service_tier.
	var b struct {
		Tier *string `json:"service_tier"`
	}
	if json.Unmarshal(body, &b) != nil {
		return cost.TierUnknown
	}
	if b.Tier == nil {
		return ""
	}
	if *b.Tier == "fast" {
		return cost.TierPriority // the API's other name for priority
	}
	return *b.Tier
}

// imageParts is how many image parts the messages of a chat completion's
// body hold (0 for a body that is not one). Each is billed as an image,
// hundreds of tokens or more, however few bytes its URL takes, so the
// body's length alone does not bound its prompt.
func imageParts(body []byte) int64 {
	// A byte search for "image_url" would miss a part whose type is spelt
	// with \u escapes ("image\u005furl"), which the API reads as one.
	if !bytes.Contains(body, []byte("image_url")) && !bytes.Contains(body, []byte(`\u`)) {
		return 0
	}
	var b struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &b) != nil {
		return 0
	}
	var n int64
	for _, m := range b.Messages {
		var parts []struct {
			Type string `json:"type"`
		}
		if len(m.Content) == 0 || m.Content[0] != '[' || json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if p.Type == "image_url" {
				n++
			}
		}
	}
	return n
}

func (openaiProvider) pool(model string) anthropic.Pool {
	m := strings.ToLower(model)
	if p, err := cost.OpenAI().Lookup(m); err == nil {
		m = p.Model
	}
	return anthropic.Pool(openaiPoolPrefix + m)
}

// OpenAI cap families (the keys of a caps table, beside Anthropic's).
const (
	FamilyGPT     = "gpt"      // gpt-4.1, gpt-4o, gpt-5 …
	FamilyGPTMini = "gpt-mini" // their -mini and -nano models
	FamilyOSeries = "o-series" // the reasoning models o1, o3, o4-mini …
	FamilyOpenAI  = "openai-other"
)

func (openaiProvider) family(model string) string {
	m := strings.ToLower(model)
	switch {
	case strings.HasPrefix(m, "gpt-") && (strings.Contains(m, "-mini") || strings.Contains(m, "-nano")):
		return FamilyGPTMini
	case strings.HasPrefix(m, "gpt-"):
		return FamilyGPT
	case len(m) > 1 && m[0] == 'o' && m[1] >= '1' && m[1] <= '9':
		return FamilyOSeries
	}
	return FamilyOpenAI
}
