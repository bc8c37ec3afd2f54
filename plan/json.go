package plan

import (
	"encoding/json"
	"math"

	"github.com/apidispatch/apidispatch/cost"
)

// CostJSON is the projected_cost_usd object. Expected and WorstCase are
// totals over the arms (what the gates compare); PerArm and Total are the
// expected cost of one arm and of all arms, as the ab result JSON names
// them. The _nanos fields are the same amounts exact, in nano-dollars.
type CostJSON struct {
	Expected          float64 `json:"expected"`
	WorstCase         float64 `json:"worst_case"`
	AllMaxTokens      float64 `json:"all_max_tokens"`
	PerArm            float64 `json:"per_arm"`
	Total             float64 `json:"total"`
	WorstCasePerArm   float64 `json:"worst_case_per_arm"`
	Spent             float64 `json:"spent"`
	ExpectedNanos     int64   `json:"expected_nanos"`
	WorstCaseNanos    int64   `json:"worst_case_nanos"`
	AllMaxTokensNanos int64   `json:"all_max_tokens_nanos"`
	PerArmNanos       int64   `json:"per_arm_nanos"`
}

// LaneJSON is one lane in 'plan --json'.
type LaneJSON struct {
	Org          string  `json:"org"`
	Pool         string  `json:"pool"`
	Cap          int     `json:"cap"`
	LatencyS     float64 `json:"latency_s"`
	CeilingRPM   float64 `json:"ceiling_rpm"`
	BindingLimit string  `json:"binding_limit"`
	CapRPM       float64 `json:"cap_rpm"`
	RPM          float64 `json:"rpm_limit,omitempty"`
	ITPMRPM      float64 `json:"itpm_rpm,omitempty"`
	OTPMRPM      float64 `json:"otpm_rpm,omitempty"`
	Note         string  `json:"note,omitempty"`
	// CacheWrites and CacheReads: the lane's requests projected to write
	// and to read their prompt-cache prefix.
	CacheWrites int64 `json:"cache_writes,omitempty"`
	CacheReads  int64 `json:"cache_reads,omitempty"`
}

// PoolJSON is one pool in 'plan --json'.
type PoolJSON struct {
	Pool       string  `json:"pool"`
	N          int64   `json:"n"`
	CeilingRPM float64 `json:"ceiling_rpm"`
	WallS      float64 `json:"wall_s"`
	Arithmetic string  `json:"arithmetic"`
}

// ModelJSON is one model in 'plan --json' (one arm).
type ModelJSON struct {
	Model            string  `json:"model"`
	Pool             string  `json:"pool"`
	N                int64   `json:"n"`
	Remaining        int64   `json:"remaining"`
	InputPerReq      float64 `json:"input_tokens_per_request"`
	InputSource      string  `json:"input_source"`
	OutputPerReq     float64 `json:"output_tokens_per_request"`
	OutputSource     string  `json:"output_source"`
	MaxTokensPerReq  float64 `json:"max_tokens_per_request"`
	InputBoundPerReq float64 `json:"input_bound_per_request"`
	Expected         float64 `json:"expected_usd"`
	AllMaxTokens     float64 `json:"all_max_tokens_usd"`
	WorstCase        float64 `json:"worst_case_usd"`
	Arithmetic       string  `json:"arithmetic"`
}

