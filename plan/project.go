package plan

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// DefaultExpectOutput is the output tokens a request is expected to
// generate when nothing better is known (no --expect-output, no pilot): the
// expected output is min(max_tokens, DefaultExpectOutput). Short
// classification and judge replies run 50 to 110 tokens; a pilot measures
// the real figure.
const DefaultExpectOutput = 100

// InputBoundFactor multiplies the local input estimate to bound it: the
// estimate counts at least a token per four ASCII characters and a token per
// other character (up to 4 UTF-8 bytes), so four times it is at least the
// UTF-8 byte length of the text, and a tokenizer never makes more tokens
// than bytes. (Not a bound for PDF documents, whose data is capped in the
// estimate, nor for the tool-use system prompt the API adds with tools.)
const InputBoundFactor = 4

// countedBoundMargin is the margin the input bound allows an exact
// count_tokens figure, which the API documents as an estimate.
const countedBoundMargin = 1.10

// BaselineConcurrency is the fixed concurrency of the legacy arm (docs/design.md §22).
const BaselineConcurrency = 50

// rampS is the throughput a cap-bound lane loses to the dispatcher's
// warm-up: it starts at a quarter of its cap and reaches the cap in about
// six seconds, ∫(cap − limit)dt / cap ≈ 2.25 s of full-rate time.
const rampS = 2.25

// Input is what Project needs. Workload and Prices are required; every
// other field's zero value means "not known" and is documented with it.
type Input struct {
	// Workload is the validated request file (workload.Validate), or,
	// with a result cache, the part of it the cache does not answer.
	Workload *workload.Summary
	// Cached are the items the result cache answers (not in Workload).
	Cached Cached
	// Prices is the price table; every model of the workload must be in it.
	Prices *cost.Table
	// Orgs are the Anthropic org names the run will use, in order (the
	// first of orgs that share an organisation keeps its lanes). Empty:
	// the orgs of Limits with an Anthropic model, else one org "default".
	Orgs []string
	// OpenAIOrgs are the OpenAI org names, for the OpenAI items
	// (Workload.OpenAIModels). Empty: the orgs of Limits with an OpenAI
	// model, else one org "default".
	OpenAIOrgs []string
	// Caps are per-key concurrency caps by family ("sonnet", "haiku",
	// "opus", "other"); missing families take upstream.DefaultCaps.
	Caps map[string]int
	// Limits from 'apidispatch probe' (nil: unknown, lanes are cap-bound
	// only, and the projection says so).
	Limits *Limits
	// ExpectOutput is the expected output tokens per request (0: min(max_tokens,
	// DefaultExpectOutput)). A pilot's measurement wins over it.
	ExpectOutput int64
	// LatencyS is the mean latency of one request in API seconds (0: the
	// pilot's measurement, else DefaultLatencyS of the model and its
	// expected output).
	LatencyS float64
	// Pilot is what a pilot (or an earlier part of the run) measured; nil:
	// none. With a pilot, the projection is its exact spend plus the
	// projection of the items still pending.
	Pilot *PilotStats
	// Counts are count_tokens results (CountTokens); nil: local estimates.
	Counts *TokenCounts
	// Speed is the server's time compression K (the simulator's --speed);
	// 0 means 1. Wall-clock is projected in API seconds and also given at
	// speed K; a pilot's latencies, measured at K, are multiplied by K.
	Speed float64
	// Arms is how many times the workload is sent: 2 for an A/B (both arms
	// send every item); 0 means 1. Costs are totals over the arms; with 2,
	// the projection also covers the legacy baseline arm (BaselineOrg at
	// concurrency 50).
	Arms int
	// BaselineOrg is the org of the legacy arm; "" means the first org.
	BaselineOrg string
}

