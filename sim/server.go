package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/org"
)

// MaxBodyBytes is the largest request body accepted (32 MB); larger is 413.
const MaxBodyBytes = 32 << 20

// accelSlots is the length, in API seconds, of each org's request-rate
// history (acceleration limits look at most this far back).
const accelSlots = 256

// Server is the simulator: an http.Handler (see the package doc for its
// routes) plus Go methods to read its ledger and statistics and to change
// faults while it runs. Create it with New (the zero value is not usable);
// all methods are safe for concurrent use. Close flushes the ledger file.
type Server struct {
	cfg      Config
	speed    float64
	start    time.Time
	seed     uint64
	lat      latencyModel
	reserve  bool // OTPMReserveMaxTokens
	speedHdr []string

	counter atomic.Uint64 // requests seen
	seq     atomic.Int64  // ledger sequence

	orgs   []*orgState
	byName map[string]*orgState
	byKey  map[string]*keyState

	faults  atomic.Pointer[faultSet]
	faultMu sync.Mutex // serialises fault changes
	faultN  int

	batches batchStore // Message Batches, per org (batch.go)

	dups      dupIndex
	dupBodies atomic.Int64
	file      *ledgerFile

	closeOnce sync.Once
	closeErr  error
}

type keyState struct {
	org    *orgState
	secret string
	fp     string
	totals Totals // guarded by org.mu
}

type accelSlot struct{ sec, n int64 }

// orgState is one org at run time. Counters that every request touches are
// atomics; the series, ledger and in-flight count are under mu, one lock per
// org, never a global one.
type orgState struct {
	idx       int
	name, id  string
	idHdr     []string
	capacity  int
	keys      []*keyState
	pools     map[anthropic.Pool]*poolLimiter // pools served; nil limiter when unlimited
	poolOrder []anthropic.Pool

	status    [len(statusCodes) + 1]atomic.Int64
	costNanos atomic.Int64

	mu          sync.Mutex
	inFlight    int64
	maxInFlight int64
	completions int64
	series      []SeriesPoint
	ledger      []LedgerEntry
	accel       [accelSlots]accelSlot
	cache       map[promptCacheID]promptCacheEntry // prompt cache (promptcache.go)
	cacheWrites int64

	// oaCache is an OpenAI org's automatic prompt cache: prefix → expiry
	// (API time), made on first use.
	oaCache map[[16]byte]time.Duration
	oa      *oaOrg // an OpenAI org's state (openai.go); nil for an Anthropic org
}

// Canonical header keys, so that hot paths set the map directly.
var (
	hRequestID   = textproto.CanonicalMIMEHeaderKey(anthropic.HeaderRequestID)
	hOrgID       = textproto.CanonicalMIMEHeaderKey(anthropic.HeaderOrganizationID)
	hRetryAfter  = textproto.CanonicalMIMEHeaderKey(anthropic.HeaderRetryAfter)
	hRetryAfterM = textproto.CanonicalMIMEHeaderKey(anthropic.HeaderRetryAfterMs)
	hShouldRetry = textproto.CanonicalMIMEHeaderKey(anthropic.HeaderShouldRetry)
	hSpeed       = "X-Sim-Speed-Factor"
	hContentType = "Content-Type"
	hContentLen  = "Content-Length"
	hRate        = [4][3]string{} // requests, tokens, input, output × limit, remaining, reset
	jsonType     = []string{"application/json"}
	trueValue    = []string{"true"}
)

func init() {
	names := [4][3]string{
		{anthropic.HeaderRequestsLimit, anthropic.HeaderRequestsRemaining, anthropic.HeaderRequestsReset},
		{anthropic.HeaderTokensLimit, anthropic.HeaderTokensRemaining, anthropic.HeaderTokensReset},
		{anthropic.HeaderInputLimit, anthropic.HeaderInputRemaining, anthropic.HeaderInputReset},
		{anthropic.HeaderOutputLimit, anthropic.HeaderOutputRemaining, anthropic.HeaderOutputReset},
	}
	for i := range names {
		for j := range names[i] {
			hRate[i][j] = textproto.CanonicalMIMEHeaderKey(names[i][j])
		}
	}
}

