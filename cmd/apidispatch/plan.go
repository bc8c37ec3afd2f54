package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/workload"
)

func init() {
	register("plan", "project cost and wall-clock of a request file; check the budget gates", planCmd)
}

// planUsage is 'plan --help' before the flags.
const planUsage = `usage: apidispatch plan REQUESTS.jsonl [flags]
       apidispatch plan --phase6 [--n 141600] [flags]

Validates the request file and projects, before anything is sent, what the
run will cost and how long it will take: per model the items, input and
output tokens per request, the expected cost, the cost if every request used
max_tokens, and the worst case (max_tokens and input at its upper bound); per
lane (org × model pool) the ceiling in requests per minute and the limit that
binds it (cap, rpm, itpm or otpm); the wall-clock; the routes side by side
(sync, Message Batches at batch prices, and with --deadline the split that
--route auto would send); and the gate decision with its arithmetic. Nothing
is sent (except count_tokens calls, which are free).

Exit codes: 0 pass, 1 usage or input error, 2 paused by the budget gate,
3 --confirm required.

flags:`

// planFlags are the flags of 'apidispatch plan'.
type planFlags struct {
	sf                  sendFlags
	cf                  cacheFlags
	pf                  projectionFlags
	latency             *float64
	countTokens, phase6 *bool
	countSample, pilot  *int64
	phase6N, batchSize  *int64
	fromRun             *string
	deadline            *time.Duration
	batchSizeSet        bool
}

