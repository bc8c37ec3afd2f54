package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/apidispatch/apidispatch/gateway"
	"github.com/apidispatch/apidispatch/internal/host"
	"github.com/apidispatch/apidispatch/metrics"
	"github.com/apidispatch/apidispatch/runner"
)

func init() {
	register("serve", "serve a drop-in Anthropic API gateway over every org (sync, stream, batches)", serveCmd)
}

// serveUsage is 'serve --help' before the flags.
const serveUsage = `usage: apidispatch serve [--listen 127.0.0.1:8787] [flags]

Serves the Anthropic API at a base URL: POST /v1/messages (streaming too),
/v1/messages/count_tokens, /v1/models and the Message Batches API. Clients
set ANTHROPIC_BASE_URL to the gateway and ANTHROPIC_API_KEY to a gateway
token; their requests go through the same polite lanes as 'run' across every
org, are retried inside the gateway for up to --retry-for, and are priced
into a per-client ledger under --max-cost and each client's max_cost.
Batches are run directories under --state-dir, executed by the batch route
(header x-apidispatch-route: batch, auto with x-apidispatch-deadline, or
sync); a restarted gateway resumes them. Upstream keys never leave it.
With --shared, --max-cost and each client's max_cost are one budget for
every gateway on that Redis (give them the same clients file and caps): a
request's worst case is reserved there and settled from its usage; a
gateway that dies leaves its reservations counted at their worst case
until it starts again on its --state-dir; Redis out of reach refuses
capped requests (529) rather than sending them unjudged.

With --cache FILE (the result cache of 'run'), a non-streaming
POST /v1/messages at temperature 0 (any with --cache-sampled) whose request
the same upstream API answered before is answered from the file
(x-apidispatch-cached: true, nothing sent, nothing billed, under no cap) and
a miss's success is stored; identical requests in flight at once are sent
once (readwrite). Streaming requests bypass the cache; count_tokens, models
and batches never use it. A client is answered only with its own requests'
answers (--cache-scope client, the default); --cache-scope shared answers
every client with every client's and with those of 'run', which tells a client
that someone sent the same request before.

Stopping: the first SIGTERM or SIGINT stops admitting at once (nothing
more is sent upstream; queued and new requests get the API's 529
overloaded_error, which clients retry); requests in flight have --drain to
finish. A second signal, or the end of --drain, cuts them: each is recorded
in the ledger at its worst case as abandoned, a stream ends with the API's
error event, and a --shared budget keeps their slots until their lease and
grace pass. Gateway batches resume at the next start.

Clients cannot hold up each other: upstream answers are read to their end
whatever a client reads (--write-timeout cuts a client that stops reading),
headers and bodies have deadlines, connections are bounded under the file
limit (at the limit, the one idle longest is closed), and an upstream
401/403 takes an org out of rotation only when a plain probe (no beta, no
client header) confirms that its key is refused; otherwise the client gets
the API's answer. A token file its group or others may read is refused.

flags:`

// serveFlags are the flags of 'apidispatch serve'.
type serveFlags struct {
	listen, orgsFile, baseURL, maxCost, prices, limitsFile *string
	tokenFile, clientsFile, stateDir, tlsCert, tlsKey      *string
	metricsAddr, publicURL, cacheScope                     *string
	speed                                                  *float64
	retryFor, drain, headerTimeout, bodyTimeout            *time.Duration
	writeTimeout                                           *time.Duration
	maxConns, maxConnsPerIP                                *int
	quiet, insecureTokenFile                               *bool
	conns                                                  gateway.ConnLimits // checked by config
	caps                                                   capsFlag
	shf                                                    sharedFlags
	cf                                                     cacheFlags
}