// New builds a simulator from cfg. It fills an org's missing ID and keys
// deterministically from Config.Seed, opens Config.LedgerPath, and starts the
// clock: fault windows and bucket refills count from now.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:      cfg,
		speed:    cfg.Speed,
		seed:     mix64(uint64(cfg.Seed) ^ 0x243f6a8885a308d3),
		lat:      latencyModel{cfg: cfg.Latency},
		reserve:  cfg.OTPMMode == OTPMReserveMaxTokens,
		speedHdr: []string{strconv.FormatFloat(cfg.Speed, 'g', -1, 64)},
		byName:   map[string]*orgState{},
		byKey:    map[string]*keyState{},
	}
	allPools := Pools()
	for i, oc := range cfg.Orgs {
		o := &orgState{idx: i, name: oc.Name, id: oc.ID, idHdr: []string{oc.ID}, capacity: oc.ServiceCapacity,
			pools: map[anthropic.Pool]*poolLimiter{}, cache: map[promptCacheID]promptCacheEntry{}}
		for _, p := range allPools {
			lim, ok := oc.Limits[p]
			if !ok {
				lim, ok = oc.Limits[AnyPool]
			}
			if !ok {
				continue
			}
			o.poolOrder = append(o.poolOrder, p)
			if cfg.Unlimited {
				o.pools[p] = nil
			} else {
				o.pools[p] = newPoolLimiter(lim, cfg.BurstFraction, cfg.Speed)
			}
		}
		if oc.isOpenAI() {
			o.oa = s.newOpenAIOrg(oc)
			s.openAIPools(o, oc)
		}
		for _, k := range oc.Keys {
			ks := &keyState{org: o, secret: k, fp: org.Fingerprint(k)}
			o.keys = append(o.keys, ks)
			s.byKey[k] = ks
		}
		s.orgs = append(s.orgs, o)
		s.byName[o.name] = o
	}
	if cfg.LedgerPath != "" {
		f, err := openLedgerFile(cfg.LedgerPath)
		if err != nil {
			return nil, err
		}
		s.file = f
	}
	s.faults.Store(&faultSet{})
	s.start = time.Now()
	if err := s.SetFaults(cfg.Faults...); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// withDefaults fills unset fields and generated org ids and keys.
func (c Config) withDefaults() Config {
	if c.Speed == 0 {
		c.Speed = 1
	}
	if c.OTPMMode == "" {
		c.OTPMMode = OTPMActual
	}
	if c.BurstFraction == 0 {
		c.BurstFraction = 1
	}
	orgs := make([]OrgConfig, len(c.Orgs))
	for i, o := range c.Orgs {
		if o.isOpenAI() {
			o.Projects = slices.Clone(o.Projects)
			o.Keys = slices.Clone(o.Keys)
			o.openAIDefaults(c.Seed)
			orgs[i] = o
			continue
		}
		if o.ID == "" {
			o.ID = orgUUID("", o.Name, c.Seed)
		}
		if len(o.Keys) == 0 {
			o.Keys = []string{simKey(o.Name, c.Seed, 0)}
		} else {
			o.Keys = slices.Clone(o.Keys)
		}
		orgs[i] = o
	}
	c.Orgs = orgs
	c.Faults = slices.Clone(c.Faults)
	return c
}

// Config returns the configuration the server runs with (defaults and
// generated ids and keys filled in). Treat it as read-only: its maps are
// the server's.
func (s *Server) Config() Config { return s.cfg }

// Speed returns the speed factor K.
func (s *Server) Speed() float64 { return s.speed }

// Elapsed returns the real and API-equivalent time since the server started.
func (s *Server) Elapsed() (real, api time.Duration) {
	el := time.Since(s.start)
	return el, s.api(el)
}

func (s *Server) api(real time.Duration) time.Duration {
	return time.Duration(float64(real) * s.speed)
}

func (s *Server) real(api time.Duration) time.Duration {
	return time.Duration(float64(api) / s.speed)
}

// Keys returns each org's keys by org name. These are the simulator's own
// fake credentials; the ledger and stats name keys only by fingerprint.
func (s *Server) Keys() map[string][]string {
	m := make(map[string][]string, len(s.orgs))
	for _, o := range s.orgs {
		for _, k := range o.keys {
			m[o.name] = append(m[o.name], k.secret)
		}
	}
	return m
}

// Orgs returns the simulator's Anthropic orgs, in configuration order,
// each with its first key, as a client configures them (OpenAIOrgs returns
// the others).
func (s *Server) Orgs() []org.Org {
	var out []org.Org
	for _, o := range s.orgs {
		if len(o.keys) > 0 && o.oa == nil {
			out = append(out, org.Org{Name: o.name, Key: org.NewKey(o.keys[0].secret), Source: "simulator"})
		}
	}
	return out
}

