// Package gateway is 'apidispatch serve': a drop-in Anthropic API gateway.
// Clients speak the Messages API (streaming too), count_tokens, models and
// the Message Batches API at the gateway's base URL with a gateway token;
// the gateway sends their requests through the same polite lanes as 'run'
// across every org (caps, AIMD, header mirrors, retry-after, the shared
// budget), retries what is retryable for up to RetryFor, prices every
// answer into a per-client ledger under per-client and gateway caps, and
// fans Message Batches out as run directories executed by package runner.
// Upstream keys never leave it.
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/spend"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// Limits of request bodies, as the API's (docs/design.md §16, §19).
const (
	MaxMessagesBytes = 32 << 20
	MaxBatchBytes    = 256 << 20
	MaxBatchRequests = 100_000
	DefaultRetryFor  = 10 * time.Minute
	gatewayIDPrefix  = "req_gw_"
	headerOrg        = "x-apidispatch-org"
	headerAttempts   = "x-apidispatch-attempts"
	headerCost       = "x-apidispatch-cost-usd"
	headerRoute      = "x-apidispatch-route"
	headerDeadline   = "x-apidispatch-deadline"
	// headerPriority overrides the client's class for one request
	// ("interactive" or "bulk").
	headerPriority    = "x-apidispatch-priority"
	ledgerFile        = "ledger.jsonl"
	statusFile        = "status.json"
	batchesDir        = "batches"
	defaultStateDir   = "gateway-state"
	stateLockFile     = "lock"
	upstreamVersion   = anthropic.APIVersion
	maxUpstreamAnswer = 64 << 20
)

// Client is one user of the gateway: a name (for the ledger), its token
// and an optional spend cap.
type Client struct {
	Name    string
	Token   string
	MaxCost cost.Nanos // 0: no cap of its own
	// Weight is the client's share of a pool's lanes against the other
	// clients of its class waiting at the same time (0: 1).
	Weight float64
	// Priority is the class of its requests unless a request's
	// x-apidispatch-priority header says otherwise (zero: Interactive).
	Priority Class
	// MaxInFlight caps its requests admitted at once, over every pool
	// (0: no cap; it may take every slot no one else waits for).
	MaxInFlight int
}

// Config is a gateway. Zero fields take the defaults noted.
type Config struct {
	Orgs    []org.Org
	BaseURL string // upstream API root; default https://api.anthropic.com
	Caps    map[string]int
	Speed   float64
	Prices  *cost.Table
	// MaxCost caps the whole gateway (0: none); each Client may have its own.
	MaxCost cost.Nanos
	Clients []Client
	// RetryFor bounds how long a request is retried inside the gateway
	// (default 10 minutes of wall time).
	RetryFor time.Duration
	// Timeout bounds one upstream attempt, of a Messages request or of a
	// gateway batch's request sent on the sync route (default 10 min of
	// server time).
	Timeout time.Duration
	// StateDir holds ledger.jsonl and batches/ (default gateway-state).
	StateDir string
	// Lane tunes the lanes; NewGate makes a lane's gate (default
	// gate.NewLane; the shared budget's with --shared).
	Lane    gate.LaneConfig
	NewGate func(gate.LaneConfig) gate.Gate
	// HTTPClient sends upstream, for sync requests and gateway batches
	// (default: apihttp.NewClient). Whatever it is, the gateway uses a copy
	// guarded by apihttp.Guard: no redirect is followed, so no upstream key
	// leaves for another host.
	HTTPClient *http.Client
	// Spend, when set, is the gateway's spend gate (its cap replaces
	// MaxCost; it is not seeded from the ledger); every client's gate is
	// its child. Default: spend.New with MaxCost, seeded from the ledger.
	Spend *spend.Gate
	// SharedSpend, when set (--shared) and Spend is not, makes the
	// gateway's MaxCost and each client's MaxCost one budget for every
	// gateway on its Redis (sharedspend.go).
	SharedSpend *shared.Budget
	Log         *slog.Logger
	// Limits, when set, gives gateway batches the orgs' batch queue caps.
	Limits *plan.Limits
	// Cache, when set, answers non-streaming Messages requests the
	// upstream API (its origin) answered before, and stores the successes
	// of the others, as CacheMode says (default readwrite); CacheSampled
	// also keys requests with temperature above 0 or unset (run's
	// --cache-sampled). The caller opens and closes it.
	Cache        *cache.Cache
	CacheMode    cache.Mode
	CacheSampled bool
	// CacheScope is CacheScopeClient (the default: a client's hits are
	// its own answers) or CacheScopeShared (every client's, and those of 'run').
	CacheScope string
	// CacheLease is the lease of the gateway's claims on requests in
	// flight in the cache file (default cache.DefaultLease): how long the
	// other processes on the file wait for a request this gateway was
	// sending when it died, before one of them sends it.
	CacheLease time.Duration
	// PublicURL is the base URL clients reach the gateway at, for the
	// results_url of its batches (default: the scheme and local address of
	// the connection the request came in on; never the client's Host).
	PublicURL string
	// BodyTimeout bounds reading a request's body (default
	// DefaultBodyTimeout, and a second more for each MB received, so that
	// a big body sent steadily is read whole); WriteTimeout bounds each
	// write of an answer to a client (default DefaultWriteTimeout): a client
	// that takes no bytes for that long is cut. Neither holds up a lane: an
	// upstream answer is read to its end whatever the client reads.
	BodyTimeout  time.Duration
	WriteTimeout time.Duration
}

