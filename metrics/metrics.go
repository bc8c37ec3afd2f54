// Package metrics exposes a run's lanes as Prometheus metrics: per lane,
// the requests in flight, the limit and the cap (read from the gate at
// scrape time), and counters of admissions, outcomes by class, 429s and
// cost. It wraps each lane's gate.Gate, so it works the same over the
// in-process lane and the shared one.
package metrics

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
)

// Metrics is one run's registry. It is safe for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	admitted *prometheus.CounterVec
	outcomes *prometheus.CounterVec
	r429     *prometheus.CounterVec
	costUSD  *prometheus.CounterVec

	mu    sync.Mutex
	gates []*counted
}

var laneLabels = []string{"org", "pool"}

// New returns an empty registry with the process and Go collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apidispatch_admitted_total", Help: "Requests admitted by the lane.",
		}, laneLabels),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apidispatch_outcomes_total", Help: "Attempts ended, by class (success, retryable, terminal, lane_fatal).",
		}, append(laneLabels, "class")),
		r429: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apidispatch_rate_limited_total", Help: "429 rate-limit answers.",
		}, laneLabels),
		costUSD: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apidispatch_cost_usd_total", Help: "Cost of the lane's billed attempts, in US dollars.",
		}, laneLabels),
	}
	m.reg.MustRegister(m.admitted, m.outcomes, m.r429, m.costUSD, (*lanes)(m),
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Wrap returns a gate constructor whose gates m counts (newGate nil: the
// in-process lane).
func (m *Metrics) Wrap(newGate func(gate.LaneConfig) gate.Gate) func(gate.LaneConfig) gate.Gate {
	if newGate == nil {
		newGate = func(c gate.LaneConfig) gate.Gate { return gate.NewLane(c) }
	}
	return func(c gate.LaneConfig) gate.Gate {
		g := &counted{Gate: newGate(c), m: m, org: c.Org, pool: string(c.Pool)}
		m.mu.Lock()
		m.gates = append(m.gates, g)
		m.mu.Unlock()
		return g
	}
}

// counted counts what passes through a lane's gate.
type counted struct {
	gate.Gate
	m         *Metrics
	org, pool string
	// attempts ended and 429s among them, for the per-org 429 rate
	attempts, r429 atomic.Int64
}

func (g *counted) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	p, w, ok := g.Gate.TryAdmit(now, d)
	if ok {
		g.m.admitted.WithLabelValues(g.org, g.pool).Inc()
	}
	return p, w, ok
}

func (g *counted) Done(now time.Time, p gate.Permit, fb gate.Feedback) {
	g.Gate.Done(now, p, fb)
	g.m.outcomes.WithLabelValues(g.org, g.pool, class(fb.Outcome.Kind)).Inc()
	g.attempts.Add(1)
	if fb.Outcome.RateLimited {
		g.r429.Add(1)
		g.m.r429.WithLabelValues(g.org, g.pool).Inc()
	}
	if fb.Cost > 0 {
		g.m.costUSD.WithLabelValues(g.org, g.pool).Add(fb.Cost.USD())
	}
}

// SetWake forwards to a gate that wakes the engine itself.
func (g *counted) SetWake(wake func()) {
	if w, ok := g.Gate.(gate.Waker); ok {
		w.SetWake(wake)
	}
}

// LearnOrganisation forwards to a gate that keeps its key's organisation
// (upstream.Orgs.Discover tells it).
func (g *counted) LearnOrganisation(id string) {
	if l, ok := g.Gate.(interface{ LearnOrganisation(string) }); ok {
		l.LearnOrganisation(id)
	}
}

func class(k anthropic.Kind) string {
	switch k {
	case anthropic.Success:
		return "success"
	case anthropic.Terminal:
		return "terminal"
	case anthropic.LaneFatal:
		return "lane_fatal"
	}
	return "retryable"
}

// lanes collects the gauges from the gates' snapshots at scrape time.
type lanes Metrics

var (
	descInFlight = prometheus.NewDesc("apidispatch_in_flight", "Requests in flight on the lane.", laneLabels, nil)
	descLimit    = prometheus.NewDesc("apidispatch_limit", "The lane's AIMD concurrency limit.", laneLabels, nil)
	descCap      = prometheus.NewDesc("apidispatch_cap", "The lane's polite per-key concurrency cap.", laneLabels, nil)
	descHeld     = prometheus.NewDesc("apidispatch_held", "1 while the lane holds for a retry-after.", laneLabels, nil)
	descRate429  = prometheus.NewDesc("apidispatch_org_rate_limited_ratio",
		"429 answers as a share of the org's attempts in this run (a contended org shows here).", []string{"org"}, nil)
	descPace = prometheus.NewDesc("apidispatch_pace_per_minute",
		"The refill of the org's bucket left to us per API minute, as the lane estimates it from the headers (0: not known).", append(laneLabels, "limit"), nil)
)

func (l *lanes) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInFlight
	ch <- descLimit
	ch <- descCap
	ch <- descHeld
	ch <- descRate429
	ch <- descPace
}