// AllOrgs returns every org as a client configures it, in config order:
// the Anthropic orgs as Orgs does, and the OpenAI orgs with their provider
// (their first key; no OpenAI-Organization or OpenAI-Project, which a key
// does not need).
func (s *Server) AllOrgs() []org.Org {
	var out []org.Org
	for _, o := range s.orgs {
		if len(o.keys) == 0 {
			continue
		}
		x := org.Org{Name: o.name, Key: org.NewKey(o.keys[0].secret), Source: "simulator"}
		if o.oa != nil {
			x.Provider = org.OpenAI
		}
		out = append(out, x)
	}
	return out
}

// EnvLines returns one line per org, ANTHROPIC_API_KEY_<ORG>=<first key>
// (OPENAI_API_KEY_<ORG> for an OpenAI org), with the org name upper-cased
// and "-" turned into "_", in config order: the environment form
// apidispatch reads orgs from.
func (s *Server) EnvLines() []string {
	var out []string
	for _, o := range s.orgs {
		name := strings.ToUpper(strings.ReplaceAll(o.name, "-", "_"))
		prefix := "ANTHROPIC_API_KEY_"
		if o.oa != nil {
			prefix = "OPENAI_API_KEY_"
		}
		out = append(out, prefix+name+"="+o.keys[0].secret)
	}
	return out
}

// Close flushes and closes the ledger file. The handler keeps answering
// (without writing the file). Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.file != nil {
			s.closeErr = s.file.close()
		}
	})
	return s.closeErr
}

// --- request handling -------------------------------------------------------

// call is the per-request context.
type call struct {
	w   http.ResponseWriter
	r   *http.Request
	h   http.Header
	rid string
	rng rng
	n   uint64
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix and 24 base-62 digits, unique per (n, salt): the
// digits encode mix64 of n, a bijection, so two requests never share one.
func (s *Server) newID(prefix string, n, salt uint64) string {
	var b [32]byte
	copy(b[:], prefix)
	i := len(prefix)
	for _, v := range [2]uint64{mix64(n ^ s.seed ^ salt), mix64(n + salt)} {
		for k := 0; k < 12; k++ {
			b[i] = idAlphabet[v%62]
			v /= 62
			i++
		}
	}
	return string(b[:i])
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.counter.Add(1)
	c := &call{w: w, r: r, h: w.Header(), n: n, rng: rng{s: s.seed ^ mix64(n)}}
	c.rid = s.newID("req_", n, 0x1f83d9abfb41bd6b)
	if s.isOpenAICall(r) {
		s.serveOpenAI(c) // openai.go: its own headers, errors and routes
		return
	}
	c.h[hRequestID] = []string{c.rid}
	c.h[hSpeed] = s.speedHdr
	switch r.URL.Path {
	case "/v1/messages":
		s.messages(c)
	case "/v1/messages/count_tokens":
		s.countTokens(c)
	case "/v1/models":
		s.listModels(c)
	case "/sim/stats", "/sim/ledger", "/sim/faults":
		s.admin(c)
	case "/v1/messages/batches":
		s.batchRoute(c)
	case "/sim/batches":
		s.batchAdmin(c)
	default:
		if strings.HasPrefix(r.URL.Path, "/v1/models/") {
			s.getModel(c)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/messages/batches/") {
			s.batchRoute(c)
			return
		}
		s.writeError(c, nil, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "Not Found"})
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// putBuf returns a buffer to the pool unless a huge body grew it.
func putBuf(bp *[]byte) {
	if cap(*bp) <= 1<<20 {
		bufPool.Put(bp)
	}
}

// writeJSON sends status and body with a Content-Length.
func writeJSON(c *call, status int, body []byte) {
	c.h[hContentType] = jsonType
	c.h[hContentLen] = []string{strconv.Itoa(len(body))}
	c.w.WriteHeader(status)
	c.w.Write(body)
}

// writeError sends the error envelope and counts it for org (when known).
func (s *Server) writeError(c *call, o *orgState, e *apiError) {
	bp := bufPool.Get().(*[]byte)
	b := appendError((*bp)[:0], e, c.rid)
	writeJSON(c, e.status, b)
	*bp = b
	putBuf(bp)
	if o != nil {
		s.count(o, e.status)
	}
}

// count records an answer other than a completion for o.
func (s *Server) count(o *orgState, status int) {
	o.status[statusIndex(status)].Add(1)
	now := time.Since(s.start)
	o.mu.Lock()
	p := o.pointLocked(now, s.speed)
	if status == http.StatusTooManyRequests {
		p.RateLimited++
	} else if status != http.StatusOK {
		p.Errors++
	}
	o.mu.Unlock()
}

// authenticate resolves the key (x-api-key, or "Authorization: Bearer", which
// the current official SDKs send) and checks anthropic-version. It answers
// the error itself and returns nil on failure.
func (s *Server) authenticate(c *call) *keyState {
	key := c.r.Header.Get(anthropic.HeaderAPIKey)
	if key == "" {
		if a := c.r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			key = a[7:]
		}
	}
	ks := s.byKey[key]
	if ks == nil || ks.org.oa != nil { // an OpenAI key does not open the Anthropic surface
		s.writeError(c, nil, &apiError{status: http.StatusUnauthorized, typ: anthropic.ErrAuthentication, msg: "invalid x-api-key"})
		return nil
	}
	c.h[hOrgID] = ks.org.idHdr
	if c.r.Header.Get(anthropic.HeaderVersion) == "" {
		s.writeError(c, ks.org, invalid("anthropic-version: header is required"))
		return nil
	}
	real := time.Since(s.start)
	fs := s.faults.Load()
	if fs.match(FaultKeyRevoked, ks.org.idx, "", ks.fp, s.api(real), &c.rng) != nil {
		s.writeError(c, ks.org, &apiError{status: http.StatusUnauthorized, typ: anthropic.ErrAuthentication, msg: "invalid x-api-key"})
		return nil
	}
	if fs.has(FaultBetaForbidden) {
		for _, beta := range requestBetas(c.r.Header) {
			if f := fs.matchBeta(ks.org.idx, ks.fp, beta, s.api(real)); f != nil {
				s.writeError(c, ks.org, &apiError{status: http.StatusForbidden, typ: anthropic.ErrPermission,
					msg: "anthropic-beta: your organization does not have access to " + beta})
				return nil
			}
		}
	}
	return ks
}

// requestBetas are the betas a request names in its anthropic-beta
// headers (several headers, or comma-separated values).
func requestBetas(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Anthropic-Beta") {
		for b := range strings.SplitSeq(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
	}
	return out
}

// readBody reads the request body up to MaxBodyBytes, answering 413 above.
func (s *Server) readBody(c *call, o *orgState, into []byte) ([]byte, bool) {
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, typ: anthropic.ErrRequestTooLarge, msg: "Request exceeds the maximum allowed number of bytes."}
	if c.r.ContentLength > MaxBodyBytes {
		s.writeError(c, o, tooLarge)
		return nil, false
	}
	buf := bytes.NewBuffer(into)
	n, err := buf.ReadFrom(io.LimitReader(c.r.Body, MaxBodyBytes+1))
	if n > MaxBodyBytes {
		s.writeError(c, o, tooLarge)
		return nil, false
	}
	if err != nil {
		s.writeError(c, o, invalid("could not read the request body: %v", err))
		return nil, false
	}
	return buf.Bytes(), true
}