// ProjectionJSON is the object 'plan --json' prints (docs/design.md §7): at
// least n, projected_cost_usd {expected, worst_case}, projected_wall_s,
// gate and lanes [{org, pool, ceiling_rpm, binding_limit}].
type ProjectionJSON struct {
	N                     int64       `json:"n"`
	Arms                  int         `json:"arms"`
	Done                  int64       `json:"done,omitempty"`
	ProjectedCostUSD      CostJSON    `json:"projected_cost_usd"`
	ProjectedWallS        float64     `json:"projected_wall_s"`
	ProjectedWallAtSpeedS float64     `json:"projected_wall_at_speed_s"`
	SpeedFactor           float64     `json:"speed_factor"`
	BaselineWallS         float64     `json:"baseline_wall_s,omitempty"`
	Gate                  string      `json:"gate"`
	GateExplain           string      `json:"gate_explain"`
	Lanes                 []LaneJSON  `json:"lanes"`
	Baseline              []LaneJSON  `json:"baseline_lanes,omitempty"`
	Pools                 []PoolJSON  `json:"pools"`
	Models                []ModelJSON `json:"models"`
	Assumptions           []string    `json:"assumptions"`
	// Cache is present when a result cache answers part of the input: n
	// and every projected figure cover only the rest.
	Cache *CacheJSON `json:"cache,omitempty"`
	// Routes are the routes side by side, when ProjectRoutes was called.
	Routes *RoutesJSON `json:"routes,omitempty"`
}

// RoutesJSON is the projection's "routes" object: the sync and batch
// routes, and the auto split for a deadline (null without one).
type RoutesJSON struct {
	Sync      RouteJSON  `json:"sync"`
	Batch     RouteJSON  `json:"batch"`
	Auto      *RouteJSON `json:"auto"`
	DeadlineS float64    `json:"deadline_s"`
	// BatchModel is the batch processing model assumed, BatchOrgs the orgs
	// the batch route spreads over.
	BatchModel BatchModel `json:"batch_model"`
	BatchOrgs  int        `json:"batch_orgs"`
}

// RouteJSON is one route in "routes"; costs in US dollars (and exact in
// nano-dollars), times in API seconds.
type RouteJSON struct {
	Route          string  `json:"route"`
	Items          int64   `json:"items"`
	BatchItems     int64   `json:"batch_items"`
	SyncItems      int64   `json:"sync_items"`
	ExpectedUSD    float64 `json:"expected_usd"`
	WorstCaseUSD   float64 `json:"worst_case_usd"`
	ExpectedNanos  int64   `json:"expected_nanos"`
	WorstCaseNanos int64   `json:"worst_case_nanos"`
	WallS          float64 `json:"wall_s"`
	WallAtSpeedS   float64 `json:"wall_at_speed_s"`
	BoundS         float64 `json:"bound_s"`
	Binding        string  `json:"binding"`
	// Meets is present for auto only.
	Meets   *bool  `json:"meets,omitempty"`
	Explain string `json:"explain"`
}

// Doc returns the routes as the "routes" object of 'plan --json'.
func (r *Routes) Doc() RoutesJSON {
	d := RoutesJSON{Sync: routeJSON(r.Sync), Batch: routeJSON(r.Batch), DeadlineS: round3(r.DeadlineS), BatchModel: r.model, BatchOrgs: r.orgs}
	if r.Auto != nil {
		a := routeJSON(*r.Auto)
		meets := r.Auto.Meets
		a.Meets = &meets
		d.Auto = &a
	}
	return d
}

func routeJSON(rp RouteProjection) RouteJSON {
	return RouteJSON{
		Route: rp.Route, Items: rp.Items, BatchItems: rp.BatchItems, SyncItems: rp.SyncItems,
		ExpectedUSD: usdF(rp.ExpectedCost), WorstCaseUSD: usdF(rp.WorstCase),
		ExpectedNanos: int64(rp.ExpectedCost), WorstCaseNanos: int64(rp.WorstCase),
		WallS: round3(rp.WallS), WallAtSpeedS: round3(rp.WallAtSpeedS), BoundS: round3(rp.BoundS),
		Binding: rp.Binding, Explain: rp.Explain,
	}
}

// CacheJSON is the projection's "cache" object.
type CacheJSON struct {
	Hits     int64   `json:"hits"`
	SavedUSD float64 `json:"saved_usd"`
}