func (l *lanes) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	gates := l.gates
	l.mu.Unlock()
	now := time.Now()
	type counts struct{ attempts, r429 int64 }
	byOrg := map[string]*counts{}
	for _, g := range gates {
		c := byOrg[g.org]
		if c == nil {
			c = &counts{}
			byOrg[g.org] = c
		}
		c.attempts += g.attempts.Load()
		c.r429 += g.r429.Load()
	}
	for o, c := range byOrg {
		r := 0.0
		if c.attempts > 0 {
			r = float64(c.r429) / float64(c.attempts)
		}
		ch <- prometheus.MustNewConstMetric(descRate429, prometheus.GaugeValue, r, o)
	}
	for _, g := range gates {
		s := g.Snapshot(now)
		for i, name := range []string{"requests", "input_tokens", "output_tokens"} {
			if s.BucketLim[i] > 0 {
				ch <- prometheus.MustNewConstMetric(descPace, prometheus.GaugeValue, s.Pace[i], g.org, g.pool, name)
			}
		}
		held := 0.0
		if s.Held {
			held = 1
		}
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight), g.org, g.pool)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, s.Limit, g.org, g.pool)
		ch <- prometheus.MustNewConstMetric(descCap, prometheus.GaugeValue, float64(s.Cap), g.org, g.pool)
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, held, g.org, g.pool)
	}
}

// Server serves a registry's /metrics in the background. Start makes one;
// Stop ends it. It is safe for concurrent use.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{} // closed when the serving goroutine has returned
	once sync.Once
	err  error
}