func (s *Server) messages(c *call) {
	if c.r.Method != http.MethodPost {
		s.writeError(c, nil, &apiError{status: http.StatusMethodNotAllowed, typ: anthropic.ErrInvalidRequest, msg: "Method Not Allowed: use POST"})
		return
	}
	ks := s.authenticate(c)
	if ks == nil {
		return
	}
	o := ks.org
	bp := bufPool.Get().(*[]byte)
	defer putBuf(bp)
	body, ok := s.readBody(c, o, (*bp)[:0])
	if !ok {
		return
	}
	*bp = body[:0]
	sum := sha256.Sum256(body)
	beta := strings.Contains(c.r.Header.Get("Anthropic-Beta"), "context-1m")
	req, aerr := parseRequest(body, false, beta)
	if aerr != nil {
		s.writeError(c, o, aerr)
		return
	}
	if req.stream {
		// The same request unstreamed gets the same answer and bill.
		sum = sha256.Sum256(withoutStreamKey(body))
	}
	pool := req.model.pool
	lim, served := o.pools[pool]
	if !served {
		s.writeError(c, o, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "model: " + req.model.id})
		return
	}

	now := time.Since(s.start)
	api := s.api(now)
	fs := s.faults.Load()
	colleague := fs.colleague(o.idx, pool, api)
	if s.injectBeforeAdmission(c, ks, req, lim, fs, now, api, colleague) {
		return
	}

	// Prompt caching decides how the input splits into fresh, written and read.
	// The cache is only read here; an admitted request records its use
	// below (a refused one never reached the model).
	u := usage{input: req.input, geoUS: req.x != nil && req.x.geoUS}
	caching := s.cfg.PromptCaching && req.cacheTokens > 0
	var cacheID promptCacheID
	var cacheTTL time.Duration
	hit := false
	if caching {
		cacheID = promptCacheID{model: req.model.display, prefix: req.cacheKey}
		cacheTTL = 5 * time.Minute
		if req.cache1h {
			cacheTTL = time.Hour
		}
		o.mu.Lock()
		hit = o.promptCacheReadable(cacheID, api)
		o.mu.Unlock()
		u.input -= req.cacheTokens
		switch {
		case hit:
			u.read = req.cacheTokens
		case req.cache1h:
			u.write1h = req.cacheTokens
		default:
			u.write5m = req.cacheTokens
		}
	}
	itpm := u.input + u.write5m + u.write1h
	if pool == anthropic.PoolHaiku35 {
		itpm += u.read // † models count cache reads
	}
	var reserved int64 = 1
	if s.reserve {
		reserved = req.maxTokens
	}
	var admitted limitView
	if lim != nil {
		refused, wait, view := lim.admit(now, colleague, itpm, reserved)
		admitted = view
		if refused != dimNone {
			s.rateHeaders(c.h, view)
			s.rateLimited(c, o, true, wait, limitMessage(refused, view, o.id, req.model.id))
			return
		}
	}

	// Admitted: the request is processed.
	out := plan(sum, req)
	if out.toolInput != nil {
		out.toolID = s.newID("toolu_", c.n, 0x510e527fade682d1)
	}
	o.mu.Lock()
	o.inFlight++
	inFlight := o.inFlight
	o.maxInFlight = max(o.maxInFlight, inFlight)
	p := o.pointLocked(now, s.speed)
	p.Admitted++
	p.InFlight = inFlight
	p.InFlightMax = max(p.InFlightMax, inFlight)
	sl := &o.accel[int64(api/time.Second)%accelSlots]
	if sec := int64(api / time.Second); sl.sec != sec {
		sl.sec, sl.n = sec, 0
	}
	sl.n++
	o.mu.Unlock()

	lat := s.lat.sample(out.tokens, &c.rng)
	if f := s.lat.congestion(inFlight, o.capacity); f > 1 {
		lat = time.Duration(float64(lat) * f)
	}
	if f := fs.match(FaultSlow, o.idx, pool, ks.fp, api, &c.rng); f != nil {
		lat += f.ExtraLatency
	}
	if caching {
		o.mu.Lock()
		o.promptCacheUse(cacheID, api, s.firstTokenShare(lat, out.tokens), cacheTTL, hit)
		o.mu.Unlock()
	}
	if req.stream {
		s.streamMessage(c, ks, req, lim, reserved, sum, u, out, lat, admitted)
		return
	}
	sctx := c.r.Context()
	if s.cfg.BillAbandoned {
		sctx = context.WithoutCancel(sctx)
	}
	if !sleep(sctx, s.real(lat)) {
		// The client gave up: nothing is billed, the reservation is returned.
		now = time.Since(s.start)
		if lim != nil {
			lim.settle(now, colleague, 0, reserved)
		}
		o.mu.Lock()
		o.inFlight--
		o.pointLocked(now, s.speed).InFlight = o.inFlight
		o.mu.Unlock()
		s.count(o, 499)
		return
	}

	// Completion: charge the output, bill, answer.
	wall := time.Now()
	now = wall.Sub(s.start)
	api = s.api(now)
	fs = s.faults.Load()
	if lim != nil {
		colleague = fs.colleague(o.idx, pool, api)
		s.rateHeaders(c.h, lim.settle(now, colleague, out.tokens, reserved))
	}
	u.output = out.tokens
	delivery := DeliveryOK
	if fs.match(FaultConnectionReset, o.idx, pool, ks.fp, api, &c.rng) != nil {
		delivery = DeliveryReset
	} else if fs.match(FaultTruncatedBody, o.idx, pool, ks.fp, api, &c.rng) != nil {
		delivery = DeliveryTruncated
	}
	msgID := s.newID("msg_", c.n, 0x3c6ef372fe94f82b)
	cost := req.model.cost(u)
	s.bill(o, ks, &LedgerEntry{
		RequestID: c.rid, MessageID: msgID, Org: o.name, KeyFingerprint: ks.fp, Model: req.model.id,
		BodySHA256: sum, InputTokens: u.input, OutputTokens: u.output, CacheWrite5m: u.write5m,
		CacheWrite1h: u.write1h, CacheRead: u.read, CostNanos: cost, CostUSD: nanosToUSD(cost),
		Time: wall, APISeconds: float64(api.Microseconds()) / 1e6, Status: http.StatusOK, Delivery: delivery,
		USGeo: u.geoUS,
	}, now)

	b := appendMessage((*bp)[:0], msgID, req.model.id, out, u)
	*bp = b[:0]
	switch delivery {
	case DeliveryOK:
		writeJSON(c, http.StatusOK, b)
	case DeliveryReset:
		hijackAndClose(c, nil, 0)
	case DeliveryTruncated:
		hijackAndClose(c, b, len(b)/2)
	}
}