func (f *serveFlags) register(fs *flag.FlagSet, stderr io.Writer) {
	f.listen = fs.String("listen", "127.0.0.1:8787", "`ADDR` to serve the API on; anything but loopback needs --tls-cert and --tls-key")
	f.orgsFile = fs.String("orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME> and ANTHROPIC_BATCH_KEY")
	f.baseURL = fs.String("base-url", os.Getenv("ANTHROPIC_BASE_URL"), "upstream API root `URL` (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	fs.Var(&f.caps, "cap", "polite per-key concurrency caps `FAMILY=N,...` (default sonnet=100,haiku=120,opus=40,other=40)")
	f.maxCost = fs.String("max-cost", "", "hard spend cap in `USD` for the whole gateway (every client together); a request that could pass it is refused")
	f.prices = fs.String("prices", "", "price table `FILE` overriding the embedded one")
	f.speed = fs.Float64("speed", 1, "time compression `K` of the upstream server (the simulator's --speed); 1 for the real API")
	f.limitsFile = fs.String("limits", "", "limits `FILE` from 'apidispatch probe' (the batch queue caps of gateway batches)")
	f.retryFor = fs.Duration("retry-for", gateway.DefaultRetryFor, "how long a request is retried inside the gateway (429, 529, 5xx, resets) before its last answer is passed on (`DURATION`)")
	f.tokenFile = fs.String("token-file", "gateway.token", "`FILE` holding the gateway token clients send as their API key (created 0600 with a random token when absent)")
	f.clientsFile = fs.String("clients", "", "TOML `FILE` of several clients ([[client]] name, token or token_file, max_cost), instead of --token-file")
	f.stateDir = fs.String("state-dir", defaultGatewayStateDir, "`DIR` for the ledger and the gateway batches (resumed at start)")
	f.tlsCert = fs.String("tls-cert", "", "TLS certificate `FILE` (required to listen beyond loopback)")
	f.tlsKey = fs.String("tls-key", "", "TLS key `FILE`")
	f.metricsAddr = fs.String("metrics", "", "serve Prometheus metrics on `ADDR` (a loopback address) at /metrics")
	f.insecureTokenFile = fs.Bool("insecure-token-file", false, "use a token file (or a clients file holding tokens) that its group or others may read; without it such a file is refused, as ssh refuses such a key")
	f.publicURL = fs.String("public-url", "", "base `URL` clients reach the gateway at, for the results_url of batches (default: the address a request came in on; never the client's Host header)")
	f.cacheScope = fs.String("cache-scope", gateway.CacheScopeClient, "`SCOPE` of --cache hits: client (a client reads only its own requests' answers) or shared (every client's and run's answers; a hit reveals that someone sent the same request)")
	f.drain = fs.Duration("drain", gateway.DefaultDrain, "on SIGTERM/SIGINT, how long requests in flight have to finish before they are cut (`DURATION`)")
	f.maxConns = fs.Int("max-conns", 0, "most client connections open at once (`N`; default: the process's file limit less a quarter of it); at the limit the one idle longest is closed")
	f.maxConnsPerIP = fs.Int("max-conns-per-ip", 0, "most client connections from one IP address (`N`; default: no limit of its own)")
	f.headerTimeout = fs.Duration("header-timeout", gateway.DefaultHeaderTimeout, "a request's header must arrive within `DURATION`")
	f.bodyTimeout = fs.Duration("body-timeout", gateway.DefaultBodyTimeout, "a request's body must arrive within `DURATION` of its header, and a second more for each MB received (a dribbled body is cut)")
	f.writeTimeout = fs.Duration("write-timeout", gateway.DefaultWriteTimeout, "a client that takes no bytes of its answer for `DURATION` is cut (the upstream answer is read and priced whatever the client reads)")
	f.shf.register(fs)
	f.cf.register(fs)
	f.quiet = fs.Bool("quiet", false, "log warnings only")
	fs.Usage = func() {
		fmt.Fprintln(stderr, serveUsage)
		fs.PrintDefaults()
	}
}

func serveCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs, stderr)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	cfg, oneToken, err := f.config(fs, stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	sigs := make(chan os.Signal, 2)
	// Never handed back to the default action (no signal.Stop): a second
	// signal that comes while the gateway closes after a drain (its ledger,
	// its journal) would kill the process mid-close, exit -1 instead of 0.
	// Later signals fill the buffer and are dropped.
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	svc, err := runner.StartServices(context.Background(), runner.ServicesConfig{Shared: f.shf.shared(), MetricsAddr: *f.metricsAddr, Orgs: cfg.Orgs, Stderr: stderr, Log: cfg.Log})
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer svc.Stop()
	cfg.NewGate = svc.NewGate(nil)
	cfg.SharedSpend = svc.Budget // nil without --shared
	cc, cmode, err := f.cf.open(true)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if cc != nil {
		defer cc.Close()
		cfg.Cache, cfg.CacheMode, cfg.CacheSampled = cc, cmode, f.cf.sampled
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
	if svc.Metrics != nil {
		if err := svc.Metrics.Gateway(func() metrics.GatewayStats { return gatewayStats(g.Status()) }); err != nil {
			errf(stderr, "--metrics: %v", err)
			return exitUsage
		}
	}
	ln, err := net.Listen("tcp", *f.listen)
	if err != nil {
		errf(stderr, "--listen %s: %v", *f.listen, err)
		return exitUsage
	}
	f.announce(stdout, ln.Addr(), oneToken)
	return f.serve(sigs, g, ln, stderr)
}

// config is the gateway the flags describe, and its one client's token
// when there is one (not --clients).
func (f *serveFlags) config(fs *flag.FlagSet, stderr io.Writer) (cfg gateway.Config, oneToken string, err error) {
	if !gateway.IsLoopback(*f.listen) && (*f.tlsCert == "" || *f.tlsKey == "") {
		return cfg, "", fmt.Errorf("--listen %s is not loopback: serving beyond loopback needs --tls-cert and --tls-key", *f.listen)
	}
	if (*f.tlsCert == "") != (*f.tlsKey == "") {
		return cfg, "", errors.New("--tls-cert and --tls-key go together")
	}
	sf := sendFlags{orgsFile: *f.orgsFile, prices: *f.prices, baseURL: *f.baseURL, maxCost: *f.maxCost}
	c, err := sf.load(stderr)
	if err != nil {
		return cfg, "", err
	}
	limits, err := loadLimits(*f.limitsFile)
	if err != nil {
		return cfg, "", err
	}
	if f.conns, err = gateway.CheckConnLimits(gateway.ConnLimits{Max: *f.maxConns, PerIP: *f.maxConnsPerIP}, host.FileLimit()); err != nil {
		return cfg, "", fmt.Errorf("--max-conns: %w", err)
	}
	cfg = gateway.Config{
		Orgs: c.orgs, BaseURL: *f.baseURL, Caps: f.caps, Speed: *f.speed, Prices: c.prices, MaxCost: c.maxCost,
		RetryFor: *f.retryFor, StateDir: *f.stateDir, Log: newLogger(stderr, *f.quiet), Limits: limits,
		PublicURL: *f.publicURL, CacheScope: *f.cacheScope, BodyTimeout: *f.bodyTimeout, WriteTimeout: *f.writeTimeout,
	}
	if *f.clientsFile != "" {
		cfg.Clients, err = gateway.LoadClients(*f.clientsFile, *f.insecureTokenFile)
		return cfg, "", err
	}
	tok, created, err := gateway.TokenFile(*f.tokenFile, *f.insecureTokenFile)
	if err != nil {
		return cfg, "", err
	}
	if created {
		fmt.Fprintf(stderr, "created %s (mode 0600) with a new gateway token\n", *f.tokenFile)
	}
	cfg.Clients = []gateway.Client{{Name: "default", Token: tok}}
	return cfg, tok, nil
}

// announce prints the base URL and key clients use.
func (f *serveFlags) announce(stdout io.Writer, addr net.Addr, oneToken string) {
	scheme := "http"
	if *f.tlsCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "ANTHROPIC_BASE_URL=%s://%s\n", scheme, addr)
	if oneToken != "" {
		fmt.Fprintf(stdout, "ANTHROPIC_API_KEY=%s\n", oneToken)
	} else {
		fmt.Fprintf(stdout, "ANTHROPIC_API_KEY=<your client's token in %s>\n", *f.clientsFile)
	}
	if fl, ok := stdout.(*os.File); ok {
		fl.Sync()
	}
}