// Projection is the forecast of a run. It is plain data.
type Projection struct {
	// N is the number of items (per arm).
	N int64
	// Arms is how many times the workload is sent (1, or 2 for an A/B).
	Arms int
	// ExpectedCost, AllMaxTokens and WorstCase are totals over the arms;
	// the PerArm fields are one arm. Spent (a pilot's exact spend) is
	// included in all of them.
	ExpectedCost, AllMaxTokens, WorstCase cost.Nanos
	PerArmExpected, PerArmAllMax          cost.Nanos
	PerArmWorst                           cost.Nanos
	Spent                                 cost.Nanos
	// Done is how many items were already terminal (a pilot); they are in
	// Spent, and the rest of the projection covers N − Done items.
	Done int64
	// WallS is the projected wall-clock of one dispatcher arm in API
	// seconds; WallAtSpeedS is the same at the server's speed K.
	WallS, WallAtSpeedS float64
	Speed               float64
	// Models is the per-model breakdown, sorted by model id.
	Models []ModelProjection
	// Lanes are the dispatcher's lanes (org × pool), Pools their sums.
	Lanes []LaneProjection
	Pools []PoolProjection
	// Baseline is the legacy arm's single lane per pool (Arms == 2 only).
	Baseline      []LaneProjection
	BaselineWallS float64
	// Assumptions says, in words, every figure that was assumed rather than
	// measured.
	Assumptions []string
	// Cached are the items the result cache answers, outside N.
	Cached Cached
	// Routes are the sync, batch and auto routes side by side, set by
	// ProjectRoutes (nil until it is called).
	Routes *Routes
}

// Cached is what a result cache answers of an input without a request:
// Hits items, whose requests cost Saved when they were sent.
type Cached struct {
	Hits  int64
	Saved cost.Nanos
}

// ModelProjection is one model's share of a projection (one arm).
type ModelProjection struct {
	Model string
	// Provider is "openai" for an OpenAI model's items, "" for Anthropic's.
	Provider string
	Pool     string
	// N items of the model; Remaining of them are projected (N − done).
	N, Remaining int64
	// InputPerReq is the expected input tokens per request (all kinds);
	// InputSource says where it comes from. ITPMPerReq is the part that
	// counts against ITPM (cache reads do not).
	InputPerReq float64
	ITPMPerReq  float64
	InputSource string
	// OutputPerReq is the expected output tokens per request.
	OutputPerReq float64
	OutputSource string
	// MaxTokensPerReq is the mean max_tokens; InputBoundPerReq the bound
	// used for the worst case.
	MaxTokensPerReq  float64
	InputBoundPerReq float64
	// Rates are the per-token prices applied (long-context rates when the
	// rule applies).
	Rates cost.Rates
	// Costs of the remaining items of one arm.
	Expected, AllMaxTokens, WorstCase cost.Nanos
	// BatchRates, BatchExpected and BatchWorstCase are the same items and
	// tokens at the Message Batches rates of the price table (the batch
	// route; see ProjectRoutes).
	BatchRates                    cost.Rates
	BatchExpected, BatchWorstCase cost.Nanos
	// Arithmetic is the expected cost's formula with its numbers.
	Arithmetic string
	// CachePrefixed items mark a prompt-cache prefix, CacheWrites of them
	// projected to write it (promptcache.go).
	CachePrefixed, CacheWrites int64
	prefixUses                 [workload.PrefixUsesMax]int64
}

// Binding limits a lane can name.
const (
	BindCap         = "cap"         // polite concurrency cap ÷ latency
	BindRPM         = "rpm"         // requests per minute
	BindITPM        = "itpm"        // input tokens per minute ÷ input per request
	BindOTPM        = "otpm"        // output tokens per minute ÷ output per request
	BindUnavailable = "unavailable" // the probe got 401/403/404 or no answer: the lane cannot serve
	BindSameOrg     = "same_org"    // the key reaches an organisation another org already uses
)

// LaneProjection is one lane's ceiling. Rates are requests per minute; a
// limit term of 0 means the limit is unknown (not in the limits file).
type LaneProjection struct {
	Org  string
	Pool string
	Cap  int
	// LatencyS is the mean latency assumed, API seconds.
	LatencyS float64
	// CapRPM = Cap / LatencyS × 60; RPM the request limit; ITPMRPM =
	// ITPM / input per request; OTPMRPM = OTPM / output per request.
	CapRPM, RPM, ITPMRPM, OTPMRPM float64
	// CeilingRPM is the lowest of them, BindingLimit its name.
	CeilingRPM   float64
	BindingLimit string
	// Note explains an unusual lane (a 429 at the probe, a shared org).
	Note string
	// CacheWrites and CacheReads are the requests of this lane projected
	// to write and to read their prompt-cache prefix.
	CacheWrites, CacheReads int64
}