// injectBeforeAdmission answers the faults that strike before a request is
// admitted (spend cap, 529, 500s, a 429 storm, acceleration), in that order,
// and reports whether it answered.
func (s *Server) injectBeforeAdmission(c *call, ks *keyState, req request, lim *poolLimiter, fs *faultSet, now, api time.Duration, colleague load) bool {
	o, pool := ks.org, req.model.pool
	if f := fs.match(FaultSpendCap, o.idx, pool, ks.fp, api, &c.rng); f != nil && o.costNanos.Load() >= f.capNanos {
		resume := nextMonth(time.Now())
		s.writeError(c, o, &apiError{status: http.StatusTooManyRequests, typ: anthropic.ErrRateLimit,
			msg: fmt.Sprintf("This request would exceed your organization's monthly spend limit (org: %s). Your API access will resume at %s. To continue sooner, raise your spend limit in the Console.",
				o.id, resume.Format(time.RFC3339)),
			details: `{"error_code":"` + anthropic.SpendLimitErrorCode + `","resume_at":"` + resume.Format(time.RFC3339) + `"}`})
		return true
	}
	if fs.match(FaultOverloaded, o.idx, pool, ks.fp, api, &c.rng) != nil {
		s.writeError(c, o, &apiError{status: 529, typ: anthropic.ErrOverloaded, msg: "Overloaded", details: "null"})
		return true
	}
	if fs.match(FaultServerError, o.idx, pool, ks.fp, api, &c.rng) != nil {
		s.writeError(c, o, &apiError{status: http.StatusInternalServerError, typ: anthropic.ErrAPI, msg: "Internal server error"})
		return true
	}
	if fs.match(FaultServerErrorHTML, o.idx, pool, ks.fp, api, &c.rng) != nil {
		c.h[hContentType] = []string{"text/html; charset=utf-8"}
		c.w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(c.w, htmlError)
		s.count(o, http.StatusInternalServerError)
		return true
	}
	if f := fs.match(FaultRateLimitStorm, o.idx, pool, ks.fp, api, &c.rng); f != nil {
		if lim != nil {
			v := lim.view(now, colleague)
			if f.Exhausted {
				v.level[0] = 0
			}
			s.rateHeaders(c.h, v)
		}
		s.rateLimited(c, o, f.RetryAfter > 0, s.real(f.RetryAfter),
			fmt.Sprintf("This request would exceed your organization's rate limit (org: %s, model: %s). For details, refer to: https://docs.claude.com/en/api/rate-limits. Please try again later.", o.id, req.model.id))
		return true
	}
	if f := fs.match(FaultAcceleration, o.idx, pool, ks.fp, api, &c.rng); f != nil && o.accelerating(api, f) {
		wait := f.RetryAfter
		if wait == 0 {
			wait = f.window()
		}
		if lim != nil {
			s.rateHeaders(c.h, lim.view(now, colleague))
		}
		s.rateLimited(c, o, true, s.real(wait),
			fmt.Sprintf("This request would exceed your organization's acceleration limit: usage increased too sharply (org: %s, model: %s). Please ramp up your traffic gradually. For details, refer to: https://docs.claude.com/en/api/rate-limits.", o.id, req.model.id))
		return true
	}

	return false
}