// Gateway serves the API. Use New, then Handler; Close when done.
type Gateway struct {
	cfg     Config
	base    string
	client  *http.Client
	lanes   *laneSet
	ledger  *Ledger
	journal *spendJournal          // every attempt, before it is sent (journal.go)
	gate    *spend.Gate            // the gateway's (--max-cost)
	gates   map[string]*spend.Gate // each client's, children of gate
	tokens  []tokenEntry
	orgs    []*upstream
	rl      *rateAgg
	batches *batchStore
	files   *fileStore   // the OpenAI Files API's files (oafiles.go)
	rc      *resultCache // nil: no result cache
	log     *slog.Logger
	mux     *http.ServeMux
	rr      atomic.Uint64
	lock    *os.File // the state directory's lock, held until Close
	life    lifecycle
	probes  prober
	// discover starts learning each key's organisation (see New); called
	// before the first request the gateway sends for a client or a batch.
	discover func()

	// sharedSpend is the Redis budget of gate and gates (nil: this
	// process's alone; sharedspend.go).
	sharedSpend *shared.Spend
	// sharedFig is the latest read of sharedSpend's figures, for Status
	// (nil: no --shared).
	sharedFig atomic.Pointer[sharedFigures]

	// estimated holds the models priced by estimate, each once warned
	// about (unknown.go).
	estimated sync.Map

	stats struct {
		requests, upstreamAttempts, retries, abandoned, rateLimited, refusedCap atomic.Int64
	}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type tokenEntry struct {
	sum    [32]byte
	client string
}

// New checks cfg, opens the state directory (the ledger, the batch store)
// and resumes every open gateway batch.
func New(cfg Config) (*Gateway, error) {
	if len(cfg.Orgs) == 0 {
		return nil, org.ErrNoOrgs
	}
	if len(cfg.Clients) == 0 {
		return nil, errors.New("gateway: no clients (a token file or a clients file)")
	}
	if cfg.Prices == nil {
		cfg.Prices = cost.Default()
	}
	base, err := apihttp.ResolveBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = DefaultRetryFor
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Duration(float64(10*time.Minute) / cfg.Speed)
	}
	if cfg.StateDir == "" {
		cfg.StateDir = defaultStateDir
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.checkEdges(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, batchesDir), 0o700); err != nil {
		return nil, fmt.Errorf("gateway: state dir: %w", err)
	}
	g := &Gateway{cfg: cfg, base: strings.TrimSuffix(base.String(), "/"), log: cfg.Log, rl: newRateAgg(), rc: newResultCache(cfg, base)}
	g.client = apihttp.Guard(cfg.HTTPClient)
	if g.client == nil {
		g.client = apihttp.NewClient(nil, 4096, 0)
	}
	seen := map[string]bool{}
	for _, c := range cfg.Clients {
		if c.Name == "" || c.Token == "" {
			return nil, errors.New("gateway: a client needs a name and a token")
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("gateway: client %q named twice", c.Name)
		}
		if c.Weight < 0 || c.Weight > maxWeight || c.Weight != c.Weight {
			return nil, fmt.Errorf("gateway: client %q: weight %v: want above 0 (0: 1) and at most %d", c.Name, c.Weight, maxWeight)
		}
		if c.MaxInFlight < 0 || c.Priority >= nClasses {
			return nil, fmt.Errorf("gateway: client %q: max_in_flight %d and class %d: want max_in_flight ≥ 0 and a known class", c.Name, c.MaxInFlight, c.Priority)
		}
		seen[c.Name] = true
		g.tokens = append(g.tokens, tokenEntry{sum: sha256.Sum256([]byte(c.Token)), client: c.Name})
	}
	for _, o := range cfg.Orgs {
		g.orgs = append(g.orgs, &upstream{Org: o})
	}
	capFor := func(p *upstreampkg.Provider, model string) int { return p.CapFor(cfg.Caps, model) }
	sameOrg := upstreampkg.NewOrgs(cfg.Orgs, func(drop, keep, id, reason string) {
		g.log.Warn("two keys reach one organisation: the later org's lanes stop", "org", drop, "same_as", keep, "organization_id", id)
	})
	g.lanes = newLaneSet(g.orgs, cfg.Lane, capFor, cfg.Speed, cfg.NewGate, sameOrg)
	g.lanes.setClients(cfg.Clients)
	// One gateway per state directory: each keeps the clients' spend in
	// memory, so two on one ledger would each allow a client its max_cost.
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	g.lock = lock
	if g.ledger, err = OpenLedger(filepath.Join(cfg.StateDir, ledgerFile)); err != nil {
		lock.Close()
		return nil, err
	}
	dead, lastSent := []spendTag(nil), time.Time{}
	if g.journal, dead, lastSent, err = openSpendJournal(cfg.StateDir, g.ledger, g.log); err != nil {
		g.ledger.Close()
		lock.Close()
		return nil, err
	}
	// The attempts a dead gateway had in flight may still run upstream, on
	// this gateway's keys: their slots stay taken while the API may run
	// them.
	g.lanes.holdDead(dead, lastSent, cfg.Timeout)
	if err := g.openGates(); err != nil {
		g.closeSpend()
		lock.Close()
		return nil, err
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.life.init(g.ctx)
	// Each key's organisation, learnt from a request of its own (see
	// upstream.Orgs.Discover) rather than from its first message, which
	// a slow API can hold for minutes. It starts with the first work to
	// send (a client's Messages request past its checks, a batch's run),
	// not here nor for a request refused before it is sent: a gateway
	// stopped by a signal that came while it started (serve listens for
	// them before New), or whose New fails, sends nothing. Drain stops it
	// (batchCtx), as it stops every request the gateway sends of its own
	// accord.
	g.discover = sync.OnceFunc(func() {
		sameOrg.Discover(g.life.batchCtx, upstreampkg.Discovery{Client: g.client, Base: g.base, Orgs: cfg.Orgs,
			Timeout: min(cfg.Timeout, upstreampkg.DiscoverTimeout), Speed: cfg.Speed})
	})
	g.mux = http.NewServeMux()
	g.routes()
	if g.files, err = openFileStore(cfg.StateDir, cfg.Speed); err != nil {
		g.closeSpend()
		lock.Close()
		return nil, err
	}
	if g.batches, err = openBatchStore(g); err != nil {
		g.closeSpend()
		lock.Close()
		return nil, err
	}
	if g.sharedSpend != nil {
		g.readSharedFigures()
		g.wg.Go(g.sharedFiguresLoop)
	}
	if err := g.writeStatus(time.Now(), false); err != nil {
		g.log.Warn("writing the status file", "error", err)
	}
	g.wg.Go(g.flushLoop)
	if g.rc != nil {
		g.startCache()
	}
	return g, nil
}

// flushLoop writes the ledger to its file (and the journal's ends after
// it) every 100 ms, or sooner when 64 KB of entries wait.
func (g *Gateway) flushLoop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	wrote := time.Now()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		case <-g.ledger.full:
		}
		if err := g.flushSpend(); err != nil {
			g.log.Error("writing the ledger", "error", err)
		}
		if now := time.Now(); now.Sub(wrote) >= StatusEvery {
			wrote = now
			if err := g.writeStatus(now, false); err != nil {
				g.log.Warn("writing the status file", "error", err)
			}
		}
	}
}