// Start listens on addr, which must be a loopback address, and serves
// /metrics on its own goroutine until Stop. ctx bounds the listen only.
func (m *Metrics) Start(ctx context.Context, addr string) (*Server, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, &net.AddrError{Err: "metrics are served on a loopback address only", Addr: addr}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, addr: ln.Addr(), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.srv.Serve(ln)
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Stop closes the listener and every connection, and waits for the
// serving goroutine. It is safe to call more than once.
func (s *Server) Stop() error {
	s.once.Do(func() {
		s.err = s.srv.Close()
		<-s.done
	})
	return s.err
}

// GatewayStats is what a gateway ('apidispatch serve') reports at every
// scrape.
type GatewayStats struct {
	// Clients is each client's spend.
	Clients []ClientSpend
	// OrgSpentUSD is what the ledger holds by org; gateway batches, which
	// span orgs, under a key of their own ("(gateway batches)").
	OrgSpentUSD map[string]float64
	// Queued is the requests waiting for a lane.
	Queued int
	// Queues is the queue by client and priority class.
	Queues []ClientQueue
	// Batches is the number of gateway batches by status.
	Batches map[string]int
	// Cache is the result cache's figures; nil without one.
	Cache *GatewayCache
	// Shared is the gateway's budget (its --max-cost) in the spend budget
	// every gateway on the Redis shares (--shared); nil without --shared.
	Shared *GatewayShared
}

// GatewayShared is the gateway's budget in the shared spend budget.
type GatewayShared struct {
	// Up: Redis answered at this scrape; without it the shared figures,
	// the gateway's and its clients', are left out.
	Up bool
	SharedSpend
}

// SharedSpend is one budget's figures for every gateway sharing it:
// SpentUSD, and ReservedUSD the worst case of their work in flight or
// whose cost will never be known.
type SharedSpend struct {
	SpentUSD, ReservedUSD float64
}

// GatewayCache is a gateway's use of the result cache since it started.
type GatewayCache struct {
	Hits, Misses, Stored int64
	// SavedUSD is what the hits' requests cost when they were sent.
	SavedUSD float64
}

// ClientQueue is one gateway client's requests of one priority class
// ("interactive" or "bulk"): waiting for a lane, admitted and not yet
// released, and the p50 and p99 of their latest waits for a lane, in
// seconds (Waits of them; 0: none yet, and no wait metric).
type ClientQueue struct {
	Client, Class      string
	Queued             int
	InFlight           int64
	Waits              int
	WaitP50S, WaitP99S float64
}

// ClientSpend is one gateway client's spend.
type ClientSpend struct {
	Client string
	// SpentUSD is what the ledger holds; ReservedUSD the worst case of
	// its requests and batches in flight; CapUSD its max_cost (0: none).
	SpentUSD, ReservedUSD, CapUSD float64
	// ByOrgUSD is what the ledger holds for the client by org (gateway
	// batches under "(gateway batches)").
	ByOrgUSD map[string]float64
	// Shared is the client's budget in the shared spend budget (--shared),
	// for every gateway on the Redis; nil without it or when Redis did not
	// answer.
	Shared *SharedSpend
}

var (
	descGWSpent     = prometheus.NewDesc("apidispatch_gateway_client_spent_usd", "What the gateway's ledger holds for the client, in US dollars.", []string{"client"}, nil)
	descGWReserved  = prometheus.NewDesc("apidispatch_gateway_client_reserved_usd", "Worst case of the client's requests and batches in flight, in US dollars.", []string{"client"}, nil)
	descGWCap       = prometheus.NewDesc("apidispatch_gateway_client_max_cost_usd", "The client's max_cost, in US dollars (clients with one only).", []string{"client"}, nil)
	descGWOrg       = prometheus.NewDesc("apidispatch_gateway_org_spent_usd", "What the gateway's ledger holds by org, in US dollars (gateway batches, which span orgs, as org \"(gateway batches)\").", []string{"org"}, nil)
	descGWClientOrg = prometheus.NewDesc("apidispatch_gateway_client_org_spent_usd", "What the gateway's ledger holds for the client by org, in US dollars (gateway batches as org \"(gateway batches)\").", []string{"client", "org"}, nil)
	descGWQueued    = prometheus.NewDesc("apidispatch_gateway_queued", "Requests waiting in the gateway for a lane.", nil, nil)
	descGWCQueued   = prometheus.NewDesc("apidispatch_gateway_client_queued", "The client's requests of the priority class waiting in the gateway for a lane.", []string{"client", "class"}, nil)
	descGWCFlight   = prometheus.NewDesc("apidispatch_gateway_client_in_flight", "The client's requests of the priority class admitted by a lane and not yet released.", []string{"client", "class"}, nil)
	descGWCWait     = prometheus.NewDesc("apidispatch_gateway_client_queue_wait_seconds", "Quantiles of the client's latest waits for a lane (up to 1,024) in the priority class, in seconds.", []string{"client", "class", "quantile"}, nil)
	descGWBatches   = prometheus.NewDesc("apidispatch_gateway_batches", "Gateway batches by status.", []string{"status"}, nil)
	descGWCache     = prometheus.NewDesc("apidispatch_gateway_cache_requests_total", "Keyed Messages requests by what the result cache did: hit (answered from it), miss (sent), stored (a success new to the file).", []string{"result"}, nil)
	descGWCacheSave = prometheus.NewDesc("apidispatch_gateway_cache_saved_usd_total", "What the requests answered from the result cache cost when they were sent, in US dollars.", nil, nil)
	descGWShUp      = prometheus.NewDesc("apidispatch_gateway_shared_spend_up", "1 when the shared spend budget (--shared) answered at this scrape, 0 when its figures are unavailable.", nil, nil)
	descGWShSpent   = prometheus.NewDesc("apidispatch_gateway_shared_spent_usd", "What every gateway sharing the spend budget (--shared) spent, in US dollars: the gateway's --max-cost is judged against it.", nil, nil)
	descGWShRes     = prometheus.NewDesc("apidispatch_gateway_shared_reserved_usd", "Worst case of every gateway's requests and batches in flight or never read, in the shared spend budget (--shared), in US dollars.", nil, nil)
	descGWCShSpent  = prometheus.NewDesc("apidispatch_gateway_client_shared_spent_usd", "What every gateway sharing the spend budget (--shared) spent for the client, in US dollars: its max_cost is judged against it.", []string{"client"}, nil)
	descGWCShRes    = prometheus.NewDesc("apidispatch_gateway_client_shared_reserved_usd", "Worst case of the client's requests and batches in flight or never read on every gateway sharing the spend budget (--shared), in US dollars.", []string{"client"}, nil)
)

// gatewayCollector reads a gateway's stats at scrape time.
type gatewayCollector func() GatewayStats

func (gatewayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGWSpent, descGWReserved, descGWCap, descGWClientOrg, descGWOrg, descGWQueued, descGWCQueued, descGWCFlight, descGWCWait, descGWBatches, descGWCache, descGWCacheSave,
		descGWShUp, descGWShSpent, descGWShRes, descGWCShSpent, descGWCShRes} {
		ch <- d
	}
}