// bill records a processed request: ledger, totals, series, duplicates.
func (s *Server) bill(o *orgState, ks *keyState, e *LedgerEntry, now time.Duration) {
	s.record(o, ks, e, now, true)
}

// record puts a billed request in the ledger, the totals, the series and
// the duplicate count; sync requests also leave the in-flight count and
// count as a 200.
func (s *Server) record(o *orgState, ks *keyState, e *LedgerEntry, now time.Duration, sync bool) {
	dup, second := s.dups.add(e.BodySHA256)
	e.Duplicate = dup
	if second {
		s.dupBodies.Add(1)
	}
	e.Seq = s.seq.Add(1)
	o.costNanos.Add(e.CostNanos)
	if sync {
		o.status[statusIndex(http.StatusOK)].Add(1)
	}
	o.mu.Lock()
	o.completions++
	p := o.pointLocked(now, s.speed)
	p.Completions++
	if sync {
		o.inFlight--
		p.InFlight = o.inFlight
	}
	ks.totals.add(e)
	if r := s.cfg.LedgerRetain; r >= 0 {
		if r > 0 && len(o.ledger) >= 2*r {
			o.ledger = append(o.ledger[:0], o.ledger[len(o.ledger)-r:]...)
		}
		o.ledger = append(o.ledger, *e)
	}
	o.mu.Unlock()
	if f := s.file; f != nil {
		f.write(e)
	}
}

