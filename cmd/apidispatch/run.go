package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
)

func init() {
	register("run", "dispatch a request file across every org; resumable", runCmd)
}

// runUsage is 'run --help' before the flags.
const runUsage = `usage: apidispatch run REQUESTS.jsonl [flags]

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

flags:`

// runFlags are the flags of 'apidispatch run'.
type runFlags struct {
	sf                      sendFlags
	cf                      cacheFlags
	shf                     sharedFlags
	gf                      projectionFlags
	pilot                   *int64
	grace, deadline, giveUp *time.Duration
	debugHTTP, route        *string
	metricsAddr             *string
	batchSize               *int
	cancel                  *bool
}

func (rf *runFlags) register(fs *flag.FlagSet, stderr io.Writer) {
	rf.sf.register(fs)
	rf.cf.register(fs)
	rf.pilot = fs.Int64("pilot", 0, "send the first `N` items first, re-project cost from them and apply the gates again before the rest")
	rf.gf.register(fs, "limits `FILE` from 'apidispatch probe' for the projection", "expected output tokens per request for the projection (`N`)")
	rf.grace = fs.Duration("grace", 30*time.Second, "after a stop signal, how long in-flight requests may finish")
	rf.deadline = fs.Duration("deadline", 0, "how long the run may take (`DURATION`): admission stops then and the run ends incomplete and resumable; --route auto plans to end before it")
	rf.giveUp = fs.Duration("give-up-after", dispatch.DefaultGiveUpAfter, "stop, incomplete and resumable, when no request has reached the API for this long while requests fail to connect (`DURATION`; 0 waits for ever)")
	rf.debugHTTP = fs.String("debug-http", "", debugHTTPUsage)
	rf.route = fs.String("route", runner.RouteSync, "which API carries the items (`ROUTE`): sync (the Messages API), batch (the Message Batches API: half the price, up to 24 h) or auto (the cheapest mix that ends before --deadline)")
	rf.batchSize = fs.Int("batch-size", 0, "most requests per batch (`N`, 1 to 100,000; default an even share of the orgs, at most 100,000); batches are also cut at 256 MB")
	rf.cancel = fs.Bool("cancel", false, "cancel this run's open batches, harvest what they finished and send nothing new (the rest stays pending)")
	rf.shf.register(fs)
	rf.metricsAddr = fs.String("metrics", "", "serve Prometheus metrics on `ADDR` (a loopback address such as 127.0.0.1:9464) at /metrics")
	fs.Usage = func() {
		fmt.Fprintln(stderr, runUsage)
		fs.PrintDefaults()
	}
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var rf runFlags
	rf.register(fs, stderr)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	cfg, closeAll, err := rf.config(fs, fs.Arg(0), stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeAll()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cfg.Abort = &runner.Aborter{}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := watchSignals(sigs, stop, cfg.Abort, cfg.Route != runner.RouteSync, stderr)
	defer done()
	return report1(runner.Run(ctx, cfg), rf.sf, stdout, stderr)
}

// config is the run the flags describe, and what to close after it (the
// result cache, the wire log).
func (rf *runFlags) config(fs *flag.FlagSet, input string, stderr io.Writer) (cfg runner.Config, closeAll func(), err error) {
	sf := &rf.sf
	c, err := sf.load(stderr)
	if err != nil {
		return cfg, nil, err
	}
	limits, err := rf.gf.load()
	if err != nil {
		return cfg, nil, err
	}
	rf.cf.forRoute(fs, *rf.route, stderr)
	rc, cmode, err := rf.cf.open(true)
	if err != nil {
		return cfg, nil, err
	}
	wrap, closeWire, err := openWireLog(*rf.debugHTTP, stderr)
	if err != nil {
		if rc != nil {
			rc.Close()
		}
		return cfg, nil, err
	}
	closeAll = func() {
		closeWire()
		if rc != nil {
			rc.Close()
		}
	}
	sync := dispatch.Config{
		Orgs: c.orgs, BaseURL: sf.baseURL, Caps: sf.caps, Speed: sf.speed, Prices: c.prices,
		MaxCost: c.maxCost, Grace: *rf.grace, GiveUpAfter: *rf.giveUp, Log: newLogger(stderr, sf.quiet), WrapTransport: wrap,
	}
	if *rf.giveUp == 0 {
		sync.GiveUpAfter = -1 // the flag's 0 is "never"; the Config's is the default
	}
	rf.cf.wire(&sync, rc, cmode)
	cfg = runner.Config{
		Input: input, RunDir: sf.runDir, ResultsPath: sf.out, SummaryPath: sf.summary, Prices: c.prices, Sync: sync,
		Budget: c.budget, Tolerance: sf.tolerance, Confirm: sf.confirm, Limits: limits, ExpectOutput: rf.gf.expectOut,
		Pilot: *rf.pilot, Deadline: *rf.deadline, Route: *rf.route, BatchSize: *rf.batchSize, Cancel: *rf.cancel,
		Shared: rf.shf.shared(), MetricsAddr: *rf.metricsAddr, Progress: !sf.quiet, TTY: isTerminal(stderr), Stderr: stderr,
	}
	return cfg, closeAll, nil
}

// watchSignals is a run's signal handling, on one goroutine that the
// returned done ends and waits for. The first signal stops admission
// (stop); the second abandons the requests in flight (abort), and with a
// batch route (exitOnSecond) exits at once: the state is on disk and the
// same command resumes.
func watchSignals(sigs <-chan os.Signal, stop context.CancelFunc, abort *runner.Aborter, exitOnSecond bool, stderr io.Writer) (done func()) {
	finished := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for n := 1; ; n++ {
			select {
			case <-finished:
				return
			case <-sigs:
			}
			switch {
			case n == 1:
				fmt.Fprintln(stderr, "stopping: letting in-flight requests finish, leaving open batches running (signal again to abandon in-flight requests)")
				stop()
			case exitOnSecond:
				// The batch route has nothing in flight to wait for: its
				// batches run on the API, and the store, committed after
				// every step, is the truth the resume reads.
				abort.Abort()
				fmt.Fprintln(stderr, "abandoning: exiting now; open batches keep running on the API and the same command re-attaches to them")
				os.Exit(exitIncomplete)
			default:
				abort.Abort()
			}
		}
	}()
	return func() {
		close(finished)
		<-exited
	}
}

// isTerminal says whether w is a terminal (the progress line is redrawn
// in place there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// report1 prints a run's outcome and returns its exit code.
func report1(out runner.Outcome, sf sendFlags, stdout, stderr io.Writer) int {
	s := out.Summary
	if s == nil {
		if out.Err != nil {
			errf(stderr, "%v", out.Err)
		}
		return out.Code()
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
	return out.Code()
}

func passFail(ok bool) string {
	if ok {
		return "passed"
	}
	return "FAILED"
}