// StatusEvery is how often a gateway writes STATE_DIR/status.json.
const StatusEvery = time.Second

// StatusSnapshot is what STATE_DIR/status.json holds: the whole gateway's
// Status at At, written every StatusEvery while it runs and once more,
// Stopped, when it closes. 'apidispatch status --gateway STATE_DIR' reads it.
type StatusSnapshot struct {
	At      time.Time `json:"at"`
	PID     int       `json:"pid"`
	Stopped bool      `json:"stopped,omitempty"`
	Status
}

// writeStatus replaces the status file atomically (0600: it names the
// clients and their spend).
func (g *Gateway) writeStatus(now time.Time, stopped bool) error {
	b, err := json.MarshalIndent(StatusSnapshot{At: now.UTC(), PID: os.Getpid(), Stopped: stopped, Status: g.Status()}, "", "  ")
	if err != nil {
		return err
	}
	return rundir.WriteFileAtomic(filepath.Join(g.cfg.StateDir, statusFile), append(b, '\n'), 0o600)
}

// ReadStatus reads the status file of the gateway whose --state-dir is dir.
func ReadStatus(dir string) (StatusSnapshot, error) {
	var s StatusSnapshot
	b, err := os.ReadFile(filepath.Join(dir, statusFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return s, fmt.Errorf("%s: no %s: not a gateway's --state-dir, or its gateway never ran: %w", dir, statusFile, err)
		}
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", filepath.Join(dir, statusFile), err)
	}
	return s, nil
}