func (f gatewayCollector) Collect(ch chan<- prometheus.Metric) {
	s := f()
	for _, c := range s.Clients {
		ch <- prometheus.MustNewConstMetric(descGWSpent, prometheus.GaugeValue, c.SpentUSD, c.Client)
		ch <- prometheus.MustNewConstMetric(descGWReserved, prometheus.GaugeValue, c.ReservedUSD, c.Client)
		if c.CapUSD > 0 {
			ch <- prometheus.MustNewConstMetric(descGWCap, prometheus.GaugeValue, c.CapUSD, c.Client)
		}
		for o, v := range c.ByOrgUSD {
			ch <- prometheus.MustNewConstMetric(descGWClientOrg, prometheus.GaugeValue, v, c.Client, o)
		}
		if sh := c.Shared; sh != nil {
			ch <- prometheus.MustNewConstMetric(descGWCShSpent, prometheus.GaugeValue, sh.SpentUSD, c.Client)
			ch <- prometheus.MustNewConstMetric(descGWCShRes, prometheus.GaugeValue, sh.ReservedUSD, c.Client)
		}
	}
	for o, v := range s.OrgSpentUSD {
		ch <- prometheus.MustNewConstMetric(descGWOrg, prometheus.GaugeValue, v, o)
	}
	ch <- prometheus.MustNewConstMetric(descGWQueued, prometheus.GaugeValue, float64(s.Queued))
	for _, q := range s.Queues {
		ch <- prometheus.MustNewConstMetric(descGWCQueued, prometheus.GaugeValue, float64(q.Queued), q.Client, q.Class)
		ch <- prometheus.MustNewConstMetric(descGWCFlight, prometheus.GaugeValue, float64(q.InFlight), q.Client, q.Class)
		if q.Waits > 0 {
			ch <- prometheus.MustNewConstMetric(descGWCWait, prometheus.GaugeValue, q.WaitP50S, q.Client, q.Class, "0.5")
			ch <- prometheus.MustNewConstMetric(descGWCWait, prometheus.GaugeValue, q.WaitP99S, q.Client, q.Class, "0.99")
		}
	}
	for st, n := range s.Batches {
		ch <- prometheus.MustNewConstMetric(descGWBatches, prometheus.GaugeValue, float64(n), st)
	}
	if sh := s.Shared; sh != nil {
		up := 0.0
		if sh.Up {
			up = 1
			ch <- prometheus.MustNewConstMetric(descGWShSpent, prometheus.GaugeValue, sh.SpentUSD)
			ch <- prometheus.MustNewConstMetric(descGWShRes, prometheus.GaugeValue, sh.ReservedUSD)
		}
		ch <- prometheus.MustNewConstMetric(descGWShUp, prometheus.GaugeValue, up)
	}
	if c := s.Cache; c != nil {
		ch <- prometheus.MustNewConstMetric(descGWCache, prometheus.CounterValue, float64(c.Hits), "hit")
		ch <- prometheus.MustNewConstMetric(descGWCache, prometheus.CounterValue, float64(c.Misses), "miss")
		ch <- prometheus.MustNewConstMetric(descGWCache, prometheus.CounterValue, float64(c.Stored), "stored")
		ch <- prometheus.MustNewConstMetric(descGWCacheSave, prometheus.CounterValue, c.SavedUSD)
	}
}

// Gateway adds a gateway's metrics, read from stats at every scrape. Call
// it once.
func (m *Metrics) Gateway(stats func() GatewayStats) error {
	return m.reg.Register(gatewayCollector(stats))
}
