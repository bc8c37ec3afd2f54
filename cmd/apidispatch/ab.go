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
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/report"
	"github.com/apidispatch/apidispatch/runner"
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

// abUsage is 'ab --help' before the flags.
const abUsage = `usage: apidispatch ab --n N [--confirm] [flags]

The Phase 6 validation: the same judge workload (model claude-sonnet-4-5-20250929,
max_tokens 256) is sent by the legacy path — the first org's key alone, a fixed
concurrency of 50, the SDK's retries, failures kept as errors — and by the
dispatcher over every org, back to back in one process. Each arm reports its
wall-clock, cost from usage, outcomes, data-loss check, 429s, latency and per-org
split; the speed-up is wall A ÷ wall B (target ≥ 5×).

OpenAI orgs take no part (the workload is Claude's and the legacy arm is the
Anthropic SDK's path): they are left out with a note.

Before anything is sent: at least 2 Anthropic orgs; the projected cost of both arms with its
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

flags:`

// abFlags are the flags of 'apidispatch ab'.
type abFlags struct {
	gateFlags
	n                                                       *int
	orgsFile, out, dir, statusFile, order, armsList, prices *string
	baseURL                                                 *string
	useSim, quiet, jsonOut                                  *bool
	speed                                                   *float64
	seed, expectOut                                         *int64
	caps                                                    capsFlag
	cf                                                      cacheFlags
	shf                                                     sharedFlags
}

