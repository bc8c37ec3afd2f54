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
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/report"
)

func init() {
	register("run", "dispatch a request file across every org; resumable", runCmd)
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var sf sendFlags
	sf.register(fs)
	var cf cacheFlags
	cf.register(fs)
	pilot := fs.Int64("pilot", 0, "send the first `N` items first, re-project cost from them and apply the gates again before the rest")
	limitsFile := fs.String("limits", "", "limits `FILE` from 'apidispatch probe' for the projection")
	expectOut := fs.Int64("expect-output", 0, "expected output tokens per request for the projection (`N`)")
	grace := fs.Duration("grace", 30*time.Second, "after a stop signal, how long in-flight requests may finish")
	deadline := fs.Duration("deadline", 0, "stop admitting after this long (`DURATION`); the run ends incomplete and resumable")
	giveUp := fs.Duration("give-up-after", dispatch.DefaultGiveUpAfter, "stop, incomplete and resumable, when no request has reached the API for this long while requests fail to connect (`DURATION`; 0 waits for ever)")
	debugHTTP := fs.String("debug-http", "", debugHTTPUsage)
	var shf sharedFlags
	shf.register(fs)
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on `ADDR` (a loopback address such as 127.0.0.1:9464) at /metrics")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch run REQUESTS.jsonl [flags]

Sends every request of a Message Batches request file across every org's key,
one polite lane per (org, model pool), and writes one result line per
custom_id. Re-running the same command resumes: only unfinished items are sent.
The first SIGINT/SIGTERM stops admission and lets in-flight requests finish
(--grace); a second abandons them at once. Exit codes: 0 complete, 1 usage or
input error, 2 paused by the budget gate, 3 refused (--confirm required, or the
run directory in use by another process), 4 incomplete
(resumable), 5 data-loss check failed.

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	input := fs.Arg(0)
	log := newLogger(stderr, sf.quiet)

	prices, err := sf.loadPrices()
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	orgs, err := sf.loadOrgs(stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if sf.baseURL != "" {
		if _, err := dispatch.CheckBaseURL(sf.baseURL); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}
	var maxCost, budget cost.Nanos
	if sf.maxCost != "" {
		if maxCost, err = cost.ParseUSD(sf.maxCost); err != nil || maxCost <= 0 {
			errf(stderr, "--max-cost %q: want a positive dollar amount", sf.maxCost)
			return exitUsage
		}
	}
	if sf.budget != "" {
		if budget, err = cost.ParseUSD(sf.budget); err != nil || budget <= 0 {
			errf(stderr, "--budget %q: want a positive dollar amount", sf.budget)
			return exitUsage
		}
	}
	ws, err := dispatch.Validate(input, prices)
	if err != nil {
		errf(stderr, "%s: %v", input, err)
		return exitUsage
	}
	var limits *plan.Limits
	if *limitsFile != "" {
		if limits, err = plan.LoadLimits(*limitsFile); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}
	orgNames := make([]string, len(orgs))
	for i, o := range orgs {
		orgNames[i] = o.Name
	}
	rc, cmode, err := cf.open(true)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if rc != nil {
		defer rc.Close()
	}
	pin := plan.Input{Workload: ws, Prices: prices, Orgs: orgNames, Caps: sf.caps, Limits: limits, ExpectOutput: *expectOut, Speed: sf.speed}
	if err := cf.project(context.Background(), rc, cmode, input, &pin); err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	proj, err := plan.Project(pin)
	if err != nil {
		errf(stderr, "projecting: %v", err)
		return exitUsage
	}
	gcfg := plan.GateConfig{Budget: budget, Tolerance: sf.tolerance, Confirm: sf.confirm}
	if code := applyGate(proj, pin.Workload.N, gcfg, stderr); code != exitOK {
		return code
	}
	for _, r := range rotationReminders(orgs, time.Now()) {
		fmt.Fprintln(stderr, r)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	job, err := dispatch.OpenJob(ctx, dispatch.JobConfig{InputPath: input, RunDir: sf.runDir, ResultsPath: sf.out, Prices: prices}, ws)
	if err != nil {
		errf(stderr, "%v", err)
		if errors.Is(err, dispatch.ErrRunDirBusy) {
			return exitRefused
		}
		return exitUsage
	}
	defer job.Close()
	projJSON, _ := proj.JSON(plan.Gate(proj, pin.Workload.N, gcfg))

	cfg := dispatch.Config{
		Orgs: orgs, BaseURL: sf.baseURL, Caps: sf.caps, Speed: sf.speed, Prices: prices,
		MaxCost: maxCost, Grace: *grace, GiveUpAfter: *giveUp, Log: log,
	}
	if *giveUp == 0 {
		cfg.GiveUpAfter = -1 // the flag's 0 is "never"; the Config's is the default
	}
	cf.wire(&cfg, rc, cmode)
	if *deadline > 0 {
		cfg.Deadline = time.Now().Add(*deadline)
	}
	wrap, closeWire, err := openWireLog(*debugHTTP, stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeWire()
	cfg.WrapTransport = wrap

	sb, err := shf.open(ctx, orgs, job.Events)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if sb != nil {
		cfg.NewGate = sb.NewGate
		sb.Start()
		defer sb.Close()
		sf.sharedStats = func() any { return sb.Stats() }
	}
	if *metricsAddr != "" {
		m, err := startMetrics(*metricsAddr, stderr)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		defer m.Close()
		cfg.NewGate = m.Wrap(cfg.NewGate)
	}

	// Signals: the first stops admission, the second abandons in-flight work.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	engineReady := make(chan *dispatch.Engine, 4)
	go func() {
		n := 0
		var eng *dispatch.Engine
		for {
			select {
			case e := <-engineReady:
				eng = e
			case <-sigs:
				n++
				if n == 1 {
					fmt.Fprintln(stderr, "stopping: letting in-flight requests finish (signal again to abandon them)")
					stop()
				} else if eng != nil {
					eng.Abort()
				}
			}
		}
	}()

	runOnce := func(c dispatch.Config) (*dispatch.Result, error) {
		eng, err := job.Engine(c)
		if err != nil {
			return nil, err
		}
		engineReady <- eng
		pctx, pstop := context.WithCancel(ctx)
		done := make(chan struct{})
		if !sf.quiet {
			go func() {
				defer close(done)
				tty := false
				if f, ok := stderr.(*os.File); ok {
					tty = term.IsTerminal(int(f.Fd()))
				}
				dispatch.WatchProgress(pctx, eng, stderr, tty)
			}()
		} else {
			close(done)
		}
		res, err := eng.Run(ctx)
		pstop()
		<-done
		return res, err
	}

	if *pilot > 0 && *pilot < ws.N {
		pc := cfg
		pc.MaxSeq = *pilot
		res, err := runOnce(pc)
		if err != nil && !errors.Is(err, dispatch.ErrIncomplete) {
			errf(stderr, "%v", err)
			return exitIncomplete
		}
		if ctx.Err() != nil {
			return finishRun(job, res, err, sf, projJSON, stdout, stderr)
		}
		ps, perr := plan.PilotFromStore(ctx, job.Store, *pilot)
		if perr != nil {
			errf(stderr, "reading the pilot: %v", perr)
			return exitIncomplete
		}
		pin.Pilot = ps
		if proj, err = plan.Project(pin); err != nil {
			errf(stderr, "re-projecting: %v", err)
			return exitIncomplete
		}
		fmt.Fprintf(stderr, "pilot of %d items done; re-projected expected cost %s (worst case %s)\n", *pilot, proj.ExpectedCost, proj.WorstCase)
		projJSON, _ = proj.JSON(plan.Gate(proj, pin.Workload.N, gcfg))
		if code := applyGate(proj, pin.Workload.N, gcfg, stderr); code != exitOK {
			return code
		}
	}
	res, err := runOnce(cfg)
	return finishRun(job, res, err, sf, projJSON, stdout, stderr)
}

// applyGate prints the gate's arithmetic and returns the exit code it demands.
func applyGate(p *plan.Projection, n int64, g plan.GateConfig, stderr io.Writer) int {
	gr := plan.Gate(p, n, g)
	switch gr.Decision {
	case "pause":
		fmt.Fprintln(stderr, "paused by the budget gate; nothing sent:")
		fmt.Fprintln(stderr, gr.Explain)
		return exitPaused
	case "confirm_required":
		fmt.Fprintln(stderr, "refused: --confirm is required for this run; nothing sent:")
		fmt.Fprintln(stderr, gr.Explain)
		return exitRefused
	}
	if gr.Explain != "" {
		fmt.Fprintln(stderr, gr.Explain)
	}
	return exitOK
}

func finishRun(job *dispatch.Job, res *dispatch.Result, runErr error, sf sendFlags, projJSON []byte, stdout, stderr io.Writer) int {
	if res == nil || res.Summary == nil {
		errf(stderr, "%v", runErr)
		return exitIncomplete
	}
	s := res.Summary
	s.Projection = projJSON
	if sf.sharedStats != nil {
		s.Shared = sf.sharedStats()
	}
	if err := job.WriteSummary(s, sf.summary); err != nil {
		errf(stderr, "writing the summary: %v", err)
	}
	if err := job.Events.Flush(); err != nil {
		errf(stderr, "writing events: %v", err)
	}
	if err := report.Write(job.Dir); err != nil {
		errf(stderr, "writing the report: %v", err)
	}
	if sf.json {
		b, _ := json.Marshal(s)
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "%d succeeded, %d errored, %d unfinished of %d; cost $%.6f; %d attempts, %d 429s; %.0f req/min; data-loss check %s\n",
			s.Succeeded, s.Errored, s.Unfinished, s.N, s.Cost.Total, s.Attempts, s.RateLimited429, s.RequestsPerMin, passFail(s.DataLoss.Passed))
		if c := s.Cache; c != nil {
			fmt.Fprintf(stdout, "cache: %d hits (%d duplicates inside the input), %d misses; $%.6f saved\n", c.Hits, c.InputDuplicates, c.Misses, c.SavedUSD)
		}
		fmt.Fprintf(stdout, "results: %s\nsummary: %s\n", job.ResultsPath, job.Dir+"/"+dispatch.SummaryFile)
	}
	switch {
	case !s.DataLoss.Passed:
		errf(stderr, "DATA-LOSS CHECK FAILED: %+v", s.DataLoss)
		return exitDataLoss
	case runErr != nil:
		errf(stderr, "%v", runErr)
		return exitIncomplete
	case !res.Complete:
		return exitIncomplete
	}
	return exitOK
}

func passFail(ok bool) string {
	if ok {
		return "passed"
	}
	return "FAILED"
}
