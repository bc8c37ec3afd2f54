package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/apidispatch/apidispatch/ab"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/report"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/shared"
)

func init() {
	register("ab", "the back-to-back A/B validation: legacy single-org path vs the dispatcher", abCmd)
}

func abCmd(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := watchStop(ctx, stop, stderr)
	defer done()
	return runAB(ctx, args, stdout, stderr, nil)
}

// watchStop announces the wind-down when ctx ends before done is called:
// after the first signal the arms wind down (the dispatcher lets requests in
// flight finish); stop then restores the default handling, so a second
// signal ends the process at once, which loses nothing: the dispatcher's
// state is durable and the legacy arm is rerun from the start. done ends the
// watcher and waits for it; a run that ends without a signal prints nothing
// more, so its output ends on its result (issue 15).
func watchStop(ctx context.Context, stop context.CancelFunc, stderr io.Writer) (done func()) {
	finished := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
			fmt.Fprintln(stderr, "stopping: the arm in progress winds down (signal again to quit at once); rerun the same command to resume")
			stop()
		case <-finished:
		}
	}()
	return func() {
		close(finished)
		<-exited
	}
}

// runAB is the ab command; tune, when not nil, adjusts the harness's
// configuration before it runs (tests inject faults through it).
func runAB(ctx context.Context, args []string, stdout, stderr io.Writer, tune func(*ab.Config)) int {
	fs := flag.NewFlagSet("ab", flag.ContinueOnError)
	n := fs.Int("n", 0, "items per arm (`N`; the Phase 6 run is 141600)")
	confirm := fs.Bool("confirm", false, "required when the projected total of both arms is ≥ $100 or the arms send ≥ 50,000 requests together")
	budget := fs.String("budget", "", "pre-flight gate in `USD` on the total of both arms: pause (exit 2) when the projection exceeds budget×(1+tolerance)")
	tolerance := fs.Float64("tolerance", 0.5, "tolerance `F` of the budget gate")
	orgsFile := fs.String("orgs", "", "TOML file of orgs (`FILE`); the first org is the legacy arm's; without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME> and ANTHROPIC_BATCH_KEY")
	out := fs.String("out", "", "also write the result JSON to `FILE` (e.g. phase6_full.json)")
	dir := fs.String("dir", "", "A/B `DIR`: ab.json, events.jsonl, requests.jsonl, baseline/ and dispatcher/ (default runs/ab_n<N>); rerun with the same DIR to resume")
	statusFile := fs.String("status-file", "", "markdown `FILE` whose apidispatch:ab section is written (replaced in place on rerun; the rest is untouched)")
	useSim := fs.Bool("sim", false, "run both arms against the embedded simulator (the default when no key is configured)")
	speed := fs.Float64("speed", 0, fmt.Sprintf("speed factor `K`: the embedded simulator's (default %d), or an external simulator's behind --base-url (default 1: the real API)", ab.DefaultSpeed))
	order := fs.String("order", ab.OrderAB, "order of the arms: ab, ba, or abab (two rounds, reported with their mean)")
	armsList := fs.String("arms", "legacy,dispatcher", "the arms `LIST`: legacy and dispatcher, and batch to also send every item as Message Batches over every org (at the batch price) after the two arms of each round")
	seed := fs.Int64("seed", 0, "seed of the workload (and of the embedded simulator)")
	baseURL := fs.String("base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` for live runs (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	var caps capsFlag
	fs.Var(&caps, "cap", "the dispatcher's polite per-key caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	expectOut := fs.Int64("expect-output", 0, "expected output tokens per request for the cost projection (`N`; default min(max_tokens, 100))")
	prices := fs.String("prices", "", "price table `FILE` overriding the embedded one")
	quiet := fs.Bool("quiet", false, "no progress lines")
	jsonOut := fs.Bool("json", false, "print the result JSON as one line on stdout")
	var cf cacheFlags
	cf.register(fs) // the dispatcher arm's; the legacy arm has no cache
	var shf sharedFlags
	shf.register(fs) // the dispatcher arm's; the legacy arm is one process's SDK client
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch ab --n N [--confirm] [flags]

The Phase 6 validation: the same judge workload (model claude-sonnet-4-5-20250929,
max_tokens 256) is sent by the legacy path — the first org's key alone, a fixed
concurrency of 50, the SDK's retries, failures kept as errors — and by the
dispatcher over every org, back to back in one process. Each arm reports its
wall-clock, cost from usage, outcomes, data-loss check, 429s, latency and per-org
split; the speed-up is wall A ÷ wall B (target ≥ 5×).

Before anything is sent: at least 2 orgs; the projected cost of both arms with its
arithmetic; the budget gate and the --confirm rule on that total; and a storm
self-test of the dispatcher on an embedded simulator (no item may be lost under a
sustained 429 storm).

With no key configured, or --sim, both arms run against the embedded simulator
(preset origin-3org) at speed factor K: a SIMULATION, reported with API-equivalent
times. Example: apidispatch ab --sim --n 141600 --confirm

The first SIGINT/SIGTERM winds the running arm down; a second quits at once.
With --arms legacy,dispatcher,batch a third arm sends every item as Message
Batches spread over every org, at the batch price, after the two arms of each
round; the projection and the gates count it at batch prices, and ab.json
gains arms.batch, batch_cost_ratio (batch cost ÷ dispatcher cost) and
batch_vs_dispatcher_wall.

Rerunning the same command (same --dir) reuses complete arms, resumes the
dispatcher's and the batch arm's (re-attaching to its open batches), and reruns
an incomplete legacy arm from the start.

Exit codes: 0 complete (whether or not the 5× target was met: see ab.json); 1 usage or configuration error; 2 paused by the budget
gate; 3 refused (--confirm missing, fewer than 2 orgs, storm self-test failed);
4 incomplete (rerun the same command to resume); 5 data-loss check failed.

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 || *n <= 0 {
		if *n <= 0 {
			errf(stderr, "--n must be a positive number of items")
		}
		fs.Usage()
		return exitUsage
	}
	arms, err := ab.ParseArms(*armsList)
	if err != nil {
		errf(stderr, "--arms %q: %v", *armsList, err)
		return exitUsage
	}
	cfg := ab.Config{Arms: arms,
		N: *n, Seed: *seed, Sim: *useSim, Speed: *speed, Order: strings.ToLower(*order), Out: *out,
		StatusFile: *statusFile, Tolerance: *tolerance, Confirm: *confirm, Caps: caps, Stderr: stderr,
		BaseURL: *baseURL, ExpectOutput: *expectOut, Report: report.Write,
	}
	if *quiet {
		cfg.ProgressEvery = -1
	}
	if cfg.Dir = *dir; cfg.Dir == "" {
		cfg.Dir = filepath.Join("runs", fmt.Sprintf("ab_n%d", *n))
	}
	if *budget != "" {
		b, err := cost.ParseUSD(*budget)
		if err != nil || b <= 0 {
			errf(stderr, "--budget %q: want a positive dollar amount", *budget)
			return exitUsage
		}
		cfg.Budget = b
	}
	sf := sendFlags{prices: *prices, orgsFile: *orgsFile}
	if cfg.Prices, err = sf.loadPrices(); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	var orgs []org.Org
	if !*useSim {
		orgs, err = sf.loadOrgs(stderr)
		switch {
		case errors.Is(err, org.ErrNoOrgs) && *orgsFile == "":
			fmt.Fprintln(stderr, "no API key in the environment: running both arms against the embedded simulator (SIMULATION)")
		case err != nil:
			errf(stderr, "%v", err)
			return exitUsage
		}
		cfg.Orgs = orgs
	}
	rc, cmode, err := cf.open(true)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if rc != nil {
		defer rc.Close()
		fmt.Fprintf(stderr, "the dispatcher arm uses the result cache %s (%s): its hits are not sent, so a warm cache makes the speed-up no like-for-like comparison\n", rc.Path(), cmode)
		cfg.Dispatch = func(c *dispatch.Config) { cf.wire(c, rc, cmode) }
	}
	if shf.url != "" {
		// Refuse at once when Redis cannot be reached (unless the fallback
		// is asked for); the arm's own budget is opened with its orgs.
		probe, err := shf.open(ctx, nil, nil)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		probe.Close()
		var budgets []*shared.Budget
		defer func() {
			for _, b := range budgets {
				b.Close()
			}
		}()
		prev := cfg.Dispatch
		fb := shf.fallback
		cfg.Dispatch = func(c *dispatch.Config) {
			if prev != nil {
				prev(c)
			}
			shf.fallback = "local" // reachable a moment ago; an outage now is mid-run
			b, err := shf.open(context.Background(), c.Orgs, c.Events)
			shf.fallback = fb
			if err != nil {
				errf(stderr, "shared budget: %v", err)
				return
			}
			b.Start(context.WithoutCancel(ctx))
			budgets = append(budgets, b)
			c.NewGate = b.NewGate
		}
	}
	if tune != nil {
		tune(&cfg)
	}

	if os.Getenv("GOGC") == "" && (len(cfg.Orgs) == 0 || cfg.Sim) {
		// Under the embedded simulator the A/B is CPU-bound on small
		// machines (the simulator and both clients share the process):
		// trade memory for fewer garbage collections, with a ceiling.
		defer debug.SetGCPercent(debug.SetGCPercent(400))
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(4 << 30))
	}
	res, err := ab.Run(ctx, cfg)
	if res != nil {
		if *jsonOut {
			b, _ := json.Marshal(res)
			fmt.Fprintln(stdout, string(b))
		} else {
			fmt.Fprintf(stdout, "%s\n\n%s\nresult: %s\nreport: %s\n", res.Headline, ab.HeadlineTable(res),
				filepath.Join(cfg.Dir, ab.ResultFile), filepath.Join(cfg.Dir, "report.html"))
			if cfg.Out != "" {
				fmt.Fprintf(stdout, "result copy: %s\n", cfg.Out)
			}
			if cfg.StatusFile != "" {
				fmt.Fprintf(stdout, "status: %s\n", cfg.StatusFile)
			}
		}
		if len(orgs) > 0 && !cfg.Sim {
			fps := make([]string, len(orgs))
			for i, o := range orgs {
				fps[i] = fmt.Sprintf("%s (%s)", o.Name, o.Key.Fingerprint())
			}
			fmt.Fprintf(stderr, "reminder: this A/B sent with the keys of %s; rotate them now that the validation is done\n", strings.Join(fps, ", "))
			for _, r := range runner.RotationReminders(orgs, time.Now()) {
				fmt.Fprintln(stderr, r)
			}
		} else {
			fmt.Fprintln(stderr, "keys: only the simulator's own keys were used; nothing to rotate")
		}
	}
	return abExit(err, stderr)
}

// abExit maps ab's errors to exit codes (design.md §10).
func abExit(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	errf(stderr, "%v", err)
	switch {
	case errors.Is(err, ab.ErrConfig):
		return exitUsage
	case errors.Is(err, ab.ErrPaused):
		return exitPaused
	case errors.Is(err, ab.ErrRefused):
		return exitRefused
	case errors.Is(err, ab.ErrDataLoss):
		return exitDataLoss
	case errors.Is(err, dispatch.ErrIncomplete):
		return exitIncomplete
	}
	return exitIncomplete
}