// PoolProjection sums a pool's lanes.
type PoolProjection struct {
	Pool       string
	N          int64   // items still to send in this pool (one arm)
	CeilingRPM float64 // sum of the lanes' ceilings
	WallS      float64 // N / ceiling + ramp-up + one latency, API seconds
	Arithmetic string
}

// Project forecasts the cost and wall-clock of sending in.Workload. It
// fails only on bad input: no workload, no prices, a model without a price.
func Project(in Input) (*Projection, error) {
	if in.Workload == nil || len(in.Workload.Models)+len(in.Workload.OpenAIModels) == 0 {
		return nil, errors.New("plan: no workload to project")
	}
	if in.Prices == nil {
		return nil, errors.New("plan: no price table")
	}
	arms := max(in.Arms, 1)
	speed := in.Speed
	if speed <= 0 {
		speed = 1
	}
	p := &Projection{N: in.Workload.N, Arms: arms, Speed: speed, Cached: in.Cached}
	note := func(format string, a ...any) { p.Assumptions = append(p.Assumptions, fmt.Sprintf(format, a...)) }

	pil := newPilotView(in)
	if pil != nil {
		p.Spent, p.Done = in.Pilot.Spent, pil.done
		note("%s", pil.describe())
	}

	// Per model.
	names := in.Workload.ModelNames()
	var expected, allMax, worst float64 // one arm, remaining items, nano-dollars
	for _, model := range names {
		ms := in.Workload.Models[model]
		price, err := in.Prices.Lookup(model)
		if err != nil {
			return nil, err
		}
		mp := ModelProjection{Model: model, Pool: string(anthropic.PoolOf(model)), N: ms.N, Remaining: ms.N}
		rem := ms // the items still to send
		if pil != nil {
			rem = pil.pending(model)
			mp.Remaining = rem.N
		}
		if ms.N > 0 {
			mp.MaxTokensPerReq = float64(ms.MaxTokens) / float64(ms.N)
		}
		estPer := 0.0
		if rem.N > 0 {
			mp.MaxTokensPerReq = float64(rem.MaxTokens) / float64(rem.N)
			estPer = float64(rem.EstInput) / float64(rem.N)
		} else if ms.N > 0 {
			estPer = float64(ms.EstInput) / float64(ms.N)
		}

		// Input per request, and how it splits into uncached, cache write
		// and cache read tokens.
		mix := usageMix{uncached: 1}
		mp.InputPerReq, mp.InputSource = estPer, "local estimate"
		mc, counted := in.Counts.model(model)
		if ms.Prefixed > 0 {
			k := orgCount(in)
			mix, mp.CacheWrites = promptCacheMix(ms, k)
			mp.CachePrefixed, mp.prefixUses = ms.Prefixed, ms.PrefixUses
			note("%s", describePromptCache(model, ms, k, mp.CacheWrites))
		}
		switch {
		case pil != nil && pil.ratio > 0:
			mp.InputPerReq = estPer * pil.ratio
			mp.InputSource = fmt.Sprintf("pilot: billed/estimated %.3f", pil.ratio)
			mix = pil.mix
		case counted && mc.Est > 0:
			r := float64(mc.Counted) / float64(mc.Est)
			mp.InputPerReq = estPer * r
			mp.InputSource = fmt.Sprintf("count_tokens on %d of %d items: counted/estimated %.3f", mc.Items, ms.N, r)
		}
		mp.ITPMPerReq = mp.InputPerReq * (mix.uncached + mix.write)

		// Output per request.
		switch {
		case pil != nil && pil.outPer > 0:
			mp.OutputPerReq = math.Min(mp.MaxTokensPerReq, pil.outPer)
			mp.OutputSource = fmt.Sprintf("pilot: %.1f measured", pil.outPer)
		case in.ExpectOutput > 0:
			mp.OutputPerReq = math.Min(mp.MaxTokensPerReq, float64(in.ExpectOutput))
			mp.OutputSource = fmt.Sprintf("--expect-output %d", in.ExpectOutput)
		default:
			mp.OutputPerReq = math.Min(mp.MaxTokensPerReq, DefaultExpectOutput)
			mp.OutputSource = fmt.Sprintf("default min(max_tokens, %d)", DefaultExpectOutput)
		}

		// Input bound for the worst case.
		mp.InputBoundPerReq = estPer * InputBoundFactor
		if counted && mc.All && mc.Items > 0 && rem.N > 0 {
			mp.InputBoundPerReq = math.Min(mp.InputBoundPerReq, float64(mc.Counted)/float64(mc.Items)*countedBoundMargin)
		}

		// The three costs at the sync rates, or at the Message Batches
		// rates (the same tokens; the table's batch rates).
		n := float64(rem.N)
		costs := func(batch bool) (r cost.Rates, e, a, w float64) {
			r = price.RatesFor(batch, int64(math.Round(mp.InputPerReq)))
			inCost := mp.InputPerReq * (mix.uncached*float64(r.Input) + mix.write*float64(r.CacheWrite5m) + mix.read*float64(r.CacheRead))
			e = n * (inCost + mp.OutputPerReq*float64(r.Output))
			a = n * (inCost + mp.MaxTokensPerReq*float64(r.Output))
			w = n * worstPerReq(price, ms, &mp, in.Workload.LongestLine, batch)
			return r, e, a, w
		}
		r, e, a, w := costs(false)
		mp.Rates = r
		rb, eb, _, wb := costs(true)
		mp.BatchRates, mp.BatchExpected, mp.BatchWorstCase = rb, nanos(eb), nanos(wb)
		mp.Expected, mp.AllMaxTokens, mp.WorstCase = nanos(e), nanos(a), nanos(w)
		mp.Arithmetic = fmt.Sprintf("%s × (%s input × %s/M + %s output × %s/M) = %s",
			numfmt.Commas(rem.N), tok(mp.InputPerReq), perM(r.Input), tok(mp.OutputPerReq), perM(r.Output), usd(mp.Expected))
		if mix.write > 0 || mix.read > 0 {
			mp.Arithmetic = fmt.Sprintf("%s × (%s input [%.0f%% uncached × %s/M, %.0f%% cache write × %s/M, %.0f%% cache read × %s/M] + %s output × %s/M) = %s",
				numfmt.Commas(rem.N), tok(mp.InputPerReq), mix.uncached*100, perM(r.Input), mix.write*100, perM(r.CacheWrite5m), mix.read*100, perM(r.CacheRead),
				tok(mp.OutputPerReq), perM(r.Output), usd(mp.Expected))
		}
		expected += e
		allMax += a
		worst += w
		p.Models = append(p.Models, mp)
	}
	for _, model := range sortedKeys(in.Workload.OpenAIModels) {
		mp, e, a, w, err := projectOpenAI(in, model, in.Workload.OpenAIModels[model])
		if err != nil {
			return nil, err
		}
		expected += e
		allMax += a
		worst += w
		p.Models = append(p.Models, mp)
	}
	if len(in.Workload.OpenAIModels) > 0 {
		note("OpenAI items: priced by the embedded OpenAI price table (standard tier; the Batch API at its batch rates), prompts uncached, the worst case at %d × the local estimate and every choice's max_completion_tokens (the model's maximum output when unset), at the priority-processing rates where the model has them (the dearest tier an item may ask for); lanes bound by their RPM and TPM, the TPM charged at admission with the prompt and max_completion_tokens × n", InputBoundFactor)
	}
	p.PerArmExpected = p.Spent + nanos(expected)
	p.PerArmAllMax = p.Spent + nanos(allMax)
	p.PerArmWorst = p.Spent + nanos(worst)
	// Arms beyond the first send every item again, the pilot's included.
	full := func(perArm cost.Nanos, rest float64) cost.Nanos {
		if arms == 1 {
			return perArm
		}
		return perArm + cost.Nanos(arms-1)*p.fullArm(rest)
	}
	p.ExpectedCost = full(p.PerArmExpected, expected)
	p.AllMaxTokens = full(p.PerArmAllMax, allMax)
	p.WorstCase = full(p.PerArmWorst, worst)

	if pil == nil {
		outSrc := fmt.Sprintf("min(max_tokens, %d) tokens (a default; pass --expect-output N or run a pilot to measure it)", DefaultExpectOutput)
		if in.ExpectOutput > 0 {
			outSrc = fmt.Sprintf("min(max_tokens, %d) tokens (--expect-output)", in.ExpectOutput)
		}
		note("expected output per request: %s", outSrc)
		if in.Counts == nil {
			note("input tokens: local estimate (about 4 characters a token; --count-tokens asks the API)")
		}
	}
	note("worst case: every request generates max_tokens and its input is at its upper bound (%d × the local estimate, or count_tokens + 10%% when every item was counted), at the uncached input price", InputBoundFactor)
	if len(names) > 1 && pil != nil {
		note("the pilot's output per request and input ratio are measured over all its models together and applied to each")
	}
	if len(names) > 1 {
		note("a model's expected output uses the mean max_tokens of its items, which can only overstate min(max_tokens, expected)")
	}

	project := newLaneProjector(in, p, note)
	project.lanes()
	if arms == 2 {
		project.baseline()
	}
	p.WallAtSpeedS = p.WallS / speed
	if speed != 1 {
		note("wall-clock in API seconds; at speed K=%g the same run takes %s", speed, dur(p.WallAtSpeedS))
	}
	return p, nil
}

