package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/workload"
)

func init() {
	register("plan", "project cost and wall-clock of a request file; check the budget gates", planCmd)
}

func planCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	var sf sendFlags
	var cf cacheFlags
	cf.register(fs)
	fs.StringVar(&sf.orgsFile, "orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from the environment (only their names are used, except by --count-tokens)")
	fs.StringVar(&sf.baseURL, "base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` for --count-tokens, and whose answers in --cache count as hits (env ANTHROPIC_BASE_URL; default https://api.anthropic.com)")
	fs.Var(&sf.caps, "cap", "polite per-key concurrency caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	fs.StringVar(&sf.budget, "budget", "", "budget gate in `USD`: pause (exit 2) when the expected cost exceeds budget×(1+tolerance)")
	fs.Float64Var(&sf.tolerance, "tolerance", 0.5, "tolerance `F` of the budget gate")
	fs.BoolVar(&sf.confirm, "confirm", false, "accept a run whose projected cost is ≥ $100 or N ≥ 50,000 (otherwise exit 3)")
	fs.BoolVar(&sf.json, "json", false, "print the projection as one JSON object (design.md §7) instead of tables")
	fs.StringVar(&sf.prices, "prices", "", "price table `FILE` overriding the embedded one")
	fs.Float64Var(&sf.speed, "speed", 1, "time compression `K` of the server (the simulator's --speed): wall-clock is also shown at K")
	limitsFile := fs.String("limits", "", "limits `FILE` from 'apidispatch probe' (or the original phase0_limits.json); without it lanes are cap-bound only")
	expectOut := fs.Int64("expect-output", 0, "expected output tokens per request (`N`); default min(max_tokens, 100)")
	latency := fs.Float64("latency", 0, "mean latency of one request in API `SECONDS`; default from the model and its expected output")
	countTokens := fs.Bool("count-tokens", false, "ask the free count_tokens endpoint, with the first org's key, for the input tokens of a sample of the requests")
	countSample := fs.Int64("count-sample", plan.DefaultCountSample, "how many requests --count-tokens counts, spread over the file (`N`; 0 counts every request)")
	fromRun := fs.String("from-run", "", "re-project from what a run directory's finished items measured (`DIR`, e.g. after 'run --pilot N')")
	pilot := fs.Int64("pilot", 0, "not a plan flag: 'apidispatch run --pilot N' sends a pilot and re-projects; 'plan --from-run DIR' re-projects from it")
	phase6 := fs.Bool("phase6", false, "plan the Phase 6 A/B instead of a file: the judge workload (claude-sonnet-4-5-20250929, max_tokens 256) sent by both arms")
	phase6N := fs.Int64("n", plan.Phase6N, "items per arm for --phase6 (`N`)")
	deadline := fs.Duration("deadline", 0, "also show what --route auto would do to end within this wall-clock `DURATION` (at the server's speed K, like 'run --deadline'): the cheapest split of batch and sync items that ends by 85% of it")
	batchSize := fs.Int64("batch-size", plan.MaxBatchRequests, "requests per batch of the batch route (`N`, 1 to 100,000)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch plan REQUESTS.jsonl [flags]
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

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *pilot != 0 {
		errf(stderr, "--pilot sends requests, so it belongs to 'apidispatch run --pilot N'; to re-project from a finished pilot use 'plan --from-run RUN_DIR'")
		return exitUsage
	}
	if *phase6 != (fs.NArg() == 0) || fs.NArg() > 1 {
		fs.Usage()
		return exitUsage
	}
	if *phase6 && (*countTokens || *fromRun != "") {
		errf(stderr, "--phase6 plans a synthetic workload: --count-tokens and --from-run need a request file")
		return exitUsage
	}
	if *phase6N < 1 || *phase6N > 10_000_000 {
		errf(stderr, "--n %d: want 1 to 10,000,000 items", *phase6N)
		return exitUsage
	}
	if *expectOut < 0 || *latency < 0 || *countSample < 0 || sf.speed <= 0 {
		errf(stderr, "--expect-output, --latency and --count-sample must not be negative, --speed must be positive")
		return exitUsage
	}
	if *deadline < 0 {
		errf(stderr, "--deadline %v: want a positive duration", *deadline)
		return exitUsage
	}
	if *batchSize < 1 || *batchSize > plan.MaxBatchRequests {
		errf(stderr, "--batch-size %d: want 1 to 100,000 requests per batch (the Message Batches maximum)", *batchSize)
		return exitUsage
	}
	batchSizeSet := false
	fs.Visit(func(f *flag.Flag) { batchSizeSet = batchSizeSet || f.Name == "batch-size" })
	prices, err := sf.loadPrices()
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	var budget cost.Nanos
	if sf.budget != "" {
		if budget, err = cost.ParseUSD(sf.budget); err != nil || budget <= 0 {
			errf(stderr, "--budget %q: want a positive dollar amount", sf.budget)
			return exitUsage
		}
	}
	var limits *plan.Limits
	if *limitsFile != "" {
		if limits, err = plan.LoadLimits(*limitsFile); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}
	// Plan needs only the orgs' names; with no keys configured it plans
	// for the orgs of the limits file (or one org).
	orgs, err := sf.loadOrgs(stderr)
	if err != nil && (sf.orgsFile != "" || !errors.Is(err, org.ErrNoOrgs) || *countTokens) {
		errf(stderr, "%v", err)
		return exitUsage
	}
	var names []string
	for _, o := range orgs {
		names = append(names, o.Name)
	}

	in := plan.Input{Prices: prices, Orgs: names, Caps: sf.caps, Limits: limits, ExpectOutput: *expectOut,
		LatencyS: *latency, Speed: sf.speed}
	ctx := context.Background()
	if *phase6 {
		if in.Workload, err = plan.JudgeSummary(int(*phase6N), 0, workload.GenOptions{}); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		in.Arms = plan.Phase6Arms
	} else {
		input := fs.Arg(0)
		if in.Workload, err = rundir.Validate(input, prices); err != nil {
			errf(stderr, "%s: %v", input, err)
			return exitUsage
		}
		if *countTokens {
			if sf.baseURL != "" {
				if _, err := apihttp.CheckBaseURL(sf.baseURL); err != nil {
					errf(stderr, "%v", err)
					return exitUsage
				}
			}
			fmt.Fprintf(stderr, "counting input tokens with count_tokens (org %s, key %s)...\n", orgs[0].Name, orgs[0].Key.Fingerprint())
			in.Counts, err = plan.CountTokens(ctx, input, in.Workload, plan.CountConfig{BaseURL: sf.baseURL, Key: orgs[0].Key, Sample: *countSample})
			if err != nil {
				errf(stderr, "count_tokens: %v", err)
				return exitUsage
			}
		}
		if *fromRun != "" {
			if in.Pilot, err = pilotFromRun(ctx, *fromRun, in.Workload); err != nil {
				errf(stderr, "%v", err)
				return exitUsage
			}
		}
		rc, cmode, err := cf.open(false)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		if rc != nil {
			defer rc.Close()
		}
		if err := cf.project(ctx, rc, cmode, input, &in, sf.baseURL); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}

	p, err := plan.Project(in)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	bm := limits.BatchModel()
	if batchSizeSet {
		bm.MaxBatch = *batchSize
	}
	if _, err := plan.ProjectRoutes(p, in, bm, deadline.Seconds()*sf.speed); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	g := plan.Gate(p, in.Workload.N, plan.GateConfig{Budget: budget, Tolerance: sf.tolerance, Confirm: sf.confirm})
	if sf.json {
		b, err := p.JSON(g)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		fmt.Fprintln(stdout, string(b))
	} else if err := p.WriteText(stdout, g); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	switch g.Decision {
	case plan.Pause:
		return exitPaused
	case plan.ConfirmRequired:
		return exitRefused
	}
	return exitOK
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
