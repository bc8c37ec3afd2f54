package ab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/host"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// Errors Run returns. Each is a runner.StopError (or wraps one), so
// runner.StopOf gives the kind of stop, and its ExitCode the exit code
// (docs/design.md §10).
var (
	// ErrRefused: a precondition failed or --confirm is missing; nothing
	// was sent (exit 3). The errors below that wrap it say which.
	ErrRefused error = &runner.StopError{Kind: runner.Refused, Err: errors.New("ab: refused")}
	// ErrTooFewOrgs: the A/B needs at least two orgs.
	ErrTooFewOrgs = fmt.Errorf("%w: the A/B needs at least 2 orgs (the dispatcher arm fans out over them)", ErrRefused)
	// ErrConfirmRequired: the total of both arms needs --confirm.
	ErrConfirmRequired = fmt.Errorf("%w: --confirm is required", ErrRefused)
	// ErrStormTest: the dispatcher lost, duplicated or errored an item under
	// the storm self-test; the A/B is blocked.
	ErrStormTest = fmt.Errorf("%w: the storm self-test failed", ErrRefused)
	// ErrPaused: the projected total is over budget × (1 + tolerance);
	// nothing was sent (exit 2).
	ErrPaused error = &runner.StopError{Kind: runner.Paused, Err: errors.New("ab: paused by the budget gate")}
	// ErrDataLoss: an item was lost or duplicated (exit 5). For the
	// dispatcher any failed data-loss check counts; for the legacy arm only
	// missing or duplicate results do, since its retryable causes marked
	// terminal are the legacy behaviour the A/B demonstrates.
	ErrDataLoss error = &runner.StopError{Kind: runner.DataLoss, Err: errors.New("ab: data-loss check failed")}
	// ErrConfig: the configuration is unusable; nothing was sent (exit 1).
	ErrConfig error = &runner.StopError{Kind: runner.Usage, Err: errors.New("ab: configuration")}
)

// Orders of the arms.
const (
	OrderAB   = "ab"   // baseline, then dispatcher
	OrderBA   = "ba"   // dispatcher, then baseline
	OrderABAB = "abab" // two rounds of ab, to expose time-of-day drift
)

// DefaultSpeed is the simulator's speed factor K when none is given. The
// legacy arm completes about 50 ÷ 2.05 s ≈ 24 requests per API second, so
// the Phase 6 A/B (141,600 items through each arm) takes about 5,800 API
// seconds for the baseline and a sixth of that for the dispatcher. At
// K = 14 that measured 7.0 + 1.2 minutes (8 min 18 s in all) on a 2-core
// machine, under the ten the validation allows. A higher K shortens it but
// asks the dispatcher arm for more than the ~2,000 requests a second two
// shared cores serve without inflating the simulated latencies.
const DefaultSpeed = 14

// Config is an A/B run. Zero fields take the defaults noted.
type Config struct {
	// N items of the Phase 6 judge workload through each arm (required).
	N int
	// Seed of the workload generator (and of the embedded simulator).
	Seed int64
	// Orgs are the live orgs; the first is the legacy arm's. Empty, or
	// Sim set: both arms run against the embedded simulator.
	Orgs []org.Org
	// Sim forces the embedded simulator even when orgs are configured.
	Sim bool
	// BaseURL is the live API root (default https://api.anthropic.com).
	BaseURL string
	// Speed is the server's K: the embedded simulator's speed (default
	// DefaultSpeed), or an external simulator's when BaseURL points at one
	// (default 1, the real API).
	Speed float64
	// Order is OrderAB (default), OrderBA or OrderABAB.
	Order string
	// Arms are the arms to run (default ArmBaseline and ArmDispatcher;
	// ParseArms reads the --arms list). Both of those are required; ArmBatch
	// adds the batch arm, which runs after the two arms of each round.
	Arms []string
	// Dir is the A/B directory (required): ab.json, events.jsonl,
	// requests.jsonl, the arms' run directories and the self-test's.
	Dir string
	// Out, when set, also receives the result JSON.
	Out string
	// StatusFile, when set, receives the markdown status section.
	StatusFile string
	// Budget and Tolerance are the pre-flight budget gate, and Confirm the
	// --confirm of the confirm rule; both judge the total of every arm.
	Budget    cost.Nanos
	Tolerance float64
	Confirm   bool
	// ExpectOutput is the expected output tokens per request for the cost
	// projection (0: the planner's default, min(max_tokens, 100)).
	ExpectOutput int64
	// Prices is the price table (default cost.Default()).
	Prices *cost.Table
	// Caps are the dispatcher's polite caps (default upstream.DefaultCaps).
	Caps map[string]int
	// Stderr receives the human-readable story of the run (default discard).
	Stderr io.Writer
	// ProgressEvery is the period of progress lines on Stderr (0: 10 s;
	// < 0: none).
	ProgressEvery time.Duration
	// Log is the dispatcher's logger (default discard).
	Log *slog.Logger
	// StormTest tunes the storm self-test.
	StormTest StormTest
	// SimConfig adjusts the embedded simulator of the arms (for tests).
	SimConfig func(*sim.Config)
	// OnSim is called with the embedded simulator once it is serving (for
	// tests, to read its ledger).
	OnSim func(*sim.Running)
	// Dispatch adjusts the dispatcher arm's configuration (for tests).
	Dispatch func(*dispatch.Config)
	// Cache, when set, is the dispatcher arm's result cache in CacheMode
	// (CacheSampled: requests with temperature above 0 too); the legacy
	// arm has none.
	Cache        *cache.Cache
	CacheMode    cache.Mode
	CacheSampled bool
	// Shared, when its URL is set, is the shared budget (--shared) of the
	// arms that run on lanes: Run refuses at once when Redis cannot be
	// reached (unless Fallback), and each arm then opens its own, on a
	// local share during an outage.
	Shared runner.Shared
	// Now is the clock for rotation reminders (default time.Now).
	Now func() time.Time
	// Report, when set, renders the HTML report of the A/B directory at
	// the end (the command wires report.Write here); its error is recorded
	// as a problem but does not fail the A/B.
	Report func(dir string) error
}

// ErrArms is wrapped by the errors about an arms list (it also wraps
// ErrConfig).
var ErrArms = fmt.Errorf("%w: arms", ErrConfig)

