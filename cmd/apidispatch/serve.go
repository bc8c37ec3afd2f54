package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/metrics"
	"github.com/apidispatch/apidispatch/plan"
)

func init() {
	register("serve", "serve a drop-in Anthropic API gateway over every org (sync, stream, batches)", serveCmd)
}

func serveCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8787", "`ADDR` to serve the API on; anything but loopback needs --tls-cert and --tls-key")
	orgsFile := fs.String("orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME> and ANTHROPIC_BATCH_KEY")
	baseURL := fs.String("base-url", os.Getenv("ANTHROPIC_BASE_URL"), "upstream API root `URL` (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	var caps capsFlag
	fs.Var(&caps, "cap", "polite per-key concurrency caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	maxCost := fs.String("max-cost", "", "hard spend cap in `USD` for the whole gateway (every client together); a request that could pass it is refused")
	prices := fs.String("prices", "", "price table `FILE` overriding the embedded one")
	speed := fs.Float64("speed", 1, "time compression `K` of the upstream server (the simulator's --speed); 1 for the real API")
	limitsFile := fs.String("limits", "", "limits `FILE` from 'apidispatch probe' (the batch queue caps of gateway batches)")
	retryFor := fs.Duration("retry-for", gateway.DefaultRetryFor, "how long a request is retried inside the gateway (429, 529, 5xx, resets) before its last answer is passed on (`DURATION`)")
	tokenFile := fs.String("token-file", "gateway.token", "`FILE` holding the gateway token clients send as their API key (created 0600 with a random token when absent)")
	clientsFile := fs.String("clients", "", "TOML `FILE` of several clients ([[client]] name, token or token_file, max_cost), instead of --token-file")
	stateDir := fs.String("state-dir", defaultGatewayStateDir, "`DIR` for the ledger and the gateway batches (resumed at start)")
	tlsCert := fs.String("tls-cert", "", "TLS certificate `FILE` (required to listen beyond loopback)")
	tlsKey := fs.String("tls-key", "", "TLS key `FILE`")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on `ADDR` (a loopback address) at /metrics")
	var shf sharedFlags
	shf.register(fs)
	var cf cacheFlags
	cf.register(fs)
	quiet := fs.Bool("quiet", false, "log warnings only")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch serve [--listen 127.0.0.1:8787] [flags]

Serves the Anthropic API at a base URL: POST /v1/messages (streaming too),
/v1/messages/count_tokens, /v1/models and the Message Batches API. Clients
set ANTHROPIC_BASE_URL to the gateway and ANTHROPIC_API_KEY to a gateway
token; their requests go through the same polite lanes as 'run' across every
org, are retried inside the gateway for up to --retry-for, and are priced
into a per-client ledger under --max-cost and each client's max_cost.
Batches are run directories under --state-dir, executed by the batch route
(header x-apidispatch-route: batch, auto with x-apidispatch-deadline, or
sync); a restarted gateway resumes them. Upstream keys never leave it.

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	// The gateway does not serve from the result cache: a --cache given on
	// the command line is refused, one from the environment left out.
	if cf.path != "" {
		given := false
		fs.Visit(func(f *flag.Flag) {
			given = given || f.Name == "cache" || f.Name == "cache-mode" || f.Name == "cache-sampled"
		})
		if given {
			errf(stderr, "--cache: the gateway does not serve from the result cache: every request is sent (leave out --cache, --cache-mode and --cache-sampled)")
			return exitUsage
		}
		fmt.Fprintf(stderr, "note: APIDISPATCH_CACHE=%s is not used: the gateway does not serve from the result cache\n", cf.path)
	}
	logger := newLogger(stderr, *quiet)
	if !gateway.IsLoopback(*listen) && (*tlsCert == "" || *tlsKey == "") {
		errf(stderr, "--listen %s is not loopback: serving beyond loopback needs --tls-cert and --tls-key", *listen)
		return exitUsage
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		errf(stderr, "--tls-cert and --tls-key go together")
		return exitUsage
	}
	sf := sendFlags{orgsFile: *orgsFile, prices: *prices}
	table, err := sf.loadPrices()
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	orgs, err := sf.loadOrgs(stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if *baseURL != "" {
		if _, err := apihttp.CheckBaseURL(*baseURL); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	}
	var mc cost.Nanos
	if *maxCost != "" {
		if mc, err = cost.ParseUSD(*maxCost); err != nil || mc <= 0 {
			errf(stderr, "--max-cost %q: want a positive dollar amount", *maxCost)
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
	var clients []gateway.Client
	oneToken := ""
	if *clientsFile != "" {
		if clients, err = gateway.LoadClients(*clientsFile); err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
	} else {
		tok, created, err := gateway.TokenFile(*tokenFile)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		if created {
			fmt.Fprintf(stderr, "created %s (mode 0600) with a new gateway token\n", *tokenFile)
		}
		clients = []gateway.Client{{Name: "default", Token: tok}}
		oneToken = tok
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := gateway.Config{
		Orgs: orgs, BaseURL: *baseURL, Caps: caps, Speed: *speed, Prices: table, MaxCost: mc,
		Clients: clients, RetryFor: *retryFor, StateDir: *stateDir, Log: logger, Limits: limits,
	}
	sb, err := shf.open(ctx, orgs, nil)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if sb != nil {
		cfg.NewGate = sb.NewGate
		sb.Start()
		defer sb.Close()
	}
	var mset *metrics.Metrics
	if *metricsAddr != "" {
		m, err := startMetrics(*metricsAddr, stderr)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		defer m.Close()
		cfg.NewGate = m.Wrap(cfg.NewGate)
		mset = m.Metrics
	}
	g, err := gateway.New(cfg)
	if err != nil {
		errf(stderr, "%v", err)
		if errors.Is(err, gateway.ErrStateDirBusy) {
			return exitRefused
		}
		return exitUsage
	}
	defer g.Close()
	if mset != nil {
		if err := mset.Gateway(func() metrics.GatewayStats { return gatewayStats(g.Status()) }); err != nil {
			errf(stderr, "--metrics: %v", err)
			return exitUsage
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		errf(stderr, "--listen %s: %v", *listen, err)
		return exitUsage
	}
	scheme := "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "ANTHROPIC_BASE_URL=%s://%s\n", scheme, ln.Addr())
	if oneToken != "" {
		fmt.Fprintf(stdout, "ANTHROPIC_API_KEY=%s\n", oneToken)
	} else {
		fmt.Fprintf(stdout, "ANTHROPIC_API_KEY=<your client's token in %s>\n", *clientsFile)
	}
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
		ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan error, 1)
	go func() {
		if *tlsCert != "" {
			done <- srv.ServeTLS(ln, *tlsCert, *tlsKey)
		} else {
			done <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			errf(stderr, "serving: %v", err)
			return exitIncomplete
		}
	case <-ctx.Done():
		fmt.Fprintln(stderr, "stopping: letting requests in flight finish (gateway batches resume at the next start)")
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}
	return exitOK
}

// gatewayStats is the gateway's status as its Prometheus metrics read it.
func gatewayStats(st gateway.Status) metrics.GatewayStats {
	out := metrics.GatewayStats{OrgSpentUSD: st.OrgSpend, Queued: st.Queued, Batches: st.Batches}
	for _, c := range st.Clients {
		out.Clients = append(out.Clients, metrics.ClientSpend{Client: c.Client, SpentUSD: c.SpentUSD, ReservedUSD: c.InFlight, CapUSD: c.CapUSD, ByOrgUSD: c.ByOrg})
	}
	return out
}