// serve serves g on ln until the signals stop it (gateway.Serve) or
// serving fails.
func (f *serveFlags) serve(sigs <-chan os.Signal, g *gateway.Gateway, ln net.Listener, stderr io.Writer) int {
	err := g.Serve(ln, gateway.ServeConfig{Stop: sigs, Drain: *f.drain, Conns: f.conns, HeaderTimeout: *f.headerTimeout,
		TLSCert: *f.tlsCert, TLSKey: *f.tlsKey, Stderr: stderr})
	if err != nil {
		errf(stderr, "serving: %v", err)
		return exitIncomplete
	}
	return exitOK
}

// gatewayStats is the gateway's status as its Prometheus metrics read it.
func gatewayStats(st gateway.Status) metrics.GatewayStats {
	out := metrics.GatewayStats{OrgSpentUSD: st.OrgSpend, Queued: st.Queued, Batches: st.Batches}
	if c := st.Cache; c != nil {
		out.Cache = &metrics.GatewayCache{Hits: c.Hits, Misses: c.Misses, Stored: c.Stored, SavedUSD: c.SavedUSD}
	}
	for _, q := range st.Queues {
		out.Queues = append(out.Queues, metrics.ClientQueue{Client: q.Client, Class: q.Class, Queued: q.Queued, InFlight: q.InFlight,
			Waits: q.Waits, WaitP50S: q.WaitP50Ms / 1000, WaitP99S: q.WaitP99Ms / 1000})
	}
	// The shared figures are there for every line or for none
	// (Gateway.Status reads them at once).
	if sh := st.Total.Shared; sh != nil {
		out.Shared = &metrics.GatewayShared{Up: sh.Unavailable == "", SharedSpend: metrics.SharedSpend{SpentUSD: sh.SpentUSD, ReservedUSD: sh.ReservedUSD}}
	}
	for _, c := range st.Clients {
		mc := metrics.ClientSpend{Client: c.Client, SpentUSD: c.SpentUSD, ReservedUSD: c.InFlight, CapUSD: c.CapUSD, ByOrgUSD: c.ByOrg}
		if sh := c.Shared; sh != nil && sh.Unavailable == "" {
			mc.Shared = &metrics.SharedSpend{SpentUSD: sh.SpentUSD, ReservedUSD: sh.ReservedUSD}
		}
		out.Clients = append(out.Clients, mc)
	}
	return out
}