// ParseArms reads a comma-separated arms list, as --arms takes it: "legacy"
// (or "baseline"), "dispatcher" and "batch", each at most once, with
// legacy and dispatcher both required. It returns the canonical arm names
// (ArmBaseline, ArmDispatcher, ArmBatch) in that order.
func ParseArms(list string) ([]string, error) {
	var names []string
	for _, f := range strings.Split(list, ",") {
		names = append(names, strings.ToLower(strings.TrimSpace(f)))
	}
	return checkArms(names)
}

// checkArms validates arm names and returns them in canonical form and order.
func checkArms(names []string) ([]string, error) {
	seen := map[string]bool{}
	for _, n := range names {
		arm := n
		switch n {
		case "legacy", ArmBaseline:
			arm = ArmBaseline
		case ArmDispatcher, ArmBatch:
		case "":
			return nil, fmt.Errorf("%w: an empty arm name in %q", ErrArms, strings.Join(names, ","))
		default:
			return nil, fmt.Errorf("%w: unknown arm %q: want legacy, dispatcher or batch", ErrArms, n)
		}
		if seen[arm] {
			return nil, fmt.Errorf("%w: arm %q named twice", ErrArms, n)
		}
		seen[arm] = true
	}
	if !seen[ArmBaseline] || !seen[ArmDispatcher] {
		return nil, fmt.Errorf("%w: the A/B needs both legacy and dispatcher (batch is optional)", ErrArms)
	}
	out := []string{ArmBaseline, ArmDispatcher}
	if seen[ArmBatch] {
		out = append(out, ArmBatch)
	}
	return out, nil
}

// harness is one Run in progress.
// openAIWhy says why the A/B leaves OpenAI orgs out.
const openAIWhy = "the A/B sends the Phase 6 Claude judge workload, and its legacy arm is the Anthropic SDK's path on one org; OpenAI items are compared by 'apidispatch run' (sync or batch) instead"

type harness struct {
	cfg       Config
	simulated bool
	// openAI are the configured OpenAI orgs the A/B leaves out.
	openAI   []string
	batchArm bool // the batch arm runs
	// batchWallS is the batch arm's projected wall-clock (API seconds).
	batchWallS float64
	speed      float64
	orgs       []org.Org
	baseURL    string
	shownURL   string // baseURL without any password, for outputs
	srv        *sim.Running
	pipe       *pipeListener // in-memory connections to srv (embedded simulator only)
	pipeSrv    *http.Server
	simCfg     sim.Config
	prices     *cost.Table
	events     *rundir.EventLog
	out        io.Writer
	ws         *workload.Summary
	input      string
	projJSON   json.RawMessage
	res        *Result
}

// Run performs the A/B (docs/design.md §9): the gates, the storm self-test,
// both arms in the configured order, and the outputs. It returns the
// result (nil when it stopped before any arm ran) and an error that wraps
// ErrConfig, ErrRefused, ErrPaused, dispatch.ErrIncomplete or ErrDataLoss.
// Nothing is sent to any API before every gate and the self-test pass.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Shared.URL != "" {
		if err := cfg.Shared.Check(ctx); err != nil {
			return nil, &runner.StopError{Kind: runner.Usage, Err: err}
		}
		// Reachable a moment ago: an outage now is mid-run.
		cfg.Shared.Fallback = "local"
	}
	h, err := newHarness(cfg)
	if err != nil {
		return nil, err
	}
	defer h.close()
	return h.run(ctx)
}

