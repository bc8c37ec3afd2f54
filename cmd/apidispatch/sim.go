package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/apidispatch/apidispatch/sim"
)

func init() {
	register("sim", "serve the API simulator on loopback", func(args []string, stdout, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runSim(ctx, args, stdout, stderr)
	})
}

const simHelp = `usage: apidispatch sim [--preset NAME] [--config FILE] [--listen ADDR]
                       [--speed K] [--seed S] [--ledger FILE] [--keys-env FILE]

Serves a simulator of the Anthropic Messages API on a loopback address until
SIGINT or SIGTERM, then flushes the ledger and prints the billed totals.

Routes: POST /v1/messages (also stream: true, as server-sent events),
POST /v1/messages/count_tokens, GET /v1/models (the org's models, paginated),
GET /v1/models/ID, the Message Batches API (POST|GET /v1/messages/batches, GET|DELETE
/v1/messages/batches/ID, POST .../ID/cancel, GET .../ID/results);
admin (no key needed, loopback only): GET /sim/stats (JSON; ?series=0 leaves
out the per-second series), GET /sim/ledger (JSONL; ?since=SEQ),
GET|POST|PUT|DELETE /sim/faults (list, add, replace, clear; ?id=ID clears one),
GET /sim/batches (per-org batch stats, JSON).

On start it prints the base URL as ANTHROPIC_BASE_URL=... and, per org, the
line ANTHROPIC_API_KEY_<ORG>=<key> (org upper-cased) that points apidispatch
at it. The keys are the simulator's own fake credentials; its ledger, stats
and logs name keys only by fingerprint.

Presets:
  origin-3org  orgs high_prio, batch, low_prio with the limits measured in
               docs/design.md §24 (Sonnet 4.x, Haiku 4.5, Opus 4.x) and the latency
               calibrated to its Phase 1 run (p50 ~1.5 s, p95 ~3.5 s at
               concurrency 100, max_tokens 64); 120 requests per org served
               at full speed, slower above.
  build-3org   limit-bound: rpm_bound (1,000 RPM binds), otpm_bound (90k OTPM
               binds), itpm_bound (450k ITPM binds) for the judge workload.
  colleague    origin-3org with colleagues using 40% of high_prio's budget.

Speed K: every limit is multiplied by K and every latency and wait divided
by K, so an hour of API traffic runs in 60/K minutes; retry-after is whole
seconds (at least 1) plus an exact retry-after-ms when K > 1.

Config file (--config): JSON; "preset" names a preset to start from, and
the other fields replace the preset's ("orgs" and "faults" as whole lists):
  {"preset": "origin-3org", "speed": 20, "seed": 7,
   "otpm_mode": "actual" | "reserve_max_tokens", "burst_fraction": 1,
   "latency": {"zero": false, "ttft_s": 0.69, "per_token_s": 0.013,
               "sigma": 0.49, "tail_prob": 0.01, "tail_mean_s": 2,
               "congestion_exponent": 1.25},
   "orgs": [{"name": "solo", "id": "<uuid>", "keys": ["sk-..."],
             "limits": {"sonnet-4": {"rpm": 50, "itpm": 30000, "otpm": 8000},
                        "*": {"rpm": 1000, "itpm": 2000000, "otpm": 400000}},
             "service_capacity": 120,
             "batch": {"rpm": 1000, "queue": 200000, "per_minute": 2000,
                       "queue_wait_s": 240, "cancel_s": 5}}],
   "faults": [{"kind": "storm_429", "org": "solo", "start": "30s",
               "duration": "10s", "probability": 0.5, "retry_after": "2s"}],
   "prompt_caching": true, "unlimited": false, "ledger_retain": 0}
Fault kinds: storm_429, overloaded_529, server_error_500,
server_error_500_html, connection_reset, truncated_body, slow
(extra_latency), key_revoked (key_fingerprint), spend_cap (spend_cap_usd),
acceleration (factor, floor_rpm, window, baseline), colleague (fraction, bursts),
stream_overloaded (an error event mid-stream), beta_forbidden (beta: a 403
to requests naming it in anthropic-beta);
batches: batch_create_lost_500, batch_create_lost_reset, batch_not_found
(window), batch_poll_404, batch_stall (fraction), batch_errored_api,
batch_errored_overloaded, batch_errored_invalid, batch_results_cut.
Times are API-equivalent; "from_now": true counts start from when a fault is
added. Flags given on the command line override the file.

Flags:
`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	preset := fs.String("preset", "", "start from preset `NAME`: "+strings.Join(sim.PresetNames(), ", ")+" (default origin-3org unless --config names one)")
	config := fs.String("config", "", "JSON config `FILE` (see above)")
	listen := fs.String("listen", "127.0.0.1:8080", "loopback `ADDR` to serve on (port 0 picks a free one)")
	speed := fs.Float64("speed", 0, "speed factor `K` (default: the config's, else 1)")
	seed := fs.Int64("seed", 0, "`SEED` of latency jitter, fault draws, ids and generated keys (default: the config's)")
	ledger := fs.String("ledger", "", "append every billed request to `FILE` as JSON lines")
	keysEnv := fs.String("keys-env", "", "also write the ANTHROPIC_BASE_URL= and ANTHROPIC_API_KEY_<ORG>= lines to `FILE` (mode 0600), ready to source")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), simHelp)
		fs.PrintDefaults()
	}
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "apidispatch sim: "+format+"\n", a...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if err := sim.CheckLoopback(*listen); err != nil {
		return fail("%v", err)
	}
	cfg, err := simConfig(*config, *preset, set["speed"], *speed, set["seed"], *seed)
	if err != nil {
		return fail("%v", err)
	}
	if *ledger != "" {
		cfg.LedgerPath = *ledger
	}

	run, err := sim.StartOn(*listen, cfg)
	if err != nil {
		return fail("%v", err)
	}
	// What 'run' needs in its environment: printed, and in --keys-env.
	keyLines := run.Server.EnvLines()
	env := append([]string{"ANTHROPIC_BASE_URL=" + run.URL}, keyLines...)
	if *keysEnv != "" {
		if err := writeKeysEnv(*keysEnv, env); err != nil {
			run.Close()
			return fail("%v", err)
		}
	}
	k := run.Server.Speed()
	fmt.Fprintf(stdout, "apidispatch sim: serving on %s (speed %g, %d orgs); Ctrl-C stops\n", run.URL, k, len(keyLines))
	for _, l := range env {
		fmt.Fprintln(stdout, l)
	}

	<-ctx.Done()
	closeErr := run.Close()
	printSimTotals(stdout, run.Server)
	if closeErr != nil {
		fmt.Fprintf(stderr, "apidispatch sim: closing: %v\n", closeErr)
		return exitUsage
	}
	if *ledger != "" {
		fmt.Fprintf(stdout, "ledger: %s\n", *ledger)
	}
	return exitOK
}