// rateLimited answers a 429 rate_limit_error; the rate-limit headers must
// already be set. wait is real time; retry-after is whole seconds (at least
// 1) and, when K > 1, retry-after-ms is exact.
func (s *Server) rateLimited(c *call, o *orgState, withRetryAfter bool, wait time.Duration, msg string) {
	if withRetryAfter {
		secs := int64(math.Ceil(wait.Seconds()))
		c.h[hRetryAfter] = []string{strconv.FormatInt(max(1, secs), 10)}
		if s.speed > 1 {
			ms := int64(math.Ceil(float64(wait) / float64(time.Millisecond)))
			c.h[hRetryAfterM] = []string{strconv.FormatInt(max(1, ms), 10)}
		}
	}
	c.h[hShouldRetry] = trueValue
	s.writeError(c, o, &apiError{status: http.StatusTooManyRequests, typ: anthropic.ErrRateLimit, msg: msg})
}

var dimWords = [...]string{dimRequests: "requests", dimInput: "input tokens", dimOutput: "output tokens"}

func limitMessage(d dim, v limitView, orgID, model string) string {
	advice := "Please reduce the prompt length or the maximum tokens requested, or try again later."
	if d == dimRequests {
		advice = "Please reduce the rate of requests, or try again later."
	}
	return fmt.Sprintf("This request would exceed your organization's rate limit of %s %s per minute (org: %s, model: %s). For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. %s You may also contact sales at https://claude.com/contact-sales to discuss your options for a rate limit increase.",
		numfmt.Commas(int64(v.limit[d-1])), dimWords[d], orgID, model, advice)
}

// roundThreshold: token limits at least this large report remaining rounded
// to the nearest thousand, as the API does; smaller ones (tests) exactly.
const roundThreshold = 10000

func remaining(level, limit float64, tokens bool) int64 {
	r := int64(math.Floor(math.Max(0, level)))
	if tokens && limit >= roundThreshold {
		r = (r + 500) / 1000 * 1000
	}
	return min(r, int64(limit))
}

// rateRow is one header family: requests, tokens, input or output tokens.
type rateRow struct {
	on         bool
	limit, rem int64
	until      time.Duration
}

// rateHeaders sets the anthropic-ratelimit-* headers from a bucket view.
// Reset is the real time at which the bucket is full again: whole seconds
// at K = 1, milliseconds when K > 1. All values are formatted into one
// buffer and sliced out of one string: two allocations, not twelve.
func (s *Server) rateHeaders(h http.Header, v limitView) {
	if !v.on {
		return
	}
	var rows [4]rateRow // in hRate order: requests, tokens, input, output
	if v.limit[0] > 0 {
		rows[0] = rateRow{true, int64(v.limit[0]), remaining(v.level[0], v.limit[0], false), v.untilFull[0]}
	}
	for i := 1; i <= 2; i++ {
		if v.limit[i] > 0 {
			rows[i+1] = rateRow{true, int64(v.limit[i]), remaining(v.level[i], v.limit[i], true), v.untilFull[i]}
		}
	}
	if rows[2].on || rows[3].on {
		rows[1] = rateRow{true, rows[2].limit + rows[3].limit, rows[2].rem + rows[3].rem, max(rows[2].until, rows[3].until)}
	}
	now := time.Now().UTC()
	var arr [320]byte
	var ends [12]int
	buf := arr[:0]
	for i, r := range rows {
		if !r.on {
			continue
		}
		buf = strconv.AppendInt(buf, r.limit, 10)
		ends[i*3] = len(buf)
		buf = strconv.AppendInt(buf, r.rem, 10)
		ends[i*3+1] = len(buf)
		buf = s.appendReset(buf, now, r.until)
		ends[i*3+2] = len(buf)
	}
	all := string(buf)
	vals := make([]string, 12)
	start := 0
	for i, r := range rows {
		if !r.on {
			continue
		}
		for j := 0; j < 3; j++ {
			k := i*3 + j
			vals[k] = all[start:ends[k]]
			start = ends[k]
			h[hRate[i][j]] = vals[k : k+1 : k+1]
		}
	}
}