func newHarness(cfg Config) (*harness, error) {
	if cfg.N <= 0 {
		return nil, fmt.Errorf("%w: N must be positive", ErrConfig)
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: no A/B directory", ErrConfig)
	}
	switch cfg.Order {
	case "":
		cfg.Order = OrderAB
	case OrderAB, OrderBA, OrderABAB:
	default:
		return nil, fmt.Errorf("%w: order %q: want ab, ba or abab", ErrConfig, cfg.Order)
	}
	if len(cfg.Arms) == 0 {
		cfg.Arms = []string{ArmBaseline, ArmDispatcher}
	}
	arms, err := checkArms(cfg.Arms)
	if err != nil {
		return nil, err
	}
	cfg.Arms = arms
	if cfg.Prices == nil {
		cfg.Prices = cost.Default()
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.ProgressEvery == 0 {
		cfg.ProgressEvery = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Speed < 0 {
		return nil, fmt.Errorf("%w: speed factor must be positive", ErrConfig)
	}
	h := &harness{cfg: cfg, prices: cfg.Prices, out: cfg.Stderr, batchArm: len(arms) == 3}
	h.simulated = cfg.Sim || len(cfg.Orgs) == 0
	if h.simulated {
		h.speed = cfg.Speed
		if h.speed == 0 {
			h.speed = DefaultSpeed
		}
	} else {
		// The A/B sends Claude judge items, and its legacy arm is the
		// Anthropic SDK's path: an OpenAI org can serve neither arm.
		for _, o := range cfg.Orgs {
			if o.ProviderName() == org.OpenAI {
				h.openAI = append(h.openAI, o.Name)
				continue
			}
			h.orgs = append(h.orgs, o)
		}
		if len(h.openAI) > 0 {
			fmt.Fprintf(h.out, "note: %s not used: %s\n", strings.Join(h.openAI, ", "), openAIWhy)
		}
		h.baseURL = cfg.BaseURL
		if h.baseURL == "" {
			h.baseURL = "https://api.anthropic.com"
		}
		if _, err := apihttp.CheckBaseURL(h.baseURL); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		h.shownURL = h.baseURL
		if u, err := url.Parse(h.baseURL); err == nil {
			h.shownURL = u.Redacted()
		}
		h.speed = max(cfg.Speed, 1)
	}
	if err := os.MkdirAll(cfg.Dir, rundir.DirPerm); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	ev, err := rundir.OpenEventLog(filepath.Join(cfg.Dir, rundir.EventsFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	h.events = ev
	return h, nil
}

func (h *harness) close() {
	if h.pipeSrv != nil {
		h.pipeSrv.Close()
	}
	if h.srv != nil {
		h.srv.Close()
	}
	h.events.Close()
}

func (h *harness) say(format string, a ...any) {
	fmt.Fprintf(h.out, format+"\n", a...)
}

// block records a refusal: a "blocked" event, the reason on Stderr.
func (h *harness) block(err error, note string, data any) error {
	h.events.Emit(rundir.EventBlocked, note, data)
	h.events.Flush()
	h.say("blocked: %s", note)
	return err
}

func (h *harness) run(ctx context.Context) (*Result, error) {
	cfg := h.cfg
	started := cfg.Now()
	if h.simulated {
		scfg, err := sim.Preset(sim.PresetOrigin3Org)
		if err != nil {
			return nil, err
		}
		if cfg.Seed != 0 {
			scfg = scfg.WithSeed(cfg.Seed)
		}
		scfg.Speed = h.speed
		if cfg.SimConfig != nil {
			cfg.SimConfig(&scfg)
		}
		srv, err := sim.Start(scfg)
		if err != nil {
			return nil, fmt.Errorf("%w: starting the simulator: %w", ErrConfig, err)
		}
		h.srv, h.simCfg = srv, scfg
		// The arms reach the simulator through in-memory connections, so
		// that the latency they see is the simulator's model and not the
		// kernel's loopback competing with the simulator for the CPU. The
		// TCP listener stays for anything else (and for OnSim users).
		h.pipe = newPipeListener()
		h.pipeSrv = &http.Server{Handler: srv.Server, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
			ErrorLog: log.New(io.Discard, "", 0)}
		go h.pipeSrv.Serve(h.pipe)
		h.orgs, h.baseURL = simOrgs(scfg, srv.Server), srv.URL
		if cfg.OnSim != nil {
			cfg.OnSim(srv)
		}
		h.say("SIMULATION: %s run against the embedded simulator (preset %s) at speed factor K = %g; every wall-clock below is also given in API-equivalent time (×%g).", map[bool]string{false: "both arms", true: "all three arms"}[h.batchArm], sim.PresetOrigin3Org, h.speed, h.speed)
	}
	names := make([]string, len(h.orgs))
	orgInfo := make([]OrgInfo, len(h.orgs))
	for i, o := range h.orgs {
		names[i] = o.Name
		orgInfo[i] = OrgInfo{Org: o.Name, KeyFingerprint: o.Key.Fingerprint()}
	}
	h.events.Emit(rundir.EventStarted, fmt.Sprintf("A/B of %d items per arm, order %s, %s", cfg.N, cfg.Order, h.modeText()),
		map[string]any{"n": cfg.N, "order": cfg.Order, "arms": cfg.Arms, "simulated": h.simulated, "speed_factor": h.speed, "orgs": orgInfo})

	// Precondition: the dispatcher arm needs several orgs.
	if len(h.orgs) < 2 {
		msg := fmt.Sprintf("the A/B needs at least 2 orgs, found %d (%s); configure more keys (ANTHROPIC_API_KEY_<NAME> or --orgs FILE) or use --sim", len(h.orgs), strings.Join(names, ", "))
		if len(h.openAI) > 0 {
			what := "is an OpenAI org"
			if len(h.openAI) > 1 {
				what = "are OpenAI orgs"
			}
			msg = fmt.Sprintf("the A/B needs at least 2 Anthropic orgs, found %d (%s); %s %s, which it cannot use: %s", len(h.orgs), strings.Join(names, ", "), strings.Join(h.openAI, ", "), what, openAIWhy)
		}
		return nil, h.block(ErrTooFewOrgs, msg, map[string]any{"orgs": orgInfo, "reason": "fewer than 2 orgs", "openai_orgs": h.openAI})
	}

	// Projection and gates on the total of every arm.
	rounds := 1
	if cfg.Order == OrderABAB {
		rounds = 2
	}
	ws, err := plan.JudgeSummary(cfg.N, cfg.Seed, workload.GenOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	in := plan.Input{Workload: ws, Prices: h.prices, Orgs: names, Caps: cfg.Caps, Arms: 2, Speed: h.speed, ExpectOutput: cfg.ExpectOutput}
	proj, err := plan.Project(in)
	if err != nil {
		return nil, fmt.Errorf("%w: projecting: %w", ErrConfig, err)
	}
	arms := 2 * rounds
	gp := *proj
	gp.Arms = arms
	gp.ExpectedCost = proj.ExpectedCost * cost.Nanos(rounds)
	gp.AllMaxTokens = proj.AllMaxTokens * cost.Nanos(rounds)
	gp.WorstCase = proj.WorstCase * cost.Nanos(rounds)
	var bat *plan.RouteProjection // the batch arm's, at batch prices
	if h.batchArm {
		in1 := in
		in1.Arms = 1
		p1, err := plan.Project(in1)
		if err != nil {
			return nil, fmt.Errorf("%w: projecting the batch arm: %w", ErrConfig, err)
		}
		routes, err := plan.ProjectRoutes(p1, in1, plan.DefaultBatchModel(), 0)
		if err != nil {
			return nil, fmt.Errorf("%w: projecting the batch arm: %w", ErrConfig, err)
		}
		bat = &routes.Batch
		arms += rounds
		gp.ExpectedCost += bat.ExpectedCost * cost.Nanos(rounds)
		gp.AllMaxTokens += bat.WorstCase * cost.Nanos(rounds)
		gp.WorstCase += bat.WorstCase * cost.Nanos(rounds)
		// The gate's "arms × per arm" would not hold for arms at two
		// prices: it states the total, and the arithmetic shows the sum.
		gp.Arms = 1
	}
	gcfg := plan.GateConfig{Budget: cfg.Budget, Tolerance: cfg.Tolerance, Confirm: cfg.Confirm}
	gate := plan.Gate(&gp, int64(arms)*int64(cfg.N), gcfg)
	doc := proj.Doc(gate)
	doc.ProjectedCostUSD.Total = gp.ExpectedCost.USD()
	doc.ProjectedCostUSD.Expected = gp.ExpectedCost.USD()
	doc.ProjectedCostUSD.WorstCase = gp.WorstCase.USD()
	doc.ProjectedCostUSD.ExpectedNanos = int64(gp.ExpectedCost)
	doc.Arms = arms
	h.projJSON, _ = json.Marshal(doc)
	arith := h.costArithmetic(proj, rounds, bat)
	pc := ProjectedCost{
		PerArm: proj.PerArmExpected.USD(), Total: gp.ExpectedCost.USD(), Arms: arms,
		WorstCasePerArm: proj.PerArmWorst.USD(), WorstCaseTotal: gp.WorstCase.USD(),
		PerArmNanos: int64(proj.PerArmExpected), TotalNanos: int64(gp.ExpectedCost), Arithmetic: arith,
	}
	if bat != nil {
		pc.BatchArm, pc.BatchArmWorstCase, pc.BatchArmNanos = bat.ExpectedCost.USD(), bat.WorstCase.USD(), int64(bat.ExpectedCost)
		h.batchWallS = bat.WallS
	}
	h.say("projected cost, from the price table:\n%s", arith)
	h.say("%s", gate.Explain)
	h.events.Emit(rundir.EventProgress, "projection: "+strings.ReplaceAll(arith, "\n", "; "), map[string]any{"projected_cost_usd": pc, "gate": gate.Decision, "gate_explain": gate.Explain})
	switch gate.Decision {
	case plan.Pause:
		return nil, h.block(ErrPaused, "paused by the budget gate; nothing sent: "+strings.ReplaceAll(gate.Explain, "\n", "; "),
			map[string]any{"decision": gate.Decision, "projected_cost_usd": pc, "explain": gate.Explain})
	case plan.ConfirmRequired:
		return nil, h.block(ErrConfirmRequired, "refused: --confirm is required for this A/B; nothing sent: "+strings.ReplaceAll(gate.Explain, "\n", "; "),
			map[string]any{"decision": gate.Decision, "projected_cost_usd": pc, "explain": gate.Explain})
	}

	// The storm self-test, on its own simulator.
	h.say("storm self-test: the dispatcher under a sustained 429 storm on every org of an embedded simulator …")
	base := h.dispatchConfig()
	st, err := RunStormTest(ctx, cfg.StormTest, base, filepath.Join(cfg.Dir, SelfTestDir))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: stopped during the storm self-test", dispatch.ErrIncomplete)
		}
		return nil, h.block(fmt.Errorf("%w: %w", ErrStormTest, err), "the storm self-test could not run: "+err.Error(), map[string]any{"error": err.Error()})
	}
	if !st.Passed {
		return nil, h.block(fmt.Errorf("%w: %s", ErrStormTest, st.Reason), "blocked: the storm self-test failed: "+st.Reason, st)
	}
	h.say("storm self-test passed: %s (%.1f s)", st.Reason, st.WallS)
	h.events.Emit(rundir.EventProgress, "storm self-test passed: "+st.Reason, st)

	// The workload both arms send.
	if err := h.prepareInput(ws); err != nil {
		return nil, err
	}

	h.res = &Result{
		TargetSpeedup: TargetSpeedup, Simulated: h.simulated || h.speed != 1, SpeedFactor: h.speed,
		ProjectedCostUSD: pc, StormSelfTest: st, Gate: gate.Decision, GateExplain: gate.Explain,
		StartedAt: started.UTC(), Projection: doc,
		Config: RunConfig{
			N: int64(cfg.N), Seed: cfg.Seed, Model: workload.DefaultModel, MaxTokens: workload.DefaultMaxTokens,
			Mode: "live", Simulated: h.simulated || h.speed != 1, SpeedFactor: h.speed, Order: cfg.Order, Arms: cfg.Arms,
			BaseURL: h.shownURL, Orgs: orgInfo, BaselineOrg: h.orgs[0].Name,
			BaselineConcurrency: LegacyConcurrency, BaselineMaxRetries: LegacyRetry(1).MaxRetries,
			Caps: h.caps(), Requests: RequestsFile, RequestsSHA256: h.ws.Hash, CPUs: runtime.NumCPU(),
		},
	}
	if h.res.Simulated {
		h.res.Config.Mode = "simulation"
	}
	if h.srv != nil {
		h.res.Config.SimPreset = sim.PresetOrigin3Org
		h.res.Config.BaseURL = "embedded simulator (in-memory connections)"
	}

	// The arms.
	var problems []string
	var dataLoss bool
	var incomplete bool
	for r := 1; r <= rounds; r++ {
		rd := Round{Round: r, Order: OrderAB}
		seq := []string{ArmBaseline, ArmDispatcher}
		if cfg.Order == OrderBA {
			rd.Order = OrderBA
			seq = []string{ArmDispatcher, ArmBaseline}
		}
		if h.batchArm {
			seq = append(seq, ArmBatch)
		}
		for _, arm := range seq {
			a, err := h.runArm(ctx, arm, r)
			if a != nil {
				switch arm {
				case ArmBaseline:
					rd.Baseline = a
				case ArmDispatcher:
					rd.Dispatcher = a
				case ArmBatch:
					rd.Batch = a
				}
				h.reportArm(a)
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s arm (round %d): %v", arm, r, err))
				if errors.Is(err, dispatch.ErrIncomplete) || ctx.Err() != nil {
					incomplete = true
				}
			}
			if a != nil {
				if p := armDataLoss(a); p != "" {
					problems = append(problems, p)
					dataLoss = true
				}
				if a.CostMatchesLedger != nil && !*a.CostMatchesLedger {
					problems = append(problems, fmt.Sprintf("%s arm (round %d): cost from usage %s ≠ simulator ledger %s",
						arm, r, cost.Nanos(a.CostNanos), cost.Nanos(*a.LedgerCostNanos)))
				}
			}
			if ctx.Err() != nil || (err != nil && a == nil) {
				break
			}
		}
		if rd.Baseline != nil && rd.Dispatcher != nil {
			rd.Speedup = round3(ratio(rd.Baseline.WallS, rd.Dispatcher.WallS))
			rd.SpeedupInclSetup = round3(ratio(rd.Baseline.WallS+rd.Baseline.SetupS, rd.Dispatcher.WallS+rd.Dispatcher.SetupS))
		}
		if rd.Batch != nil && rd.Dispatcher != nil {
			rd.BatchCostRatio = round6(ratio(float64(rd.Batch.CostNanos), float64(rd.Dispatcher.CostNanos)))
			rd.BatchVsDispatcherWall = round3(ratio(rd.Batch.WallS, rd.Dispatcher.WallS))
		}
		h.res.Rounds = append(h.res.Rounds, rd)
		if ctx.Err() != nil || rd.Baseline == nil || rd.Dispatcher == nil || (h.batchArm && rd.Batch == nil) {
			break
		}
	}
	return h.finish(problems, dataLoss, incomplete)
}

// armDataLoss says why an arm's data-loss check is a bug, or "". For the
// dispatcher and batch arms any failed check is one.
func armDataLoss(a *ArmResult) string {
	dl := a.DataLoss
	if a.Arm == ArmBaseline {
		if dl.Missing > 0 || dl.Duplicates > 0 {
			return fmt.Sprintf("baseline arm (round %d): %d results missing, %d duplicated", a.Round, dl.Missing, dl.Duplicates)
		}
		return ""
	}
	if !dl.Passed {
		return fmt.Sprintf("%s arm (round %d): data-loss check failed: missing %d, duplicates %d, retryable marked terminal %d",
			a.Arm, a.Round, dl.Missing, dl.Duplicates, dl.RetryableMarkedTerminal)
	}
	return ""
}

// finish computes the verdict and writes every output.
func (h *harness) finish(problems []string, dataLoss, incomplete bool) (*Result, error) {
	r := h.res
	r.FinishedAt = h.cfg.Now().UTC()
	r.TotalWallS = r.FinishedAt.Sub(r.StartedAt).Seconds()
	if len(r.Rounds) > 0 {
		r.Arms = Arms{Baseline: r.Rounds[0].Baseline, Dispatcher: r.Rounds[0].Dispatcher, Batch: r.Rounds[0].Batch}
	}
	var sum, sumSetup, sumCost, sumWall float64
	n := 0
	complete := true
	for _, rd := range r.Rounds {
		if rd.Baseline == nil || rd.Dispatcher == nil || !rd.Baseline.Complete || !rd.Dispatcher.Complete ||
			(h.batchArm && (rd.Batch == nil || !rd.Batch.Complete)) {
			complete = false
			continue
		}
		sum += rd.Speedup
		sumSetup += rd.SpeedupInclSetup
		sumCost += rd.BatchCostRatio
		sumWall += rd.BatchVsDispatcherWall
		n++
	}
	want := 1
	if h.cfg.Order == OrderABAB {
		want = 2
	}
	complete = complete && n == want
	if n > 0 {
		r.Speedup = round3(sum / float64(n))
		r.SpeedupInclSetup = round3(sumSetup / float64(n))
		if h.batchArm {
			r.BatchCostRatio = round6(sumCost / float64(n))
			r.BatchVsDispatcherWall = round3(sumWall / float64(n))
		}
	}
	r.TargetMet = complete && r.Speedup >= TargetSpeedup
	r.Complete = complete
	r.Problems = problems
	var actA, actB, actC float64
	for _, rd := range r.Rounds {
		if rd.Baseline != nil {
			actA += rd.Baseline.CostUSD
		}
		if rd.Dispatcher != nil {
			actB += rd.Dispatcher.CostUSD
		}
		if rd.Batch != nil {
			actC += rd.Batch.CostUSD
		}
	}
	r.ProjectedVsActual = ProjectedVsActual{
		ProjectedPerArmUSD: r.ProjectedCostUSD.PerArm, ProjectedTotalUSD: r.ProjectedCostUSD.Total,
		ActualBaselineUSD: actA, ActualDispatchUSD: actB, ActualBatchUSD: actC, ActualTotalUSD: actA + actB + actC,
		ActualOverProjected:      round3(ratio(actA+actB+actC, r.ProjectedCostUSD.Total)),
		ProjectedDispatcherWallS: r.Projection.ProjectedWallS, ProjectedBaselineWallS: r.Projection.BaselineWallS,
		ProjectedBatchWallS: h.batchWallS,
	}
	r.Headline = h.headline(r)

	// Outputs: ab.json (+ --out), the status section, the events, the
	// report, the reminders.
	var werrs []error
	b, merr := json.MarshalIndent(r, "", "  ")
	if merr != nil {
		// Never write an empty ab.json in silence.
		werrs = append(werrs, fmt.Errorf("encoding ab.json: %w", merr))
	}
	b = append(b, '\n')
	for _, p := range []string{filepath.Join(h.cfg.Dir, ResultFile), h.cfg.Out} {
		if p == "" {
			continue
		}
		if err := rundir.WriteFileAtomic(p, b, rundir.FilePerm); err != nil {
			werrs = append(werrs, fmt.Errorf("writing %s: %w", p, err))
		}
	}
	if h.cfg.StatusFile != "" {
		if err := WriteStatusSection(h.cfg.StatusFile, StatusSection(r, h.cfg.Dir)); err != nil {
			werrs = append(werrs, fmt.Errorf("writing the status section: %w", err))
		}
	}
	if h.cfg.Report != nil {
		if err := h.cfg.Report(h.cfg.Dir); err != nil {
			werrs = append(werrs, fmt.Errorf("writing the report: %w", err))
		}
	}
	for _, e := range werrs {
		r.Problems = append(r.Problems, e.Error())
		h.say("warning: %v", e)
	}
	headline := map[string]any{
		"speedup": r.Speedup, "target_met": r.TargetMet, "simulated": r.Simulated, "speed_factor": r.SpeedFactor,
		"projected_cost_usd": r.ProjectedCostUSD, "projected_vs_actual": r.ProjectedVsActual, "problems": r.Problems,
	}
	if a := r.Arms.Baseline; a != nil {
		headline["baseline"] = armHeadline(a)
	}
	if d := r.Arms.Dispatcher; d != nil {
		headline["dispatcher"] = armHeadline(d)
	}
	if c := r.Arms.Batch; c != nil {
		headline["batch"] = armHeadline(c)
		headline["batch_cost_ratio"], headline["batch_vs_dispatcher_wall"] = r.BatchCostRatio, r.BatchVsDispatcherWall
	}
	var err error
	switch {
	case dataLoss:
		err = fmt.Errorf("%w: %s", ErrDataLoss, strings.Join(problems, "; "))
		h.events.Emit(rundir.EventFailure, "DATA-LOSS CHECK FAILED: "+strings.Join(problems, "; "), headline)
	case incomplete || !complete:
		err = fmt.Errorf("%w: %s", dispatch.ErrIncomplete, strings.Join(problems, "; "))
		h.events.Emit(rundir.EventIncomplete, "A/B incomplete (rerun the same command to resume): "+strings.Join(problems, "; "), headline)
	default:
		h.events.Emit(rundir.EventCompleted, r.Headline, headline)
	}
	h.events.Flush()

	return r, err
}

// armHeadline is an arm's headline numbers for events.
func armHeadline(a *ArmResult) map[string]any {
	m := map[string]any{
		"wall_s": round3(a.WallS), "api_equivalent_wall_s": round3(a.APIEquivalentWallS), "cost_usd": a.CostUSD,
		"succeeded": a.Succeeded, "errored": a.Errored, "unfinished": a.Unfinished, "rate_limited_429": a.RateLimited429,
		"requests_per_min": round3(a.RequestsPerMin), "data_loss_passed": a.DataLoss.Passed,
	}
	if a.LedgerCostUSD != nil {
		m["ledger_cost_usd"] = *a.LedgerCostUSD
	}
	return m
}

// headline is the one-line verdict.
func (h *harness) headline(r *Result) string {
	mode := "LIVE"
	if r.Simulated {
		mode = fmt.Sprintf("SIMULATION at K = %g (API-equivalent times are ×%g)", r.SpeedFactor, r.SpeedFactor)
	}
	if !r.Complete {
		return fmt.Sprintf("%s: the A/B did not complete (%d problem(s)); rerun the same command to resume.", mode, len(r.Problems))
	}
	a, d := r.Arms.Baseline, r.Arms.Dispatcher
	batch := ""
	if c := r.Arms.Batch; c != nil {
		batch = fmt.Sprintf(" Batch arm (Message Batches over %d orgs): %.1f s (API-equivalent %s, %.2f× the dispatcher's wall-clock), cost $%.4f from usage (%.3f× the dispatcher's); data-loss check %s.",
			len(c.Orgs), c.WallS, dur(c.APIEquivalentWallS), r.BatchVsDispatcherWall, c.CostUSD, r.BatchCostRatio, passFail(c.DataLoss.Passed))
	}
	return fmt.Sprintf("%s: the dispatcher took %.1f s against the legacy path's %.1f s (API-equivalent %s vs %s): speed-up %.2f×, target ≥ %.0f× %s; cost $%.4f vs $%.4f from usage; data-loss check baseline %s, dispatcher %s.%s",
		mode, d.WallS, a.WallS, dur(d.APIEquivalentWallS), dur(a.APIEquivalentWallS), r.Speedup, TargetSpeedup, metOrNot(r.TargetMet),
		a.CostUSD, d.CostUSD, passFail(a.DataLoss.Passed), passFail(d.DataLoss.Passed), batch)
}

func (h *harness) modeText() string {
	if h.simulated {
		return fmt.Sprintf("SIMULATION on the embedded simulator at K = %g", h.speed)
	}
	if h.speed != 1 {
		return fmt.Sprintf("against the simulator at %s, K = %g", h.shownURL, h.speed)
	}
	return "LIVE against " + h.shownURL
}

// costArithmetic shows the per-arm projection and the total of rounds
// rounds: two arms at sync prices, and the batch arm at batch prices when
// bat is not nil.
func (h *harness) costArithmetic(p *plan.Projection, rounds int, bat *plan.RouteProjection) string {
	var b strings.Builder
	for _, m := range p.Models {
		fmt.Fprintf(&b, "  per arm: %s\n", m.Arithmetic)
	}
	fmt.Fprintf(&b, "  per arm expected %s (worst case %s)\n", p.PerArmExpected, p.PerArmWorst)
	arms := 2 * rounds
	if bat == nil {
		fmt.Fprintf(&b, "  total: %d arms × %s = %s (worst case %s)", arms, p.PerArmExpected, p.PerArmExpected*cost.Nanos(arms), p.PerArmWorst*cost.Nanos(arms))
		return b.String()
	}
	fmt.Fprintf(&b, "  batch arm at batch prices: %s\n", bat.Explain)
	fmt.Fprintf(&b, "  batch arm expected %s (worst case %s)\n", bat.ExpectedCost, bat.WorstCase)
	r := cost.Nanos(rounds)
	fmt.Fprintf(&b, "  total: %d sync arms × %s + %d batch arm(s) × %s = %s (worst case %d × %s + %d × %s = %s)",
		arms, p.PerArmExpected, rounds, bat.ExpectedCost, p.PerArmExpected*cost.Nanos(arms)+bat.ExpectedCost*r,
		arms, p.PerArmWorst, rounds, bat.WorstCase, p.PerArmWorst*cost.Nanos(arms)+bat.WorstCase*r)
	return b.String()
}

func (h *harness) caps() map[string]int {
	out := map[string]int{}
	for k, v := range upstream.DefaultCaps {
		out[k] = v
	}
	for k, v := range h.cfg.Caps {
		out[k] = v
	}
	return out
}

// dispatchConfig is the dispatcher arm's configuration.
func (h *harness) dispatchConfig() dispatch.Config {
	cfg := dispatch.Config{Orgs: h.orgs, BaseURL: h.baseURL, Caps: h.cfg.Caps, Speed: h.speed, Prices: h.prices, Log: h.cfg.Log}
	if h.cfg.Cache != nil {
		cfg.Cache, cfg.CacheMode, cfg.CacheSampled = h.cfg.Cache, h.cfg.CacheMode, h.cfg.CacheSampled
	}
	if h.cfg.Dispatch != nil {
		h.cfg.Dispatch(&cfg)
	}
	return cfg
}

// prepareInput writes the workload (or reuses an identical one) and
// validates it once for both arms.
func (h *harness) prepareInput(want *workload.Summary) error {
	h.input = filepath.Join(h.cfg.Dir, RequestsFile)
	if ws, err := rundir.Validate(h.input, h.prices); err == nil && ws.Hash == want.Hash {
		h.ws = ws
		return nil
	}
	if err := writeJudge(h.input, h.cfg.N, h.cfg.Seed); err != nil {
		return fmt.Errorf("%w: writing the workload: %w", ErrConfig, err)
	}
	ws, err := rundir.Validate(h.input, h.prices)
	if err != nil {
		return fmt.Errorf("%w: the generated workload: %w", ErrConfig, err)
	}
	if ws.Hash != want.Hash {
		return fmt.Errorf("%w: the generated workload's hash %s differs from the planned %s", ErrConfig, ws.Hash, want.Hash)
	}
	h.ws = ws
	return nil
}

// armDir is an arm's run directory, relative to the A/B directory.
func armDir(arm string, round int) string {
	if round <= 1 {
		return arm
	}
	return filepath.Join(fmt.Sprintf("round%d", round), arm)
}

// runArm runs (or reuses, when a previous run completed it) one arm.
func (h *harness) runArm(ctx context.Context, arm string, round int) (*ArmResult, error) {
	rel := armDir(arm, round)
	dir := filepath.Join(h.cfg.Dir, rel)
	if a, ok := h.completeArm(dir, arm); ok {
		a.Reused = true
		a.Note = "complete in the directory from an earlier run; reused, not run again"
		h.say("%s arm (round %d): already complete in %s; reused", arm, round, dir)
		return a, nil
	}
	h.say("%s arm (round %d) starting: %s", arm, round, h.armText(arm))
	h.events.Emit(rundir.EventProgress, fmt.Sprintf("%s arm (round %d) started", arm, round), map[string]any{"arm": arm, "round": round, "dir": rel})
	var mark int64
	if h.srv != nil {
		mark = h.srv.Server.Mark()
	}
	cpu0, load0 := host.ProcessCPU(), host.LoadAverage()
	var (
		s       *rundir.Summary
		setup   time.Duration
		resumed bool
		note    string // why the arm was run again from the start
		err     error
	)
	switch arm {
	case ArmBaseline:
		s, err = h.runLegacy(ctx, dir, arm, round)
	case ArmBatch:
		restarted := false
		if h.srv != nil {
			// An earlier, incomplete batch arm's batches lived in the
			// embedded simulator of the process that made them, which is
			// gone: re-attaching would poll them forever (404). Against
			// an API (or an external simulator) the run resumes instead.
			if _, serr := os.Stat(dir); serr == nil {
				restarted = true
				h.say("%s arm (round %d): the incomplete run in %s is discarded: its batches were in the embedded simulator of an earlier process; running it again from the start", arm, round, dir)
				if rerr := os.RemoveAll(dir); rerr != nil {
					return nil, rerr
				}
			}
		}
		s, setup, resumed, err = h.runJob(ctx, dir, arm, round, runner.RouteBatch)
		if restarted {
			note = "an incomplete run was discarded and run again from the start: its batches were in an earlier process's embedded simulator"
		}
	default:
		s, setup, resumed, err = h.runDispatcher(ctx, dir, arm, round)
	}
	if s == nil {
		return nil, err
	}
	var ledger *sim.LedgerTotals
	if h.srv != nil {
		t := sim.TotalsOf(h.srv.Server.LedgerSince(mark))
		ledger = &t
	}
	a := armResult(arm, round, rel, s, h.speed, setup, ledger)
	cpu := (host.ProcessCPU() - cpu0).Seconds()
	a.Host = HostLoad{ProcessCPUS: round3(cpu), LoadAvgStart: load0, LoadAvgEnd: host.LoadAverage(), CPUs: runtime.NumCPU()}
	if done := s.CompletedThisRun; done > 0 {
		a.Host.CPUMsPerRequest = round3(cpu * 1000 / float64(done))
	}
	if wall := s.WallS + setup.Seconds(); wall > 0 {
		a.Host.ProcessCPUShare = round3(cpu / (wall * float64(runtime.NumCPU())))
	}
	if resumed {
		a.Resumed = true
		a.Note = "resumed a partial run: wall-clock and ledger cover only this invocation, so the speed-up is not a clean measurement"
	}
	if note != "" {
		a.Note = note
	}
	if b, jerr := json.MarshalIndent(a, "", "  "); jerr == nil {
		rundir.WriteFileAtomic(filepath.Join(dir, ArmFile), append(b, '\n'), rundir.FilePerm)
	}
	return a, err
}

// completeArm reads an arm's arm.json left by an earlier run and reports
// whether it is a complete run of this workload.
func (h *harness) completeArm(dir, arm string) (*ArmResult, bool) {
	b, err := os.ReadFile(filepath.Join(dir, ArmFile))
	if err != nil {
		return nil, false
	}
	var a ArmResult
	if json.Unmarshal(b, &a) != nil || a.Arm != arm || !a.Complete {
		return nil, false
	}
	sb, err := os.ReadFile(filepath.Join(dir, rundir.SummaryFile))
	if err != nil {
		return nil, false
	}
	var s rundir.Summary
	if json.Unmarshal(sb, &s) != nil || s.N != int64(h.cfg.N) || s.Unfinished != 0 {
		return nil, false
	}
	if arm != ArmBaseline {
		// The run's store must hold this very workload.
		if _, err := os.Stat(filepath.Join(dir, rundir.StateFile)); err != nil {
			return nil, false
		}
	}
	return &a, true
}

func (h *harness) armText(arm string) string {
	if arm == ArmBaseline {
		return fmt.Sprintf("legacy path, org %s (%s) alone, fixed concurrency %d, SDK retries (max %d)", h.orgs[0].Name, h.orgs[0].Key.Fingerprint(), LegacyConcurrency, LegacyRetry(1).MaxRetries)
	}
	var parts []string
	for _, o := range h.orgs {
		parts = append(parts, fmt.Sprintf("%s (%s)", o.Name, o.Key.Fingerprint()))
	}
	if arm == ArmBatch {
		return "Message Batches (batch prices) over " + strings.Join(parts, ", ")
	}
	return "dispatcher over " + strings.Join(parts, ", ")
}

// runLegacy runs the legacy arm from scratch in dir.
func (h *harness) runLegacy(ctx context.Context, dir, arm string, round int) (*rundir.Summary, error) {
	// An earlier, incomplete legacy run is discarded: it keeps no state.
	for _, f := range []string{rundir.ResultsFile, rundir.EventsFile, rundir.SummaryFile, ArmFile} {
		os.Remove(filepath.Join(dir, f))
	}
	if err := os.MkdirAll(dir, rundir.DirPerm); err != nil {
		return nil, err
	}
	ev, err := rundir.OpenEventLog(filepath.Join(dir, rundir.EventsFile))
	if err != nil {
		return nil, err
	}
	defer ev.Close()
	tr := h.transport(100)
	defer tr.CloseIdleConnections()
	leg, err := NewLegacy(LegacyConfig{Org: h.orgs[0], BaseURL: h.baseURL, Speed: h.speed, Prices: h.prices, Events: ev,
		Client: apihttp.NewClient(tr, 0, 0)})
	if err != nil {
		return nil, err
	}
	stop := h.watch(arm, round, leg.Progress)
	s, err := leg.Run(ctx, h.input, filepath.Join(dir, rundir.ResultsFile), h.ws.N)
	stop()
	if s != nil {
		s.Projection = h.projJSON
		writeSummary(dir, s)
	}
	return s, err
}

// runDispatcher runs (or resumes) the dispatcher arm in dir.
func (h *harness) runDispatcher(ctx context.Context, dir, arm string, round int) (*rundir.Summary, time.Duration, bool, error) {
	return h.runJob(ctx, dir, arm, round, runner.RouteSync)
}

// runJob runs (or resumes) an arm that keeps its state in a run store (the
// dispatcher by sync, the batch arm by Message Batches) through the run
// lifecycle that 'run' uses, runner.Execute. It returns the summary (also
// written to dir), the setup time (the store's import), and whether it
// resumed a partial run.
func (h *harness) runJob(ctx context.Context, dir, arm string, round int, route string) (*rundir.Summary, time.Duration, bool, error) {
	t0 := time.Now()
	job, err := rundir.OpenJob(ctx, rundir.JobConfig{InputPath: h.input, RunDir: dir, Prices: h.prices}, h.ws)
	if err != nil {
		return nil, 0, false, err
	}
	defer job.Close()
	setup := time.Since(t0)
	dcfg := h.dispatchConfig()
	if dcfg.Client == nil {
		// The arm's own connections, closed when it ends, so that the
		// simulator can shut down at once.
		tr := h.transport(max(256, 2*len(h.orgs)*maxCap(h.caps())))
		defer tr.CloseIdleConnections()
		dcfg.Client = apihttp.NewClient(tr, 0, 0)
	}
	x := runner.Exec{Route: route, Sync: dcfg, Shared: h.cfg.Shared}
	switch route {
	case runner.RouteBatch:
		x.OnBatch = func(*batch.Route) func() { return h.watch(arm, round, storeProgress(ctx, job)) }
	default:
		x.OnEngine = func(eng *dispatch.Engine) func() { return h.watch(arm, round, eng.Progress) }
	}
	res, err := runner.Execute(ctx, job, x)
	if res == nil || res.Summary == nil {
		return nil, setup, job.Existing, err
	}
	s := res.Summary
	s.Projection = h.projJSON
	if s.Extra == nil {
		s.Extra = map[string]any{}
	}
	s.Extra["arm"] = arm
	if werr := job.WriteSummary(s); werr != nil && err == nil {
		err = werr
	}
	return s, setup, job.Existing && s.CompletedThisRun < s.N, err
}

// storeProgress is the progress of a job read from its store, for a route
// (the batch route) that keeps no live counters of its own.
func storeProgress(ctx context.Context, job *rundir.Job) func() dispatch.Progress {
	start := time.Now()
	return func() dispatch.Progress {
		agg, err := job.Store.Aggregate(context.WithoutCancel(ctx))
		if err != nil {
			return dispatch.Progress{}
		}
		p := dispatch.Progress{Done: agg.Succeeded + agg.Errored, Total: agg.N, Succeeded: agg.Succeeded, Errored: agg.Errored,
			CostUSD: cost.Nanos(agg.CostNanos).USD(), ElapsedS: time.Since(start).Seconds()}
		if p.ElapsedS > 0 {
			p.RequestsPerMin = float64(p.Done) / p.ElapsedS * 60
		}
		return p
	}
}

// watch prints progress lines and emits A/B progress events at each
// quarter of an arm, until the returned stop is called.
func (h *harness) watch(arm string, round int, progress func() dispatch.Progress) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		lastLine := time.Now()
		quarter := int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				p := progress()
				if h.cfg.ProgressEvery > 0 && now.Sub(lastLine) >= h.cfg.ProgressEvery {
					lastLine = now
					h.say("  %s: %s", arm, dispatch.ProgressLine(p))
				}
				if p.Total > 0 {
					if q := p.Done * 4 / p.Total; q > quarter && q < 4 {
						quarter = q
						h.events.Emit(rundir.EventProgress, fmt.Sprintf("%s arm (round %d): %d%% done, %.0f req/min, $%.4f, %d 429s", arm, round, q*25, p.RequestsPerMin, p.CostUSD, p.RateLimited),
							map[string]any{"arm": arm, "round": round, "done": p.Done, "total": p.Total, "requests_per_min": p.RequestsPerMin,
								"cost_usd": p.CostUSD, "rate_limited_429": p.RateLimited, "elapsed_s": p.ElapsedS})
					}
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// reportArm prints an arm's headline and records it as a progress event.
func (h *harness) reportArm(a *ArmResult) {
	ledger := ""
	if a.LedgerCostNanos != nil {
		ledger = fmt.Sprintf(", simulator ledger %s (%s)", cost.Nanos(*a.LedgerCostNanos), map[bool]string{true: "matches", false: "DIFFERS"}[*a.CostMatchesLedger])
	}
	msg := fmt.Sprintf("%s arm (round %d) done: %.1f s (API-equivalent %s), %s succeeded, %s errored, %s unfinished, cost %s from usage%s, %s 429s, data-loss check %s",
		a.Arm, a.Round, a.WallS, dur(a.APIEquivalentWallS), numfmt.Commas(a.Succeeded), numfmt.Commas(a.Errored), numfmt.Commas(a.Unfinished),
		cost.Nanos(a.CostNanos), ledger, numfmt.Commas(a.RateLimited429), passFail(a.DataLoss.Passed))
	h.say("%s", msg)
	h.events.Emit(rundir.EventProgress, msg, armHeadline(a))
	h.events.Flush()
}

// transport is an arm's HTTP transport: to the embedded simulator over
// in-memory connections, else the dispatcher's tuned transport.
func (h *harness) transport(maxConns int) *http.Transport {
	tr := apihttp.NewTransport(maxConns)
	if h.pipe != nil {
		tr.DialContext = h.pipe.Dial
		tr.ForceAttemptHTTP2 = false
	}
	return tr
}

// maxCap is the largest of caps.
func maxCap(caps map[string]int) int {
	m := 0
	for _, v := range caps {
		m = max(m, v)
	}
	return m
}

// writeSummary writes summary.json into an arm's directory.
func writeSummary(dir string, s *rundir.Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return rundir.WriteFileAtomic(filepath.Join(dir, rundir.SummaryFile), append(b, '\n'), rundir.FilePerm)
}
