package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
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
	deadline := fs.Duration("deadline", 0, "how long the run may take (`DURATION`): admission stops then and the run ends incomplete and resumable; --route auto plans to end before it")
	giveUp := fs.Duration("give-up-after", dispatch.DefaultGiveUpAfter, "stop, incomplete and resumable, when no request has reached the API for this long while requests fail to connect (`DURATION`; 0 waits for ever)")
	debugHTTP := fs.String("debug-http", "", debugHTTPUsage)
	route := fs.String("route", runner.RouteSync, "which API carries the items (`ROUTE`): sync (the Messages API), batch (the Message Batches API: half the price, up to 24 h) or auto (the cheapest mix that ends before --deadline)")
	batchSize := fs.Int("batch-size", 0, "most requests per batch (`N`, 1 to 100,000; default an even share of the orgs, at most 100,000); batches are also cut at 256 MB")
	cancel := fs.Bool("cancel", false, "cancel this run's open batches, harvest what they finished and send nothing new (the rest stays pending)")
	var shf sharedFlags
	shf.register(fs)
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on `ADDR` (a loopback address such as 127.0.0.1:9464) at /metrics")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch run REQUESTS.jsonl [flags]

Sends every request of a Message Batches request file across every org's key
and writes one result line per custom_id. By default (--route sync) it uses
the Messages API, one polite lane per (org, model pool); --route batch sends
them as Message Batches (half the price; placed on orgs by queue headroom,
polled and harvested into the same results file); --route auto sends the
cheapest mix of both that ends before --deadline. Re-running the same command
resumes: only unfinished items are sent, and open batches are re-attached.
The first SIGINT/SIGTERM stops admission and lets in-flight requests finish
(--grace), leaving batches running on the API; a second abandons in-flight
requests at once (with --route batch or auto the process exits then: the
run's state is on disk and the same command resumes). --pilot N sends the
first N items by sync, at the full price, whatever the route. Exit codes:
0 complete, 1 usage or input error, 2 paused by the budget gate, 3 refused
(--confirm required, or the run directory in use by another process),
4 incomplete (resumable: rerun the same command), 5 data-loss check failed,
6 needs a person (a failure every resume would repeat: a batch whose results
hold custom_ids it was not given, a batch unknown to the API for an hour, a
lost create whose look-alike batches never end; the message says what to do).

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
	if *batchSize < 0 || *batchSize > batch.MaxRequests {
		errf(stderr, "--batch-size %d: a batch holds 1 to %d requests (the API's limit)", *batchSize, batch.MaxRequests)
		return exitUsage
	}
	if *deadline < 0 {
		errf(stderr, "--deadline %s: want a positive duration", *deadline)
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
		if _, err := apihttp.CheckBaseURL(sf.baseURL); err != nil {
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
	var limits *plan.Limits
	if *limitsFile != "" {
		if limits, err = plan.LoadLimits(*limitsFile); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}
	cf.forRoute(fs, *route, stderr)
	rc, cmode, err := cf.open(true)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if rc != nil {
		defer rc.Close()
	}
	wrap, closeWire, err := openWireLog(*debugHTTP, stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeWire()

	sync := dispatch.Config{
		Orgs: orgs, BaseURL: sf.baseURL, Caps: sf.caps, Speed: sf.speed, Prices: prices,
		MaxCost: maxCost, Grace: *grace, GiveUpAfter: *giveUp, Log: log, WrapTransport: wrap,
	}
	if *giveUp == 0 {
		sync.GiveUpAfter = -1 // the flag's 0 is "never"; the Config's is the default
	}
	cf.wire(&sync, rc, cmode)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
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
				switch {
				case n == 1:
					fmt.Fprintln(stderr, "stopping: letting in-flight requests finish, leaving open batches running (signal again to abandon in-flight requests)")
					stop()
				case *route != runner.RouteSync:
					// The batch route has nothing in flight to wait for: its
					// batches run on the API, and the store, committed after
					// every step, is the truth the resume reads.
					if eng != nil {
						eng.Abort()
					}
					fmt.Fprintln(stderr, "abandoning: exiting now; open batches keep running on the API and the same command re-attaches to them")
					os.Exit(exitIncomplete)
				case eng != nil:
					eng.Abort()
				}
			}
		}
	}()
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	var shared func() any
	cfg := runner.Config{
		Input: input, RunDir: sf.runDir, ResultsPath: sf.out, SummaryPath: sf.summary, Prices: prices, Sync: sync,
		Budget: budget, Tolerance: sf.tolerance, Confirm: sf.confirm, Limits: limits, ExpectOutput: *expectOut,
		Pilot: *pilot, Deadline: *deadline, Route: *route, BatchSize: *batchSize, Cancel: *cancel, Stderr: stderr,
		OnJob: func(job *rundir.Job, c *dispatch.Config) (func(), error) {
			var closers []func()
			cleanup := func() {
				for _, f := range slices.Backward(closers) {
					f()
				}
			}
			if *route == runner.RouteBatch && shf.url != "" && *pilot <= 0 {
				// The batch route holds no request slots: nothing to share
				// (a pilot sends its items by sync, on the key's slots).
				msg := "--shared is not used by --route batch (the Message Batches API holds no request slots of a key); going on without Redis"
				fmt.Fprintln(stderr, "note: "+msg)
				job.Events.Emit(rundir.EventWarning, msg, nil)
				shf = sharedFlags{}
			}
			sb, err := shf.open(ctx, orgs, job.Events)
			if err != nil {
				return nil, err
			}
			if sb != nil {
				c.NewGate = sb.NewGate
				sb.Start()
				closers = append(closers, func() { sb.Close() })
				shared = func() any { return sb.Stats() }
			}
			if *metricsAddr != "" {
				m, err := startMetrics(*metricsAddr, stderr)
				if err != nil {
					cleanup()
					return nil, err
				}
				closers = append(closers, func() { m.Close() })
				c.NewGate = m.Wrap(c.NewGate)
			}
			return cleanup, nil
		},
		OnEngine: func(eng *dispatch.Engine) func() {
			engineReady <- eng
			if sf.quiet {
				return func() {}
			}
			pctx, pstop := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				dispatch.WatchProgress(pctx, eng, stderr, tty)
			}()
			return func() { pstop(); <-done }
		},
		Finish: func(s *rundir.Summary) {
			if shared != nil {
				s.Shared = shared()
			}
		},
	}
	if !sf.quiet {
		cfg.OnBatch = func(rt *batch.Route) func() { return watchBatches(rt, stderr) }
	}
	out := runner.Run(ctx, cfg)
	return report1(out, sf, stdout, stderr)
}