func (f *planFlags) register(fs *flag.FlagSet, stderr io.Writer) {
	sf := &f.sf
	f.cf.register(fs)
	fs.StringVar(&sf.orgsFile, "orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from the environment (only their names are used, except by --count-tokens)")
	fs.StringVar(&sf.baseURL, "base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` for --count-tokens, and whose answers in --cache count as hits (env ANTHROPIC_BASE_URL; default https://api.anthropic.com)")
	fs.Var(&sf.caps, "cap", "polite per-key concurrency caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	sf.gateFlags.register(fs, "budget gate in `USD`: pause (exit 2) when the expected cost exceeds budget×(1+tolerance)", "accept a run whose projected cost is ≥ $100 or N ≥ 50,000 (otherwise exit 3)")
	fs.BoolVar(&sf.json, "json", false, "print the projection as one JSON object (docs/design.md §7) instead of tables")
	fs.StringVar(&sf.prices, "prices", "", "price table `FILE` overriding the embedded one")
	fs.Float64Var(&sf.speed, "speed", 1, "time compression `K` of the server (the simulator's --speed): wall-clock is also shown at K")
	f.pf.register(fs, "limits `FILE` from 'apidispatch probe' (or the original phase0_limits.json); without it lanes are cap-bound only", "expected output tokens per request (`N`); default min(max_tokens, 100)")
	f.latency = fs.Float64("latency", 0, "mean latency of one request in API `SECONDS`; default from the model and its expected output")
	f.countTokens = fs.Bool("count-tokens", false, "ask the free count_tokens endpoint, with the first Anthropic org's key, for the input tokens of a sample of the Anthropic requests")
	f.countSample = fs.Int64("count-sample", plan.DefaultCountSample, "how many requests --count-tokens counts, spread over the file (`N`; 0 counts every request)")
	f.fromRun = fs.String("from-run", "", "re-project from what a run directory's finished items measured (`DIR`, e.g. after 'run --pilot N')")
	f.pilot = fs.Int64("pilot", 0, "not a plan flag: 'apidispatch run --pilot N' sends a pilot and re-projects; 'plan --from-run DIR' re-projects from it")
	f.phase6 = fs.Bool("phase6", false, "plan the Phase 6 A/B instead of a file: the judge workload (claude-sonnet-4-5-20250929, max_tokens 256) sent by both arms")
	f.phase6N = fs.Int64("n", plan.Phase6N, "items per arm for --phase6 (`N`)")
	f.deadline = fs.Duration("deadline", 0, "also show what --route auto would do to end within this wall-clock `DURATION` (at the server's speed K, like 'run --deadline'): the cheapest split of batch and sync items that ends by 85% of it")
	f.batchSize = fs.Int64("batch-size", plan.MaxBatchRequests, "requests per batch of the batch route (`N`, 1 to 100,000)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, planUsage)
		fs.PrintDefaults()
	}
}

func planCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	var f planFlags
	f.register(fs, stderr)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *f.pilot != 0 {
		errf(stderr, "--pilot sends requests, so it belongs to 'apidispatch run --pilot N'; to re-project from a finished pilot use 'plan --from-run RUN_DIR'")
		return exitUsage
	}
	if *f.phase6 != (fs.NArg() == 0) || fs.NArg() > 1 {
		fs.Usage()
		return exitUsage
	}
	if err := f.check(fs); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	in, budget, closeCache, err := f.input(fs.Arg(0), stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeCache()
	bs := int64(0)
	if f.batchSizeSet {
		bs = *f.batchSize
	}
	pr, err := runner.Project(in, runner.ProjectOptions{Route: runner.RouteSync, Limits: in.Limits, BatchSize: bs, Deadline: *f.deadline, Speed: f.sf.speed})
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	g := plan.Gate(pr.Projection, in.Workload.N, plan.GateConfig{Budget: budget, Tolerance: f.sf.tolerance, Confirm: f.sf.confirm})
	if err := printPlan(pr.Projection, g, f.sf.json, stdout); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	return runner.GateStop(g.Decision).ExitCode()
}

// check validates the flags' values and their combinations.
func (f *planFlags) check(fs *flag.FlagSet) error {
	switch {
	case *f.phase6 && (*f.countTokens || *f.fromRun != ""):
		return errors.New("--phase6 plans a synthetic workload: --count-tokens and --from-run need a request file")
	case *f.phase6N < 1 || *f.phase6N > 10_000_000:
		return fmt.Errorf("--n %d: want 1 to 10,000,000 items", *f.phase6N)
	case f.pf.expectOut < 0 || *f.latency < 0 || *f.countSample < 0 || f.sf.speed <= 0:
		return errors.New("--expect-output, --latency and --count-sample must not be negative, --speed must be positive")
	case *f.deadline < 0:
		return fmt.Errorf("--deadline %v: want a positive duration", *f.deadline)
	case *f.batchSize < 1 || *f.batchSize > plan.MaxBatchRequests:
		return fmt.Errorf("--batch-size %d: want 1 to 100,000 requests per batch (the Message Batches maximum)", *f.batchSize)
	}
	fs.Visit(func(fl *flag.Flag) { f.batchSizeSet = f.batchSizeSet || fl.Name == "batch-size" })
	return nil
}

// input is what plan projects: the request file (or the Phase 6
// workload) with its token counts, pilot and cache hits, the budget, and
// what closes the result cache.
func (f *planFlags) input(input string, stderr io.Writer) (in plan.Input, budget cost.Nanos, closeCache func(), err error) {
	sf := &f.sf
	prices, err := sf.loadPrices()
	if err != nil {
		return in, 0, nil, err
	}
	if budget, err = sf.gateFlags.parse(); err != nil {
		return in, 0, nil, err
	}
	limits, err := f.pf.load()
	if err != nil {
		return in, 0, nil, err
	}
	// Plan needs only the orgs' names; with no keys configured it plans
	// for the orgs of the limits file (or one org).
	orgs, err := sf.loadOrgs(stderr)
	if err != nil && (sf.orgsFile != "" || !errors.Is(err, org.ErrNoOrgs) || *f.countTokens) {
		return in, 0, nil, err
	}
	var names, oaNames []string
	for _, o := range orgs {
		if o.ProviderName() == org.OpenAI {
			oaNames = append(oaNames, o.Name)
		} else {
			names = append(names, o.Name)
		}
	}
	in = plan.Input{Prices: prices, Orgs: names, OpenAIOrgs: oaNames, Caps: sf.caps, Limits: limits, ExpectOutput: f.pf.expectOut,
		LatencyS: *f.latency, Speed: sf.speed}
	if *f.phase6 {
		in.Workload, err = plan.JudgeSummary(int(*f.phase6N), 0, workload.GenOptions{})
		in.Arms = plan.Phase6Arms
		return in, budget, func() {}, err
	}
	closeCache, err = f.fileInput(input, orgs, &in, stderr)
	return in, budget, closeCache, err
}

// fileInput validates the request file into in, and adds what
// --count-tokens, --from-run and the result cache say about it.
func (f *planFlags) fileInput(input string, orgs []org.Org, in *plan.Input, stderr io.Writer) (closeCache func(), err error) {
	sf := &f.sf
	ctx := context.Background()
	if in.Workload, err = rundir.Validate(input, in.Prices); err != nil {
		return nil, fmt.Errorf("%s: %w", input, err)
	}
	if *f.countTokens {
		if sf.baseURL != "" {
			if _, err := apihttp.CheckBaseURL(sf.baseURL); err != nil {
				return nil, err
			}
		}
		// count_tokens is Anthropic's: it counts the Anthropic requests
		// with the first Anthropic org's key; OpenAI requests keep their
		// local estimates.
		i := slices.IndexFunc(orgs, func(o org.Org) bool { return o.ProviderName() != org.OpenAI })
		switch {
		case len(in.Workload.Models) == 0:
			fmt.Fprintln(stderr, "--count-tokens: the file has no Anthropic requests to count (OpenAI requests keep their local estimates)")
		case i < 0:
			return nil, errors.New("--count-tokens asks Anthropic's count_tokens endpoint with an Anthropic org's key, and the orgs have none (OpenAI requests keep their local estimates)")
		default:
			fmt.Fprintf(stderr, "counting input tokens with count_tokens (org %s, key %s)...\n", orgs[i].Name, orgs[i].Key.Fingerprint())
			in.Counts, err = plan.CountTokens(ctx, input, in.Workload, plan.CountConfig{BaseURL: sf.baseURL, Key: orgs[i].Key, Sample: *f.countSample})
			if err != nil {
				return nil, fmt.Errorf("count_tokens: %w", err)
			}
		}
	}
	if *f.fromRun != "" {
		if in.Pilot, err = pilotFromRun(ctx, *f.fromRun, in.Workload); err != nil {
			return nil, err
		}
	}
	rc, cmode, err := f.cf.open(false)
	if err != nil {
		return nil, err
	}
	closeCache = func() {}
	if rc != nil {
		closeCache = func() { rc.Close() }
	}
	if err := f.cf.project(ctx, rc, cmode, input, in, sf.baseURL); err != nil {
		closeCache()
		return nil, err
	}
	return closeCache, nil
}

// printPlan prints the projection and the gate's decision, as tables or
// one JSON object.
func printPlan(p *plan.Projection, g plan.GateResult, asJSON bool, stdout io.Writer) error {
	if !asJSON {
		return p.WriteText(stdout, g)
	}
	b, err := p.JSON(g)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, string(b))
	return nil
}

// pilotFromRun measures the finished items of a run directory made for the
// same input.
func pilotFromRun(ctx context.Context, dir string, ws *workload.Summary) (*plan.PilotStats, error) {
	st, err := rundir.OpenStore(dir)
	if err != nil {
		return nil, fmt.Errorf("--from-run: %w", err)
	}
	defer st.Close()
	meta, err := st.Meta(ctx)
	if err != nil {
		return nil, fmt.Errorf("--from-run %s: %w", dir, err)
	}
	if meta.InputHash != ws.Hash {
		return nil, fmt.Errorf("--from-run %s: the run was made for another input file (%s), or the input changed since", dir, meta.InputPath)
	}
	return plan.PilotFromStore(ctx, st, 0)
}