// Doc returns the projection and its gate decision as the 'plan --json'
// object, for callers that embed it (the summary, the A/B result).
func (p *Projection) Doc(g GateResult) ProjectionJSON {
	d := ProjectionJSON{
		N: p.N, Arms: p.Arms, Done: p.Done,
		ProjectedCostUSD: CostJSON{
			Expected: usdF(p.ExpectedCost), WorstCase: usdF(p.WorstCase), AllMaxTokens: usdF(p.AllMaxTokens),
			PerArm: usdF(p.PerArmExpected), Total: usdF(p.ExpectedCost), WorstCasePerArm: usdF(p.PerArmWorst),
			Spent:         usdF(p.Spent),
			ExpectedNanos: int64(p.ExpectedCost), WorstCaseNanos: int64(p.WorstCase),
			AllMaxTokensNanos: int64(p.AllMaxTokens), PerArmNanos: int64(p.PerArmExpected),
		},
		ProjectedWallS: round3(p.WallS), ProjectedWallAtSpeedS: round3(p.WallAtSpeedS), SpeedFactor: p.Speed,
		BaselineWallS: round3(p.BaselineWallS),
		Gate:          g.Decision, GateExplain: g.Explain,
		Lanes: lanesJSON(p.Lanes), Baseline: lanesJSON(p.Baseline),
		Pools: []PoolJSON{}, Models: []ModelJSON{}, Assumptions: append([]string{}, p.Assumptions...),
	}
	if p.Cached.Hits > 0 {
		d.Cache = &CacheJSON{Hits: p.Cached.Hits, SavedUSD: usdF(p.Cached.Saved)}
	}
	if p.Routes != nil {
		rd := p.Routes.Doc()
		d.Routes = &rd
	}
	for _, pp := range p.Pools {
		d.Pools = append(d.Pools, PoolJSON{Pool: pp.Pool, N: pp.N, CeilingRPM: round3(pp.CeilingRPM), WallS: round3(pp.WallS), Arithmetic: pp.Arithmetic})
	}
	for _, m := range p.Models {
		d.Models = append(d.Models, ModelJSON{
			Model: m.Model, Pool: m.Pool, N: m.N, Remaining: m.Remaining,
			InputPerReq: round3(m.InputPerReq), InputSource: m.InputSource,
			OutputPerReq: round3(m.OutputPerReq), OutputSource: m.OutputSource,
			MaxTokensPerReq: round3(m.MaxTokensPerReq), InputBoundPerReq: round3(m.InputBoundPerReq),
			Expected: usdF(m.Expected), AllMaxTokens: usdF(m.AllMaxTokens), WorstCase: usdF(m.WorstCase),
			Arithmetic: m.Arithmetic,
		})
	}
	return d
}

// JSON is Doc marshalled: the 'plan --json' object.
func (p *Projection) JSON(g GateResult) ([]byte, error) {
	return json.Marshal(p.Doc(g))
}

func lanesJSON(ls []LaneProjection) []LaneJSON {
	out := []LaneJSON{}
	for _, l := range ls {
		out = append(out, LaneJSON{
			Org: l.Org, Pool: l.Pool, Cap: l.Cap, LatencyS: round3(l.LatencyS),
			CeilingRPM: round3(l.CeilingRPM), BindingLimit: l.BindingLimit,
			CapRPM: round3(l.CapRPM), RPM: round3(l.RPM), ITPMRPM: round3(l.ITPMRPM), OTPMRPM: round3(l.OTPMRPM),
			Note: l.Note, CacheWrites: l.CacheWrites, CacheReads: l.CacheReads,
		})
	}
	return out
}

// usdF is an amount in dollars rounded to the micro-dollar, for JSON.
func usdF(n cost.Nanos) float64 { return math.Round(n.USD()*1e6) / 1e6 }

// round3 rounds to three decimals; +Inf (no lane can serve) becomes -1, which JSON can carry.
func round3(f float64) float64 {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return -1
	}
	return math.Round(f*1000) / 1000
}