// fullArm is the cost of an arm that sends every item: the remaining part
// scaled up by N / remaining (a pilot's items are in the other arm too).
func (p *Projection) fullArm(rest float64) cost.Nanos {
	remaining := p.N - p.Done
	if p.Done == 0 || remaining <= 0 {
		if remaining <= 0 && p.N > 0 {
			return p.Spent
		}
		return nanos(rest)
	}
	return nanos(rest * float64(p.N) / float64(remaining))
}

// nanos rounds a float nano-dollar amount up to whole nano-dollars.
func nanos(f float64) cost.Nanos {
	if f <= 0 || math.IsNaN(f) {
		return 0
	}
	if f >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return cost.Nanos(math.Ceil(f - 1e-6))
}

// usageMix splits input tokens into uncached input, cache writes and cache
// reads (fractions summing to 1).
type usageMix struct{ uncached, write, read float64 }

// DefaultLatencyS is the mean latency of one request in API seconds when
// nothing is measured, for a model and an expected output:
//
//	Sonnet (and other): 1.05 s + 14 ms per output token
//	Haiku:              0.60 s +  7 ms per output token
//	Opus:               1.60 s + 25 ms per output token
//
// Sonnet is calibrated on docs/design.md §24 Phase 1 n2500: 100 requests in
// flight at 3,070 requests/min is a mean of 1.95 s by Little's law, at
// max_tokens 64 (taken as all used) and about 70 output tokens a second.
// Haiku and Opus are scaled from the guesses there (Haiku p50 0.7–0.8 s,
// Opus 3–4 s); a pilot measures the real figure.
func DefaultLatencyS(model string, outputTokens float64) float64 {
	switch anthropic.Family(model) {
	case "haiku":
		return 0.60 + 0.007*outputTokens
	case "opus":
		return 1.60 + 0.025*outputTokens
	}
	return 1.05 + 0.014*outputTokens
}

