package ab

import (
	"math"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
)

// Arm names, which are also the arms' run directories under the A/B
// directory (a second round of --order abab lives under round2/).
const (
	ArmBaseline   = "baseline"
	ArmDispatcher = "dispatcher"
	// ArmBatch sends every item as Message Batches over every org (at the
	// batch price); it runs only when Config.Arms names it, after the two
	// arms of each round.
	ArmBatch = "batch"
)

// TargetSpeedup is the speed-up the A/B must show (docs/design.md §9).
const TargetSpeedup = 5.0

// Files of an A/B directory.
const (
	ResultFile   = "ab.json"        // the result JSON (Result)
	RequestsFile = "requests.jsonl" // the workload both arms send
	ArmFile      = "arm.json"       // in each arm's directory: its ArmResult
	SelfTestDir  = "selftest"       // the storm self-test's run
)

// Result is the A/B result JSON (ab.json; docs/design.md §9). It is plain data.
type Result struct {
	// Speedup is baseline wall ÷ dispatcher wall (with --order abab, the
	// mean of the rounds' speed-ups).
	Speedup float64 `json:"speedup"`
	// SpeedupInclSetup also counts each arm's setup (the dispatcher's
	// import of the request file into its store).
	SpeedupInclSetup float64 `json:"speedup_incl_setup"`
	TargetSpeedup    float64 `json:"target_speedup"`
	TargetMet        bool    `json:"target_met"`
	// Simulated is true when both arms ran against a simulator; then
	// SpeedFactor is its K and every wall-clock has an API equivalent (×K).
	Simulated   bool    `json:"simulated"`
	SpeedFactor float64 `json:"speed_factor"`
	// Headline is the one-line verdict, saying plainly when it is a simulation.
	Headline         string        `json:"headline"`
	ProjectedCostUSD ProjectedCost `json:"projected_cost_usd"`
	Arms             Arms          `json:"arms"`
	// Rounds holds every round (one, or two with --order abab).
	Rounds []Round `json:"rounds"`
	// BatchCostRatio is the batch arm's cost from usage ÷ the dispatcher's
	// and BatchVsDispatcherWall its wall ÷ the dispatcher's (the mean of
	// the rounds with --order abab); absent without a batch arm.
	BatchCostRatio        float64           `json:"batch_cost_ratio,omitempty"`
	BatchVsDispatcherWall float64           `json:"batch_vs_dispatcher_wall,omitempty"`
	Config                RunConfig         `json:"config"`
	ProjectedVsActual     ProjectedVsActual `json:"projected_vs_actual"`
	StormSelfTest         SelfTestResult    `json:"storm_self_test"`
	// Gate is the pre-flight decision and its arithmetic.
	Gate        string    `json:"gate"`
	GateExplain string    `json:"gate_explain"`
	StartedAt   time.Time `json:"started_at"`
	FinishedAt  time.Time `json:"finished_at"`
	TotalWallS  float64   `json:"total_wall_s"`
	// Complete is true when every arm completed; Problems lists what did not.
	Complete bool     `json:"complete"`
	Problems []string `json:"problems,omitempty"`
	// Projection is the full plan of the A/B ('plan --json' form).
	Projection plan.ProjectionJSON `json:"projection"`
}

// Arms are the first round's arms.
type Arms struct {
	Baseline   *ArmResult `json:"baseline"`
	Dispatcher *ArmResult `json:"dispatcher"`
	Batch      *ArmResult `json:"batch,omitempty"`
}

// Round is one baseline/dispatcher pair.
type Round struct {
	Round            int        `json:"round"`
	Order            string     `json:"order"` // "ab" or "ba": which arm ran first
	Speedup          float64    `json:"speedup"`
	SpeedupInclSetup float64    `json:"speedup_incl_setup"`
	Baseline         *ArmResult `json:"baseline"`
	Dispatcher       *ArmResult `json:"dispatcher"`
	// Batch is the batch arm, when it ran, with its cost and wall-clock
	// over the dispatcher's.
	Batch                 *ArmResult `json:"batch,omitempty"`
	BatchCostRatio        float64    `json:"batch_cost_ratio,omitempty"`
	BatchVsDispatcherWall float64    `json:"batch_vs_dispatcher_wall,omitempty"`
}