// Close drains the gateway (see Drain), stops its batches (they resume at
// the next New on the same state directory), waits for them and closes
// the ledger. In-flight HTTP requests are the http.Server's to drain
// first (Serve does both); Close waits a moment for the handlers still
// running to record what they settle.
func (g *Gateway) Close() error {
	g.Drain()
	g.life.waitIdle(closeWait)
	g.cancel()
	g.wg.Wait()
	g.stopCache()
	g.lanes.stop()
	err := g.closeSpend()
	if g.sharedSpend != nil {
		if serr := g.sharedSpend.Close(); err == nil {
			err = serr
		}
	}
	if werr := g.writeStatus(time.Now(), true); werr != nil {
		g.log.Warn("writing the status file", "error", werr)
	}
	g.lock.Close()
	return err
}

// Ledger returns the gateway's ledger.
func (g *Gateway) Ledger() *Ledger { return g.ledger }

// Handler is the gateway's HTTP handler (its routes behind guard).
func (g *Gateway) Handler() http.Handler { return g.guard(g.mux) }

func (g *Gateway) routes() {
	h := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, client string)) {
		g.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			client, ok := g.authenticate(r)
			if !ok {
				g.unauthorized(w, r)
				return
			}
			if g.refuseDraining(w, r) {
				return
			}
			fn(w, r, client)
		})
	}
	h("POST /v1/messages", g.messages)
	h("POST /v1/messages/count_tokens", g.countTokens)
	h("GET /v1/models", g.passthrough)
	h("GET /v1/models/{id}", g.passthrough)
	h("POST /v1/chat/completions", g.chatCompletions)
	h("POST /v1/messages/batches", g.createBatch)
	h("GET /v1/messages/batches", g.listBatches)
	h("GET /v1/messages/batches/{id}", g.retrieveBatch)
	h("DELETE /v1/messages/batches/{id}", g.deleteBatch)
	h("POST /v1/messages/batches/{id}/cancel", g.cancelBatch)
	h("GET /v1/messages/batches/{id}/results", g.batchResults)
	// The OpenAI Files and Batches APIs. An Anthropic client (one that
	// sends anthropic-version) asking these paths (Anthropic's own Files
	// API shares /v1/files) is not served them: its 404, as before.
	oa := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, client string)) {
		h(pattern, func(w http.ResponseWriter, r *http.Request, client string) {
			if r.Header.Get(anthropic.HeaderVersion) != "" {
				writeError(w, http.StatusNotFound, anthropic.ErrNotFound, "Not Found")
				return
			}
			fn(w, r, client)
		})
	}
	oa("POST /v1/files", g.uploadFile)
	oa("GET /v1/files", g.listFiles)
	oa("GET /v1/files/{id}", g.getFile)
	oa("DELETE /v1/files/{id}", g.deleteFile)
	oa("GET /v1/files/{id}/content", g.fileContent)
	oa("POST /v1/batches", g.createOABatch)
	oa("GET /v1/batches", g.listOABatches)
	oa("GET /v1/batches/{id}", g.retrieveOABatch)
	oa("POST /v1/batches/{id}/cancel", g.cancelOABatch)
	h("GET /apidispatch/status", g.status)
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := g.authenticate(r); !ok {
			g.unauthorized(w, r)
			return
		}
		g.errWriterFor(r)(w, http.StatusNotFound, anthropic.ErrNotFound, "Not Found")
	})
}