// watchBatches prints a line about the batch route every few seconds until
// the returned function is called.
func watchBatches(rt *batch.Route, stderr io.Writer) func() {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(stderr, "batches: %d requests in open batches\n", rt.Held())
			}
		}
	}()
	return func() { close(done); <-exited }
}

// report1 prints a run's outcome and returns its exit code.
func report1(out runner.Outcome, sf sendFlags, stdout, stderr io.Writer) int {
	s := out.Summary
	if s == nil {
		if out.Err != nil {
			errf(stderr, "%v", out.Err)
		}
		return out.Code
	}
	if sf.json {
		b, _ := json.Marshal(s)
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "%d succeeded, %d errored, %d unfinished of %d; cost $%.6f; %d attempts, %d 429s; %.0f req/min; data-loss check %s\n",
			s.Succeeded, s.Errored, s.Unfinished, s.N, s.Cost.Total, s.Attempts, s.RateLimited429, s.RequestsPerMin, passFail(s.DataLoss.Passed))
		if b := s.Batches; b != nil {
			line := fmt.Sprintf("batches: %d created (%d adopted after a lost answer), %d harvested, %d open; %d results sent again", b.Created, b.Adopted, b.Harvested, b.Open, b.Retried)
			if r := s.ByRoute["batch"]; r != nil {
				line += fmt.Sprintf("; batch route $%.6f for %d items ($%.6f at the sync price)", r.CostUSD, r.Items, r.SyncPriceUSD)
			}
			if r := s.ByRoute["sync"]; r != nil && s.Route == runner.RouteAuto {
				line += fmt.Sprintf("; sync route $%.6f for %d items", r.CostUSD, r.Items)
			}
			fmt.Fprintln(stdout, line)
		}
		if c := s.Cache; c != nil {
			fmt.Fprintf(stdout, "cache: %d hits (%d duplicates inside the input), %d misses; $%.6f saved\n", c.Hits, c.InputDuplicates, c.Misses, c.SavedUSD)
		}
		fmt.Fprintf(stdout, "results: %s\nsummary: %s\n", out.ResultsPath, out.Dir+"/"+rundir.SummaryFile)
	}
	if out.Err != nil {
		errf(stderr, "%v", out.Err)
	}
	return out.Code
}

func passFail(ok bool) string {
	if ok {
		return "passed"
	}
	return "FAILED"
}