func (f *abFlags) register(fs *flag.FlagSet, stderr io.Writer) {
	f.n = fs.Int("n", 0, "items per arm (`N`; the Phase 6 run is 141600)")
	f.gateFlags.register(fs, "pre-flight gate in `USD` on the total of both arms: pause (exit 2) when the projection exceeds budget×(1+tolerance)",
		"required when the projected total of both arms is ≥ $100 or the arms send ≥ 50,000 requests together")
	f.orgsFile = fs.String("orgs", "", "TOML file of orgs (`FILE`); the first org is the legacy arm's; without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME> and ANTHROPIC_BATCH_KEY")
	f.out = fs.String("out", "", "also write the result JSON to `FILE` (e.g. phase6_full.json)")
	f.dir = fs.String("dir", "", "A/B `DIR`: ab.json, events.jsonl, requests.jsonl, baseline/ and dispatcher/ (default runs/ab_n<N>); rerun with the same DIR to resume")
	f.statusFile = fs.String("status-file", "", "markdown `FILE` whose apidispatch:ab section is written (replaced in place on rerun; the rest is untouched)")
	f.useSim = fs.Bool("sim", false, "run both arms against the embedded simulator (the default when no key is configured)")
	f.speed = fs.Float64("speed", 0, fmt.Sprintf("speed factor `K`: the embedded simulator's (default %d), or an external simulator's behind --base-url (default 1: the real API)", ab.DefaultSpeed))
	f.order = fs.String("order", ab.OrderAB, "order of the arms: ab, ba, or abab (two rounds, reported with their mean)")
	f.armsList = fs.String("arms", "legacy,dispatcher", "the arms `LIST`: legacy and dispatcher, and batch to also send every item as Message Batches over every org (at the batch price) after the two arms of each round")
	f.seed = fs.Int64("seed", 0, "seed of the workload (and of the embedded simulator)")
	f.baseURL = fs.String("base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` for live runs (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	fs.Var(&f.caps, "cap", "the dispatcher's polite per-key caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	f.expectOut = fs.Int64("expect-output", 0, "expected output tokens per request for the cost projection (`N`; default min(max_tokens, 100))")
	f.prices = fs.String("prices", "", "price table `FILE` overriding the embedded one")
	f.quiet = fs.Bool("quiet", false, "no progress lines")
	f.jsonOut = fs.Bool("json", false, "print the result JSON as one line on stdout")
	f.cf.register(fs)  // the dispatcher arm's; the legacy arm has no cache
	f.shf.register(fs) // the dispatcher arm's; the legacy arm is one process's SDK client
	fs.Usage = func() {
		fmt.Fprintln(stderr, abUsage)
		fs.PrintDefaults()
	}
}

// runAB is the ab command; tune, when not nil, adjusts the harness's
// configuration before it runs (tests inject faults through it).
func runAB(ctx context.Context, args []string, stdout, stderr io.Writer, tune func(*ab.Config)) int {
	fs := flag.NewFlagSet("ab", flag.ContinueOnError)
	var f abFlags
	f.register(fs, stderr)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 || *f.n <= 0 {
		if *f.n <= 0 {
			errf(stderr, "--n must be a positive number of items")
		}
		fs.Usage()
		return exitUsage
	}
	cfg, closeCache, err := f.config(stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeCache()
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
		printAB(res, cfg, *f.jsonOut, stdout, stderr)
	}
	if err != nil {
		errf(stderr, "%v", err)
	}
	return runner.StopOf(err).ExitCode()
}

// config is the A/B the flags describe, and what closes its result cache.
func (f *abFlags) config(stderr io.Writer) (ab.Config, func(), error) {
	arms, err := ab.ParseArms(*f.armsList)
	if err != nil {
		return ab.Config{}, nil, fmt.Errorf("--arms %q: %v", *f.armsList, err)
	}
	cfg := ab.Config{Arms: arms,
		N: *f.n, Seed: *f.seed, Sim: *f.useSim, Speed: *f.speed, Order: strings.ToLower(*f.order), Out: *f.out,
		StatusFile: *f.statusFile, Tolerance: f.tolerance, Confirm: f.confirm, Caps: f.caps, Stderr: stderr,
		BaseURL: *f.baseURL, ExpectOutput: *f.expectOut, Report: report.Write, Shared: f.shf.shared(),
	}
	if *f.quiet {
		cfg.ProgressEvery = -1
	}
	if cfg.Dir = *f.dir; cfg.Dir == "" {
		cfg.Dir = filepath.Join("runs", fmt.Sprintf("ab_n%d", *f.n))
	}
	if cfg.Budget, err = f.gateFlags.parse(); err != nil {
		return cfg, nil, err
	}
	sf := sendFlags{prices: *f.prices, orgsFile: *f.orgsFile}
	if cfg.Prices, err = sf.loadPrices(); err != nil {
		return cfg, nil, err
	}
	if !*f.useSim {
		cfg.Orgs, err = sf.loadOrgs(stderr)
		switch {
		case errors.Is(err, org.ErrNoOrgs) && *f.orgsFile == "":
			fmt.Fprintln(stderr, "no API key in the environment: running both arms against the embedded simulator (SIMULATION)")
		case err != nil:
			return cfg, nil, err
		}
	}
	rc, cmode, err := f.cf.open(true)
	if err != nil {
		return cfg, nil, err
	}
	if rc == nil {
		return cfg, func() {}, nil
	}
	fmt.Fprintf(stderr, "the dispatcher arm uses the result cache %s (%s): its hits are not sent, so a warm cache makes the speed-up no like-for-like comparison\n", rc.Path(), cmode)
	cfg.Cache, cfg.CacheMode, cfg.CacheSampled = rc, cmode, f.cf.sampled
	return cfg, func() { rc.Close() }, nil
}

// printAB prints the A/B's result and the keys to rotate.
func printAB(res *ab.Result, cfg ab.Config, jsonOut bool, stdout, stderr io.Writer) {
	if jsonOut {
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
	if len(cfg.Orgs) == 0 || cfg.Sim {
		fmt.Fprintln(stderr, "keys: only the simulator's own keys were used; nothing to rotate")
		return
	}
	fps := make([]string, len(cfg.Orgs))
	for i, o := range cfg.Orgs {
		fps[i] = fmt.Sprintf("%s (%s)", o.Name, o.Key.Fingerprint())
	}
	fmt.Fprintf(stderr, "reminder: this A/B sent with the keys of %s; rotate them now that the validation is done\n", strings.Join(fps, ", "))
	for _, r := range runner.RotationReminders(cfg.Orgs, time.Now()) {
		fmt.Fprintln(stderr, r)
	}
}