// simConfig is the simulator's configuration: a config file or a preset
// (origin-3org by default), then the --speed and --seed given.
func simConfig(config, preset string, speedSet bool, speed float64, seedSet bool, seed int64) (sim.Config, error) {
	var cfg sim.Config
	var err error
	switch {
	case config != "":
		cfg, err = sim.LoadConfig(config)
		if err == nil && preset != "" {
			err = fmt.Errorf("give --preset or a config file (which may name a preset), not both")
		}
	default:
		name := preset
		if name == "" {
			name = sim.PresetOrigin3Org
		}
		cfg, err = sim.Preset(name)
	}
	if err != nil {
		return cfg, err
	}
	if speedSet {
		if speed <= 0 {
			return cfg, fmt.Errorf("--speed must be positive")
		}
		cfg.Speed = speed
	}
	if seedSet {
		cfg = cfg.WithSeed(seed)
	}
	return cfg, nil
}

// printSimTotals prints what a stopped simulator billed, in all and by org.
func printSimTotals(stdout io.Writer, srv *sim.Server) {
	st := srv.Stats()
	t := st.Billed
	fmt.Fprintf(stdout, "apidispatch sim: stopped after %.1f s (%.1f s API-equivalent)\n", st.ElapsedS, st.APIElapsedS)
	fmt.Fprintf(stdout, "billed %d requests: %d input, %d output, %d cache-write, %d cache-read tokens; $%.6f (%d nano-USD); %d duplicate billings\n",
		t.Requests, t.InputTokens, t.OutputTokens, t.CacheWrite, t.CacheRead, t.CostUSD, t.CostNanos, t.Duplicates)
	names := make([]string, 0, len(t.ByOrg))
	for n := range t.ByOrg {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		o := t.ByOrg[n]
		ost := st.Org(n)
		fmt.Fprintf(stdout, "  %-12s %8d billed  $%.6f  %d answered 429  max in flight %d\n", n, o.Requests, o.CostUSD, ost.RateLimited429, ost.MaxInFlight)
	}
}

// writeKeysEnv writes lines to path with mode 0600 (tightening an existing
// file's mode first, so the keys are never readable by others).
func writeKeysEnv(path string, lines []string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("--keys-env: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("--keys-env: %w", err)
	}
	if _, err := io.WriteString(f, strings.Join(lines, "\n")+"\n"); err != nil {
		f.Close()
		return fmt.Errorf("--keys-env: %w", err)
	}
	return f.Close()
}