// ProjectedCost is the pre-flight cost projection: per arm, and the total
// the gates decided on (the sync arms × per arm, plus the batch arm at
// batch prices when it runs, per round).
type ProjectedCost struct {
	PerArm          float64 `json:"per_arm"`
	Total           float64 `json:"total"`
	Arms            int     `json:"arms"`
	WorstCasePerArm float64 `json:"worst_case_per_arm"`
	WorstCaseTotal  float64 `json:"worst_case_total"`
	PerArmNanos     int64   `json:"per_arm_nanos"`
	TotalNanos      int64   `json:"total_nanos"`
	// The batch arm's projection at batch prices (absent without one);
	// Arms counts it among the arms.
	BatchArm          float64 `json:"batch_arm,omitempty"`
	BatchArmWorstCase float64 `json:"batch_arm_worst_case,omitempty"`
	BatchArmNanos     int64   `json:"batch_arm_nanos,omitempty"`
	// Arithmetic shows how the figures were reached.
	Arithmetic string `json:"arithmetic"`
}

// ProjectedVsActual compares the projection with the spend from usage.
type ProjectedVsActual struct {
	ProjectedPerArmUSD float64 `json:"projected_per_arm_usd"`
	ProjectedTotalUSD  float64 `json:"projected_total_usd"`
	ActualBaselineUSD  float64 `json:"actual_baseline_usd"`
	ActualDispatchUSD  float64 `json:"actual_dispatcher_usd"`
	ActualBatchUSD     float64 `json:"actual_batch_usd,omitempty"`
	ActualTotalUSD     float64 `json:"actual_total_usd"`
	// ActualOverProjected is actual total ÷ projected total.
	ActualOverProjected float64 `json:"actual_over_projected"`
	// ProjectedWallS and the baseline's are the plan's API-second figures.
	ProjectedDispatcherWallS float64 `json:"projected_dispatcher_api_wall_s"`
	ProjectedBaselineWallS   float64 `json:"projected_baseline_api_wall_s"`
	ProjectedBatchWallS      float64 `json:"projected_batch_api_wall_s,omitempty"`
}

// RunConfig describes the A/B. Keys appear only as fingerprints.
type RunConfig struct {
	N           int64   `json:"n"`
	Seed        int64   `json:"seed"`
	Model       string  `json:"model"`
	MaxTokens   int     `json:"max_tokens"`
	Mode        string  `json:"mode"` // "simulation" or "live"
	Simulated   bool    `json:"simulated"`
	SpeedFactor float64 `json:"speed_factor"`
	Order       string  `json:"order"`
	// Arms are the arms run (canonical names, e.g. baseline, dispatcher, batch).
	Arms      []string  `json:"arms"`
	BaseURL   string    `json:"base_url"`
	SimPreset string    `json:"sim_preset,omitempty"`
	Orgs      []OrgInfo `json:"orgs"`
	// BaselineOrg is the one org of the legacy arm.
	BaselineOrg         string         `json:"baseline_org"`
	BaselineConcurrency int            `json:"baseline_concurrency"`
	BaselineMaxRetries  int            `json:"baseline_max_retries"`
	Caps                map[string]int `json:"caps"`
	Requests            string         `json:"requests_file"`
	RequestsSHA256      string         `json:"requests_sha256"`
	CPUs                int            `json:"cpus"`
}

// OrgInfo names an org and its key's fingerprint.
type OrgInfo struct {
	Org            string `json:"org"`
	KeyFingerprint string `json:"key_fingerprint"`
}

// ArmResult is one arm's measured outcome.
type ArmResult struct {
	Arm   string `json:"arm"`
	Round int    `json:"round"`
	// Dir is the arm's run directory, relative to the A/B directory.
	Dir  string   `json:"dir"`
	Orgs []string `json:"orgs"`
	// WallS is measured: from the arm's first request to its summary.
	// APIEquivalentWallS is WallS × K under a simulator (WallS live).
	WallS              float64 `json:"wall_s"`
	APIEquivalentWallS float64 `json:"api_equivalent_wall_s"`
	// SetupS is the time before the first request (the dispatcher's store
	// import; 0 for the legacy arm, which streams the file).
	SetupS float64 `json:"setup_s"`
	// CostUSD is the spend from the usage of every response.
	CostUSD   float64 `json:"cost_usd"`
	CostNanos int64   `json:"cost_nanos"`
	// Ledger figures are the simulator's bill for this arm (its Mark to
	// LedgerSince window); null when live.
	LedgerCostUSD     *float64 `json:"ledger_cost_usd"`
	LedgerCostNanos   *int64   `json:"ledger_cost_nanos"`
	LedgerRequests    *int64   `json:"ledger_requests"`
	LedgerDuplicates  *int64   `json:"ledger_duplicate_billings"`
	CostMatchesLedger *bool    `json:"cost_matches_ledger"`
	// RequestsPerMin is completions per real minute; the API equivalent is
	// per API minute (÷K).
	RequestsPerMin              float64                    `json:"requests_per_min"`
	APIEquivalentRequestsPerMin float64                    `json:"api_equivalent_requests_per_min"`
	Succeeded                   int64                      `json:"succeeded"`
	Errored                     int64                      `json:"errored"`
	ErroredByType               map[string]int64           `json:"errored_by_type"`
	Unfinished                  int64                      `json:"unfinished"`
	RateLimited429              int64                      `json:"rate_limited_429"`
	Overloaded529               int64                      `json:"overloaded_529"`
	OtherRetries                int64                      `json:"other_retries"`
	Attempts                    int64                      `json:"attempts"`
	Tokens                      rundir.Tokens              `json:"tokens"`
	LatencyMs                   rundir.Latency             `json:"latency_ms"`
	APIEquivalentLatencyMs      rundir.Latency             `json:"api_equivalent_latency_ms"`
	ByOrg                       map[string]rundir.OrgSplit `json:"by_org"`
	DataLoss                    rundir.DataLoss            `json:"data_loss"`
	Lanes                       []gate.LaneSnapshot        `json:"lanes"`
	Complete                    bool                       `json:"complete"`
	// Host is what the machine did during the arm, to judge a simulated
	// wall-clock by: the simulator shares the CPU with the client.
	Host HostLoad `json:"host"`
	// Reused: a complete arm found in the directory by a rerun, not run again.
	// Resumed: the dispatcher resumed a partial run, so WallS covers only
	// the rest and the speed-up is not a clean measurement.
	Reused  bool   `json:"reused,omitempty"`
	Resumed bool   `json:"resumed,omitempty"`
	Note    string `json:"note,omitempty"`
}