// isOpenAIRequest reports whether r is of the OpenAI API: its route (the
// Files and Batches paths unless r sends anthropic-version), or a path
// both APIs share asked by an OpenAI client (isOpenAIClient).
func (g *Gateway) isOpenAIRequest(r *http.Request) bool {
	p := r.URL.Path
	if p == openai.PathChatCompletions {
		return true
	}
	oaPath := p == openai.PathFiles || strings.HasPrefix(p, openai.PathFiles+"/") || p == openai.PathBatches || strings.HasPrefix(p, openai.PathBatches+"/")
	return oaPath && r.Header.Get(anthropic.HeaderVersion) == "" || g.isOpenAIClient(r)
}

// errWriterFor is the error writer of r's API.
func (g *Gateway) errWriterFor(r *http.Request) errWriter {
	if g.isOpenAIRequest(r) {
		return writeOAError
	}
	return writeError
}

// unauthorized answers a request without a known token, in its API's form.
func (g *Gateway) unauthorized(w http.ResponseWriter, r *http.Request) {
	if g.isOpenAIRequest(r) {
		writeOAErrorParam(w, http.StatusUnauthorized, openai.ErrInvalidRequest, openai.CodeInvalidAPIKey, "",
			"Incorrect API key provided. Use a token of this apidispatch gateway.")
		return
	}
	writeError(w, http.StatusUnauthorized, anthropic.ErrAuthentication, "invalid x-api-key")
}

// authenticate finds the client of the request's token (x-api-key, or
// Authorization: Bearer), comparing in constant time.
func (g *Gateway) authenticate(r *http.Request) (string, bool) {
	tok := r.Header.Get("x-api-key")
	if tok == "" {
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			tok = strings.TrimSpace(a[7:])
		}
	}
	if tok == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(tok))
	found := ""
	for _, t := range g.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
			found = t.client
		}
	}
	return found, found != ""
}

// writeError answers the API's error envelope, with x-should-retry false
// for client errors so SDKs never retry them.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	id := newRequestID()
	b, _ := json.Marshal(anthropic.ErrorEnvelope{Type: "error", Error: anthropic.ErrorDetail{Type: typ, Message: msg}, RequestID: id})
	h := w.Header()
	h.Set("content-type", "application/json")
	h.Set(anthropic.HeaderRequestID, id)
	if status < 500 && status != http.StatusTooManyRequests && status != http.StatusConflict && status != http.StatusRequestTimeout {
		h.Set(anthropic.HeaderShouldRetry, "false")
	}
	w.WriteHeader(status)
	w.Write(b)
}