func (s *Server) appendReset(b []byte, now time.Time, until time.Duration) []byte {
	t := now.Add(until)
	if s.speed == 1 {
		if t.Nanosecond() > 0 {
			t = t.Truncate(time.Second).Add(time.Second)
		}
		return t.AppendFormat(b, time.RFC3339)
	}
	return t.AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
}

// accelerating reports whether o's admitted-request rate over the fault's
// window is above both its floor and factor times the baseline before it.
func (o *orgState) accelerating(api time.Duration, f *activeFault) bool {
	window, baseline := int64(f.window()/time.Second), int64(f.baseline()/time.Second)
	factor, floor := f.Factor, f.FloorRPM
	if factor == 0 {
		factor = 3
	}
	if floor == 0 {
		floor = 1000
	}
	cur := int64(api / time.Second)
	o.mu.Lock()
	sum := func(from, to int64) (n int64) {
		for sec := max(from, 0); sec < to; sec++ {
			if sl := o.accel[sec%accelSlots]; sl.sec == sec {
				n += sl.n
			}
		}
		return n
	}
	short := sum(cur-window+1, cur+1)
	base := sum(cur-window-baseline+1, cur-window+1)
	o.mu.Unlock()
	shortRPM := float64(short) / (float64(window) / 60)
	baseRPM := float64(base) / (float64(baseline) / 60)
	return shortRPM > floor && shortRPM > factor*baseRPM
}

func (f *activeFault) window() time.Duration {
	if f.Window < time.Second {
		return 5 * time.Second
	}
	return f.Window
}

func (f *activeFault) baseline() time.Duration {
	if f.Baseline < time.Second {
		return 60 * time.Second
	}
	return f.Baseline
}

// nextMonth is 00:00 UTC on the first of the month after t.
func nextMonth(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
}

const htmlError = `<html>
<head><title>500 Internal Server Error</title></head>
<body>
<center><h1>500 Internal Server Error</h1></center>
<hr><center>cloudflare</center>
</body>
</html>
`

var timerPool = sync.Pool{}

// sleep waits d or until ctx is done, reporting whether d passed. It runs in
// the handler's goroutine on a pooled timer.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t, _ := timerPool.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(d)
	} else {
		t.Reset(d)
	}
	defer timerPool.Put(t)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// hijackAndClose takes over the connection, writes the status line, headers
// and body[:n] when body is not nil, and closes it: with a TCP reset when
// body is nil (linger 0).
func hijackAndClose(c *call, body []byte, n int) {
	conn, bw, err := http.NewResponseController(c.w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2 or a test recorder): the best imitation is
		// an abort of the handler, which the server turns into a reset.
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	if body == nil {
		if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
			tc.SetLinger(0)
		}
		return
	}
	c.h[hContentType] = jsonType
	c.h[hContentLen] = []string{strconv.Itoa(len(body))}
	bw.WriteString("HTTP/1.1 200 OK\r\n")
	c.h.Write(bw)
	bw.WriteString("\r\n")
	bw.Write(body[:n])
	bw.Flush()
}

// --- other endpoints --------------------------------------------------------

func (s *Server) countTokens(c *call) {
	if c.r.Method != http.MethodPost {
		s.writeError(c, nil, &apiError{status: http.StatusMethodNotAllowed, typ: anthropic.ErrInvalidRequest, msg: "Method Not Allowed: use POST"})
		return
	}
	ks := s.authenticate(c)
	if ks == nil {
		return
	}
	bp := bufPool.Get().(*[]byte)
	defer putBuf(bp)
	body, ok := s.readBody(c, ks.org, (*bp)[:0])
	if !ok {
		return
	}
	*bp = body[:0]
	req, aerr := parseRequest(body, true, strings.Contains(c.r.Header.Get("Anthropic-Beta"), "context-1m"))
	if aerr != nil {
		s.writeError(c, ks.org, aerr)
		return
	}
	writeJSON(c, http.StatusOK, []byte(`{"input_tokens":`+strconv.FormatInt(req.input, 10)+`}`))
}