// HostLoad describes the machine during one arm.
type HostLoad struct {
	// ProcessCPUS is the CPU time this process used during the arm (the
	// embedded simulator's included); CPUMsPerRequest divides it by the
	// items completed.
	ProcessCPUS     float64 `json:"process_cpu_s"`
	CPUMsPerRequest float64 `json:"cpu_ms_per_request"`
	// ProcessCPUShare is ProcessCPUS ÷ (wall × CPUs): the part of the
	// machine the process used.
	ProcessCPUShare float64 `json:"process_cpu_share"`
	// LoadAvgStart and LoadAvgEnd are the host's one-minute load averages
	// (-1: unknown). A load well above CPUs means other processes competed
	// for the CPU, which inflates a simulated arm's latencies.
	LoadAvgStart float64 `json:"load_avg_1m_start"`
	LoadAvgEnd   float64 `json:"load_avg_1m_end"`
	CPUs         int     `json:"cpus"`
}

// armResult builds an ArmResult from a run's summary and, under the
// simulator, the ledger of the arm's window.
func armResult(arm string, round int, dir string, s *rundir.Summary, speed float64, setup time.Duration, ledger *sim.LedgerTotals) *ArmResult {
	a := &ArmResult{
		Arm: arm, Round: round, Dir: dir,
		WallS: s.WallS, APIEquivalentWallS: s.WallS * speed, SetupS: setup.Seconds(),
		CostUSD: s.Cost.Total, CostNanos: s.Cost.TotalNanos,
		RequestsPerMin: s.RequestsPerMin, APIEquivalentRequestsPerMin: s.RequestsPerMin / speed,
		Succeeded: s.Succeeded, Errored: s.Errored, ErroredByType: s.ErroredByType, Unfinished: s.Unfinished,
		RateLimited429: s.RateLimited429, Overloaded529: s.Overloaded529, OtherRetries: s.OtherRetries,
		Attempts: s.Attempts, Tokens: s.Tokens, LatencyMs: s.LatencyMs,
		APIEquivalentLatencyMs: rundir.Latency{
			P50: int64(math.Round(float64(s.LatencyMs.P50) * speed)),
			P95: int64(math.Round(float64(s.LatencyMs.P95) * speed)),
			P99: int64(math.Round(float64(s.LatencyMs.P99) * speed)),
		},
		ByOrg: s.ByOrg, DataLoss: s.DataLoss, Lanes: s.Lanes,
		Complete: s.Unfinished == 0 && s.N > 0,
	}
	for _, o := range s.Orgs {
		a.Orgs = append(a.Orgs, o["org"])
	}
	if a.ErroredByType == nil {
		a.ErroredByType = map[string]int64{}
	}
	if a.ByOrg == nil {
		a.ByOrg = map[string]rundir.OrgSplit{}
	}
	if ledger != nil {
		usd, n, req, dup := ledger.CostUSD, ledger.CostNanos, ledger.Requests, ledger.Duplicates
		match := n == s.Cost.TotalNanos
		a.LedgerCostUSD, a.LedgerCostNanos, a.LedgerRequests, a.LedgerDuplicates, a.CostMatchesLedger = &usd, &n, &req, &dup, &match
	}
	return a
}

// ratio is a ÷ b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// round6 rounds to six decimals.
func round6(f float64) float64 { return math.Round(f*1e6) / 1e6 }

// round3 rounds to three decimals.
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