func newRequestID() string { return gatewayIDPrefix + randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewToken returns a fresh random gateway token.
func NewToken() string { return "sk-gw-" + randomHex(24) }

// usableOrg returns the next org of provider p not out of rotation (round
// robin).
func (g *Gateway) usableOrg(p *upstreampkg.Provider) *upstream {
	n := uint64(len(g.orgs))
	start := g.rr.Add(1)
	for i := range n {
		u := g.orgs[(start+i)%n]
		if u.Disabled() == "" && upstreampkg.For(u.Org) == p {
			return u
		}
	}
	return nil
}

// disableOrg takes u out of rotation for every pool.
func (g *Gateway) disableOrg(u *upstream, reason string) {
	if u.Disabled() != "" {
		return
	}
	g.lanes.disableOrg(u, reason)
	g.log.Warn("org out of rotation", "org", u.Name, "key", u.Key.Fingerprint(), "reason", reason)
}

// Status is the whole gateway's state, for 'apidispatch status --gateway'
// (the status file) and the metrics.
type Status struct {
	Clients []ClientSpend `json:"clients"`
	Total   ClientSpend   `json:"total"`
	Queued  int           `json:"queued"`
	// Queues is the queue and in flight by client and class, with the
	// waits' percentiles.
	Queues    []QueueStatus       `json:"queues,omitempty"`
	Lanes     []gate.LaneSnapshot `json:"lanes"`
	Requests  int64               `json:"requests"`
	Attempts  int64               `json:"upstream_attempts"`
	Retries   int64               `json:"retries"`
	Abandoned int64               `json:"abandoned"`
	RefusedAt int64               `json:"refused_by_cap"`
	Orgs      map[string]string   `json:"orgs_out_of_rotation,omitempty"`
	Batches   map[string]int      `json:"batches"`
	// OrgSpend is what the ledger holds by org, in US dollars; gateway
	// batches, which span orgs, under OrgGatewayBatches.
	OrgSpend map[string]float64 `json:"spend_by_org_usd,omitempty"`
	// Cache is the result cache's hits and misses (with --cache).
	Cache *CacheStatus `json:"cache,omitempty"`
}

// ClientView is one client's view of the gateway (GET /apidispatch/status):
// its own spend (by org too) and gateway batches by status, and the queue,
// lanes and orgs out of rotation that every client shares; nothing of
// another client, nor the gateway's totals.
type ClientView struct {
	Client  string              `json:"client"`
	Clients []ClientSpend       `json:"clients"` // the client's own
	Queued  int                 `json:"queued"`
	Queues  []QueueStatus       `json:"queues,omitempty"` // the client's own
	Lanes   []gate.LaneSnapshot `json:"lanes"`
	Orgs    map[string]string   `json:"orgs_out_of_rotation,omitempty"`
	Batches map[string]int      `json:"batches"`
}

// Status returns the whole gateway's state now.
func (g *Gateway) Status() Status {
	cl, tot := g.ledger.Totals()
	listed := map[string]bool{}
	for _, c := range cl {
		listed[c.Client] = true
	}
	for _, c := range g.cfg.Clients {
		if !listed[c.Name] {
			cl = append(cl, ClientSpend{Client: c.Name})
		}
	}
	sort.Slice(cl, func(i, j int) bool { return cl[i].Client < cl[j].Client })
	for i := range cl {
		if cg := g.gates[cl[i].Client]; cg != nil {
			cl[i].CapUSD, cl[i].InFlight = cg.Cap().USD(), (cg.Reserved() + cg.Held()).USD()
		}
	}
	tot.CapUSD, tot.InFlight = g.gate.Cap().USD(), (g.gate.Reserved() + g.gate.Held()).USD()
	g.sharedStatus(cl, &tot)
	s := Status{Clients: cl, Total: tot, Queued: g.lanes.queued(), Queues: g.lanes.queueStatus(), Lanes: g.lanes.snapshots(time.Now()),
		Requests: g.stats.requests.Load(), Attempts: g.stats.upstreamAttempts.Load(), Retries: g.stats.retries.Load(),
		Abandoned: g.stats.abandoned.Load(), RefusedAt: g.stats.refusedCap.Load(), Batches: g.batches.counts(""),
		OrgSpend: usdByOrg(g.ledger.ByOrg()), Cache: g.rc.status()}
	for _, u := range g.orgs {
		if r := u.Disabled(); r != "" {
			if s.Orgs == nil {
				s.Orgs = map[string]string{}
			}
			s.Orgs[u.Name] = r
		}
	}
	return s
}

// ClientStatus is client's view of the gateway now.
func (g *Gateway) ClientStatus(client string) ClientView {
	st := g.Status()
	v := ClientView{Client: client, Clients: []ClientSpend{}, Queued: st.Queued, Lanes: st.Lanes, Orgs: st.Orgs,
		Batches: g.batches.counts(client)}
	for _, c := range st.Clients {
		if c.Client == client {
			v.Clients = append(v.Clients, c)
		}
	}
	for _, q := range st.Queues {
		if q.Client == client {
			v.Queues = append(v.Queues, q)
		}
	}
	return v
}

// status serves GET /apidispatch/status: the caller's view (ClientStatus).
func (g *Gateway) status(w http.ResponseWriter, r *http.Request, client string) {
	b, _ := json.Marshal(g.ClientStatus(client))
	w.Header().Set("content-type", "application/json")
	w.Write(b)
}