// laneProjector computes lane ceilings and wall-clock.
type laneProjector struct {
	in   Input
	p    *Projection
	note func(string, ...any)
	orgs []string // the Anthropic pools' lanes' orgs
	// oaOrgs are the OpenAI pools' lanes' orgs.
	oaOrgs []string
	pools  []poolDemand
}

// poolDemand is what one pool asks of each of its lanes.
type poolDemand struct {
	pool     anthropic.Pool
	model    string // a representative model (the pool's largest)
	n        int64  // items to send (one arm)
	inPer    float64
	outPer   float64
	latencyS float64
	latSrc   string
	// prefixed items mark a cached prefix; prefixUses as ModelSummary's.
	prefixed   int64
	prefixUses [workload.PrefixUsesMax]int64
}

func newLaneProjector(in Input, p *Projection, note func(string, ...any)) *laneProjector {
	lp := &laneProjector{in: in, p: p, note: note}
	lp.orgs = lp.orgsOf(in.Orgs, false, len(in.Workload.Models) > 0)
	if len(in.Workload.OpenAIModels) > 0 {
		lp.oaOrgs = lp.orgsOf(in.OpenAIOrgs, true, true)
	}
	// Group models into pools.
	byPool := map[anthropic.Pool]*poolDemand{}
	var order []anthropic.Pool
	var biggest = map[anthropic.Pool]int64{}
	for _, m := range p.Models {
		pool := anthropic.Pool(m.Pool)
		d := byPool[pool]
		if d == nil {
			d = &poolDemand{pool: pool}
			byPool[pool] = d
			order = append(order, pool)
		}
		n := float64(m.Remaining)
		tot := float64(d.n) + n
		if tot > 0 {
			d.inPer = (d.inPer*float64(d.n) + m.ITPMPerReq*n) / tot
			d.outPer = (d.outPer*float64(d.n) + m.OutputPerReq*n) / tot
		}
		d.n += m.Remaining
		d.prefixed += m.CachePrefixed
		for i, u := range m.prefixUses {
			d.prefixUses[i] += u
		}
		if m.N > biggest[pool] || d.model == "" {
			biggest[pool], d.model = m.N, m.Model
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	pv := newPilotView(in)
	for _, pool := range order {
		d := byPool[pool]
		switch {
		case in.LatencyS > 0:
			d.latencyS, d.latSrc = in.LatencyS, "given"
		case pv != nil && pv.latencyS > 0:
			d.latencyS, d.latSrc = pv.latencyS, "pilot"
		default:
			d.latencyS, d.latSrc = DefaultLatencyS(d.model, d.outPer), "default"
		}
		lp.pools = append(lp.pools, *d)
	}
	return lp
}

// orgsOf is the orgs of a provider's lanes: given, else those of the
// limits file with a model of the provider, else one org "default"; said
// in the assumptions when used says the provider has items.
func (lp *laneProjector) orgsOf(given []string, openAI, used bool) []string {
	what := ""
	if openAI {
		what = "OpenAI "
	}
	orgs := append([]string(nil), given...)
	if len(orgs) == 0 && lp.in.Limits != nil {
		for _, o := range lp.in.Limits.OrgNames() {
			for m := range lp.in.Limits.Orgs[o] {
				if IsOpenAIModel(m) == openAI {
					orgs = append(orgs, o)
					break
				}
			}
		}
		if len(orgs) > 0 && used {
			lp.note("%sorgs: the %d orgs of the limits file (%v)", what, len(orgs), orgs)
		}
	}
	if len(orgs) == 0 {
		orgs = []string{"default"}
		if used {
			lp.note("%sorgs: none configured; projected for one org", what)
		}
	}
	return orgs
}

// orgsFor is the orgs whose lanes serve pool.
func (lp *laneProjector) orgsFor(pool anthropic.Pool) []string {
	if openAIPool(pool) {
		return lp.oaOrgs
	}
	return lp.orgs
}

// capFor is the polite cap of a model's family (of its provider).
func (lp *laneProjector) capFor(model string) int {
	if IsOpenAIModel(model) {
		return upstream.OpenAI.CapFor(lp.in.Caps, model)
	}
	return upstream.CapFor(lp.in.Caps, model)
}

// lane computes one lane's ceiling with concurrency c.
func (lp *laneProjector) lane(orgName string, d poolDemand, c int) LaneProjection {
	l := LaneProjection{Org: orgName, Pool: string(d.pool), Cap: c, LatencyS: d.latencyS}
	if d.latencyS > 0 {
		l.CapRPM = float64(c) / d.latencyS * 60
	}
	l.CeilingRPM, l.BindingLimit = l.CapRPM, BindCap
	ml, from, ok := lp.in.Limits.For(orgName, d.model)
	if !ok {
		return l
	}
	if !ml.Usable() {
		l.CeilingRPM, l.BindingLimit = 0, BindUnavailable
		l.Note = fmt.Sprintf("the probe of %s got HTTP %d %s", from, ml.Status, ml.Error)
		return l
	}
	if ml.Status == 429 {
		l.Note = fmt.Sprintf("the probe of %s got HTTP 429: others were drawing on this org's %s limits", from, d.pool)
	}
	try := func(v float64, name string) {
		if v > 0 && v < l.CeilingRPM {
			l.CeilingRPM, l.BindingLimit = v, name
		}
	}
	// A simulator at speed K reports K × the API's limits (per real
	// minute); the projection is in API time.
	k := 1.0
	if lp.in.Limits.SpeedFactor > 0 {
		k = lp.in.Limits.SpeedFactor
	}
	if ml.RPM > 0 {
		l.RPM = float64(ml.RPM) / k
		try(l.RPM, BindRPM)
	}
	if openAIPool(d.pool) {
		// One bucket of prompt and completion tokens, charged at
		// admission (d.inPer is that charge).
		if ml.TPM > 0 && d.inPer > 0 {
			l.ITPMRPM = float64(ml.TPM) / k / d.inPer
			try(l.ITPMRPM, BindTPM)
		}
		return l
	}
	if ml.ITPM > 0 && d.inPer > 0 {
		l.ITPMRPM = float64(ml.ITPM) / k / d.inPer
		try(l.ITPMRPM, BindITPM)
	}
	if ml.OTPM > 0 && d.outPer > 0 {
		l.OTPMRPM = float64(ml.OTPM) / k / d.outPer
		try(l.OTPMRPM, BindOTPM)
	}
	return l
}

// lanes fills p.Lanes, p.Pools and p.WallS.
func (lp *laneProjector) lanes() {
	if lp.in.Limits == nil {
		lp.note("no limits file: each lane is bound by its concurrency cap only (run 'apidispatch probe' and pass --limits for the orgs' rate limits)")
	}
	// The engine stops the lanes of an org whose key reaches an
	// organisation an earlier org already reached.
	sameAs := map[string]string{}
	if lp.in.Limits != nil {
		seen := map[string]string{}
		for _, o := range append(append([]string(nil), lp.orgs...), lp.oaOrgs...) {
			id := lp.in.Limits.OrgIDs[o]
			if id == "" {
				continue
			}
			if first, ok := seen[id]; ok {
				sameAs[o] = first
				lp.note("orgs %s and %s reach the same organisation (%s): limits do not add, so only %s's lanes are counted", first, o, id, first)
				continue
			}
			seen[id] = o
		}
	}
	lat := map[string]bool{}
	for _, d := range lp.pools {
		pp := PoolProjection{Pool: string(d.pool), N: d.n}
		orgs := lp.orgsFor(d.pool)
		for _, o := range orgs {
			l := lp.lane(o, d, lp.capFor(d.model))
			if first, ok := sameAs[o]; ok {
				l.CeilingRPM, l.BindingLimit = 0, BindSameOrg
				l.Note = "same organisation as " + first
			}
			lp.p.Lanes = append(lp.p.Lanes, l)
			pp.CeilingRPM += l.CeilingRPM
		}
		splitPromptCache(lp.p.Lanes[len(lp.p.Lanes)-len(orgs):], d.prefixed, d.prefixUses)
		pp.WallS, pp.Arithmetic = wall(d, pp.CeilingRPM, anyCapBound(lp.p.Lanes, d.pool))
		lp.p.Pools = append(lp.p.Pools, pp)
		lp.p.WallS = math.Max(lp.p.WallS, pp.WallS)
		if !lat[d.latSrc] {
			lat[d.latSrc] = true
			switch d.latSrc {
			case "default":
				lp.note("latency: %.2f s a request for %s (DefaultLatencyS: calibrated on docs/design.md §24, scaled by %s output tokens); a pilot measures it", d.latencyS, d.pool, tok(d.outPer))
			case "pilot":
				lp.note("latency: %.2f s a request, the pilot's mean (API seconds)", d.latencyS)
			}
		}
	}
	if k := lp.in.Limits; k != nil && k.SpeedFactor > 0 && k.SpeedFactor != 1 {
		lp.note("the limits file was probed on a simulator at speed K=%g, whose limits are K × the API's: divided by %g", k.SpeedFactor, k.SpeedFactor)
	}
	if lp.in.Limits != nil {
		lp.note("lanes use the full limits (alone on the org); with colleagues drawing on it the dispatcher leaves 15%% free")
	}
}

func anyCapBound(ls []LaneProjection, pool anthropic.Pool) bool {
	for _, l := range ls {
		if l.Pool == string(pool) && l.BindingLimit == BindCap {
			return true
		}
	}
	return false
}

// wall is a pool's wall-clock: its items at the pool's ceiling, plus the
// warm-up when a lane is cap-bound, plus one latency for the last wave.
func wall(d poolDemand, ceilingRPM float64, capBound bool) (float64, string) {
	if d.n == 0 {
		return 0, "nothing to send"
	}
	if ceilingRPM <= 0 {
		return math.Inf(1), fmt.Sprintf("%s items but no lane can serve %s", numfmt.Commas(d.n), d.pool)
	}
	s := float64(d.n) / ceilingRPM * 60
	arith := fmt.Sprintf("%s items ÷ %s req/min = %s", numfmt.Commas(d.n), numfmt.Commas(int64(math.Round(ceilingRPM))), dur(s))
	if capBound {
		s += rampS
		arith += fmt.Sprintf(" + %.2f s warm-up", rampS)
	}
	s += d.latencyS
	arith += fmt.Sprintf(" + %.2f s last wave = %s", d.latencyS, dur(s))
	return s, arith
}

// baseline projects the legacy arm: one org, one fixed concurrency of 50
// shared by every item, so pools (if a file mixes them) run one after the
// other in its slots.
func (lp *laneProjector) baseline() {
	o := lp.in.BaselineOrg
	if o == "" {
		o = lp.orgs[0]
	}
	total := 0.0
	for _, d := range lp.pools {
		l := lp.lane(o, d, BaselineConcurrency)
		lp.p.Baseline = append(lp.p.Baseline, l)
		w, _ := wall(d, l.CeilingRPM, false)
		total += w
	}
	lp.p.BaselineWallS = total
	lp.note("baseline arm: org %s alone at a fixed concurrency of %d (docs/design.md §22); SDK retries are not modelled", o, BaselineConcurrency)
}

// worstPerReq is the worst case of one of a model's requests on average,
// by cost.Table.WorstCase, the one worst case of every route: the input
// bound and max_tokens per request, the long-context rates if any one
// request could pass the threshold (the longest line is longer than it),
// and, for the share of the items whose params ask for them (ms), the
// dearest cache write and inference_geo "us" they hold.
func worstPerReq(price *cost.Price, ms workload.ModelSummary, mp *ModelProjection, longestLine int64, batch bool) float64 {
	b := cost.Bound{Model: mp.Model, Input: int64(math.Ceil(mp.InputBoundPerReq)), MaxTokens: int64(math.Ceil(mp.MaxTokensPerReq)), Batch: batch}
	if longestLine > 0 && price.RatesFor(batch, longestLine).Input > price.RatesFor(batch, b.Input).Input {
		b.LongContext = true
	}
	plain, err := price.WorstCase(b)
	if err != nil {
		return float64(cost.Unpriceable)
	}
	dearer := ms.GeoUS + ms.CacheWrite5m + ms.CacheWrite1h
	if dearer == 0 || ms.N == 0 {
		return float64(plain)
	}
	b.GeoUS = ms.GeoUS > 0
	switch {
	case ms.CacheWrite1h > 0:
		b.CacheWrite = cost.CacheWrite1h
	case ms.CacheWrite5m > 0:
		b.CacheWrite = cost.CacheWrite5m
	}
	dear, err := price.WorstCase(b)
	if err != nil {
		return float64(cost.Unpriceable)
	}
	// The items that are dearer are at most the sum of each kind's count.
	f := math.Min(1, float64(dearer)/float64(ms.N))
	return (1-f)*float64(plain) + f*float64(dear)
}
