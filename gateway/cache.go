package gateway

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
)

// headerCached marks an answer the result cache gave: nothing was sent
// upstream and nothing billed.
const headerCached = "x-apidispatch-cached"

// The result cache seam (Config.Cache). A non-streaming POST /v1/messages
// is keyed as 'run' keys an item's params (cache.InspectMessage of the
// body: everything but metadata and stream; a sampled request only with
// CacheSampled). In a reading mode an
// entry the same upstream origin answered is the answer: status 200, the
// stored body, no lane, no reservation, a zero-cost ledger line. A miss is
// sent as usual and its success stored (writing modes). In readwrite mode
// identical requests in flight at once are sent once: the first is the
// leader, the others wait for it to end and then read the cache again (a
// hit, or, when the leader failed, one of them leads next). Across
// processes on one cache file (gateways, runs) the leader then claims its
// key in the file (cache.Claimer), in one transaction with a last look-up:
// when another process holds the key, the leader waits for that process's
// entry, polling with a back-off and holding no lane slot and no spend
// reservation, until the entry is there (a hit), the claim is released
// (the other failed: this one sends) or its lease ends unrenewed (the
// other died: this one takes it over and sends). Its client going away
// ends the wait. Streams are never keyed.

// Scopes of the result cache in the gateway (Config.CacheScope).
const (
	// CacheScopeClient (the default): a client is answered from the cache
	// only with answers to its own requests; entries are keyed with its
	// token, so a client whose token changes starts afresh, and the
	// entries 'run' stored answer no client.
	CacheScopeClient = "client"
	// CacheScopeShared: every client is answered with every client's
	// answers and those of 'run'. A hit reveals that someone sent the same
	// request before.
	CacheScopeShared = "shared"
)

// resultCache is the gateway's use of one cache file.
type resultCache struct {
	c       *cache.Cache
	mode    cache.Mode
	sampled bool
	origin  string
	shared  bool // CacheScopeShared

	mu      sync.Mutex
	flights map[cache.Key]chan struct{} // leaders in flight (readwrite)
	// claims holds the keys this gateway's leaders send, against the
	// other processes on the file (readwrite; set by startCache).
	claims *cache.Claimer
	lease  time.Duration
	// puts go to one writer goroutine (cacheWriter), which stores what
	// waits in one transaction: concurrent misses never contend for the
	// file's write lock.
	puts chan putReq

	hits, misses, stored, otherOrigin, damaged, errors atomic.Int64
	// waitedElsewhere counts the requests that waited for another
	// process's answer to the same request.
	waitedElsewhere atomic.Int64
	saved           atomic.Int64 // cost.Nanos the hits did not pay
	warnedOther     atomic.Bool
}

func newResultCache(cfg Config, base *url.URL) *resultCache {
	if cfg.Cache == nil || cfg.CacheMode == cache.ModeOff {
		return nil
	}
	mode := cfg.CacheMode
	if mode == "" {
		mode = cache.ModeReadWrite
	}
	return &resultCache{c: cfg.Cache, mode: mode, sampled: cfg.CacheSampled, origin: cache.OriginOf(base),
		shared: cfg.CacheScope == CacheScopeShared, flights: map[cache.Key]chan struct{}{}, puts: make(chan putReq), lease: cfg.CacheLease}
}

// startCache starts the cache's writer and, in readwrite mode, its claims
// across processes; stopCache ends the claims (after the writer and the
// handlers).
func (g *Gateway) startCache() {
	if g.rc.mode.Reads() && g.rc.mode.Writes() {
		g.rc.claims = g.rc.c.NewClaimer(g.rc.lease)
	}
	g.wg.Go(g.cacheWriter)
}

func (g *Gateway) stopCache() {
	if g.rc == nil || g.rc.claims == nil {
		return
	}
	if err := g.rc.claims.Close(); err != nil {
		g.log.Warn("releasing the result cache's claims (they lapse after their lease)", "error", err)
	}
}

type putReq struct {
	e    cache.Entry
	done chan error
}

// putBatchMax bounds the entries of one write transaction.
const putBatchMax = 512

// cacheWriter stores the entries finish hands it, all that wait in one
// transaction, until the gateway closes.
func (g *Gateway) cacheWriter() {
	rc := g.rc
	batch := make([]putReq, 0, putBatchMax)
	entries := make([]cache.Entry, 0, putBatchMax)
	for {
		batch, entries = batch[:0], entries[:0]
		select {
		case <-g.ctx.Done():
			return
		case p := <-rc.puts:
			batch = append(batch, p)
		}
	more:
		for len(batch) < putBatchMax {
			select {
			case p := <-rc.puts:
				batch = append(batch, p)
			default:
				break more
			}
		}
		for _, p := range batch {
			entries = append(entries, p.e)
		}
		err := rc.put(entries)
		for _, p := range batch {
			p.done <- err
		}
	}
}

// put stores entries and counts the new ones.
func (rc *resultCache) put(entries []cache.Entry) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := rc.c.Put(ctx, entries)
	rc.stored.Add(n)
	return err
}

// CacheStatus is the gateway's use of the result cache since it started.
type CacheStatus struct {
	Path string `json:"path"`
	// Scope is CacheScopeClient or CacheScopeShared.
	Scope  string `json:"scope"`
	Mode   string `json:"mode"`
	Origin string `json:"origin"`
	// Hits were answered from the cache; SavedUSD is what their requests
	// cost when they were sent. Misses were keyed and sent; Stored is how
	// many successes were new to the file.
	Hits     int64   `json:"hits"`
	Misses   int64   `json:"misses"`
	Stored   int64   `json:"stored"`
	SavedUSD float64 `json:"saved_usd"`
	// OtherOrigin counts misses whose request the cache holds only with
	// another API's answer (a simulator's never answers a real API).
	OtherOrigin int64 `json:"other_origin"`
	Damaged     int64 `json:"damaged"`
	Errors      int64 `json:"errors"`
	// WaitedElsewhere counts the requests that waited for another process
	// on the cache file (a gateway, a run) sending the same request; each
	// then counts as a hit, or as a miss when that process failed or died.
	WaitedElsewhere int64 `json:"waited_elsewhere"`
}

func (rc *resultCache) status() *CacheStatus {
	if rc == nil {
		return nil
	}
	scope := CacheScopeClient
	if rc.shared {
		scope = CacheScopeShared
	}
	return &CacheStatus{Path: rc.c.Path(), Scope: scope, Mode: string(rc.mode), Origin: rc.origin,
		Hits: rc.hits.Load(), Misses: rc.misses.Load(), Stored: rc.stored.Load(), SavedUSD: cost.Nanos(rc.saved.Load()).USD(),
		OtherOrigin: rc.otherOrigin.Load(), Damaged: rc.damaged.Load(), Errors: rc.errors.Load(), WaitedElsewhere: rc.waitedElsewhere.Load()}
}

// cacheGet reads k's entry for this origin; a read error, a damaged entry
// or another origin's entry is a miss (said in the log; elsewhere reports
// the last).
func (g *Gateway) cacheGet(ctx context.Context, k cache.Key) (e cache.Entry, ok, elsewhere bool) {
	rc := g.rc
	hits, bad, other, err := rc.c.Get(ctx, []cache.Key{k}, rc.origin)
	if err != nil {
		if ctx.Err() == nil {
			rc.errors.Add(1)
			g.log.Warn("reading the result cache; the request is sent", "error", err)
		}
		return cache.Entry{}, false, false
	}
	for _, b := range bad {
		rc.damaged.Add(1)
		g.log.Warn("a damaged cache entry is treated as a miss", "cache", rc.c.Path(), "key", b.Key.String(), "reason", b.Reason)
	}
	if len(other) > 0 {
		if !rc.warnedOther.Swap(true) {
			g.log.Warn("the result cache holds requests answered by another API than this gateway's upstream: they are sent "+
				"(an answer is reused only from the origin that gave it); counted in the status as other_origin",
				"cache", rc.c.Path(), "origin", rc.origin, "other", cache.Describe(other[0].Origin, other[0].Simulated))
		}
	}
	e, ok = hits[k]
	return e, ok, len(other) > 0
}

// cacheTicket is a keyed miss on its way upstream: finish stores its
// success and lets the requests that waited for it read the cache.
type cacheTicket struct {
	g     *Gateway
	key   cache.Key
	model string
	done  chan struct{} // nil: not a leader (write mode)
	// claimed: the key is this gateway's in the cache file; finish ends
	// the claim (the Put that stores the answer, or a release).
	claimed bool
}

// won is an upstream success, for the cache.
type won struct {
	body      []byte
	cost      cost.Nanos
	usage     anthropic.Usage
	org       string
	requestID string
	simulated bool
}

// simulated reports an answer of apidispatch's simulator (its mark,
// cache.SimulatorHeader), as the cache records it.
func simulated(h http.Header) bool { return h.Get(cache.SimulatorHeader) != "" }

// fromCache answers a non-streaming request from the cache when it can
// (answered true), or returns the ticket its miss goes upstream with (nil
// when the request is not keyed). answered is also true when the client
// went away while waiting for an identical request.
func (g *Gateway) fromCache(w http.ResponseWriter, r *http.Request, client string, body []byte, p msgParams) (*cacheTicket, bool) {
	rc := g.rc
	if rc == nil || p.Stream {
		return nil, false
	}
	k, sampled, err := cache.InspectMessage(body)
	if err != nil || sampled && !rc.sampled {
		return nil, false
	}
	k = g.scoped(withHeaders(k, r.Header), client)
	ctx := r.Context()
	if !rc.mode.Reads() {
		rc.misses.Add(1)
		return &cacheTicket{g: g, key: k, model: p.Model}, false
	}
	for {
		e, ok, elsewhere := g.cacheGet(ctx, k)
		if ok {
			g.answerCached(w, client, p, e)
			return nil, true
		}
		if !rc.mode.Writes() {
			rc.miss(elsewhere)
			return nil, false
		}
		rc.mu.Lock()
		ch, busy := rc.flights[k]
		if !busy {
			ch = make(chan struct{})
			rc.flights[k] = ch
		}
		rc.mu.Unlock()
		if !busy {
			// Led now: a leader that ended between the look-up above and
			// taking the lead stored before it let go, and another
			// process may hold the key: lead takes both into account.
			return g.lead(w, r, client, p, &cacheTicket{g: g, key: k, model: p.Model, done: ch}, elsewhere)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, true // the client went away: nothing was sent
		}
	}
}

// Polling for another process's answer: from claimPollMin, doubling to
// claimPollMax, never past the end of its claim's lease.
const (
	claimPollMin = 10 * time.Millisecond
	claimPollMax = 250 * time.Millisecond
)

// lead is fromCache for the in-process leader of a key (t): it looks the
// key up once more and claims it across processes, in one transaction;
// while another process holds the claim it waits for its answer (see the
// seam's comment). It returns t to send with, or answered.
func (g *Gateway) lead(w http.ResponseWriter, r *http.Request, client string, p msgParams, t *cacheTicket, elsewhere bool) (*cacheTicket, bool) {
	rc := g.rc
	ctx := r.Context()
	poll := claimPollMin
	waited := false
	for {
		cl, err := rc.claims.Claim(ctx, time.Now(), []cache.Key{t.key}, rc.origin)
		if err != nil {
			if ctx.Err() != nil {
				t.finish(nil)
				return nil, true // the client went away: nothing was sent
			}
			rc.errors.Add(1)
			g.log.Warn("claiming a request in the result cache; it is sent", "error", err)
			rc.miss(elsewhere)
			return t, false
		}
		for _, b := range cl.Bad {
			rc.damaged.Add(1)
			g.log.Warn("a damaged cache entry is treated as a miss", "cache", rc.c.Path(), "key", b.Key.String(), "reason", b.Reason)
		}
		if e, ok := cl.Hits[t.key]; ok {
			t.finish(nil)
			g.answerCached(w, client, p, e)
			return nil, true
		}
		if len(cl.Claimed) > 0 {
			t.claimed = true
			rc.miss(elsewhere)
			return t, false
		}
		if !waited {
			waited = true
			rc.waitedElsewhere.Add(1)
		}
		wait := min(poll, time.Until(cl.Held[t.key])+time.Millisecond)
		poll = min(2*poll, claimPollMax)
		timer := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			t.finish(nil)
			return nil, true // the client went away: nothing was sent
		}
	}
}

// miss counts a keyed request sent; elsewhere: the cache holds it with
// another origin's answer.
func (rc *resultCache) miss(elsewhere bool) {
	rc.misses.Add(1)
	if elsewhere {
		rc.otherOrigin.Add(1)
	}
}

// withHeaders folds into k the client's headers that the gateway passes
// upstream and that may change the answer: anthropic-beta (in order) and
// an anthropic-version other than the gateway's own. Without them the key
// is the body's alone, as 'run' keys a request line.
func withHeaders(k cache.Key, h http.Header) cache.Key {
	betas := h.Values("anthropic-beta")
	v := h.Get(anthropic.HeaderVersion)
	if len(betas) == 0 && (v == "" || v == upstreamVersion) {
		return k
	}
	hs := sha256.New()
	hs.Write([]byte("apidispatch-gateway-headers-v1\n"))
	hs.Write(k[:])
	if v != "" && v != upstreamVersion {
		hs.Write([]byte("\nanthropic-version: " + v))
	}
	for _, b := range betas {
		hs.Write([]byte("\nanthropic-beta: " + b))
	}
	hs.Sum(k[:0])
	return k
}

// scoped folds client's token into k unless the cache is shared across
// clients (CacheScopeShared): a client then reads only what was stored for
// its own requests, and learns nothing of another's.
func (g *Gateway) scoped(k cache.Key, client string) cache.Key {
	if g.rc.shared {
		return k
	}
	hs := sha256.New()
	hs.Write([]byte("apidispatch-gateway-client-v1\n"))
	hs.Write(k[:])
	for _, t := range g.tokens {
		if t.client == client {
			hs.Write(t.sum[:])
		}
	}
	hs.Sum(k[:0])
	return k
}

// finish stores a success (writing modes) and ends the lead. It is safe on
// a nil ticket.
func (t *cacheTicket) finish(a *won) {
	if t == nil {
		return
	}
	rc := t.g.rc
	stored := false
	if a != nil && rc.mode.Writes() {
		// Stored whatever the client does: a success paid for is kept
		// even when its client went away. Waited for, so that the
		// requests waiting for this one find it.
		e := cache.Entry{
			Key: t.key, Model: t.model, Body: a.body, CostNanos: int64(a.cost),
			InputTok: a.usage.InputTokens, OutputTok: a.usage.OutputTokens,
			CacheRead: a.usage.CacheReadInputTokens, CacheWrite: a.usage.CacheCreationInputTokens,
			Org: a.org, RequestID: a.requestID, CreatedAt: time.Now(), Origin: rc.origin, Simulated: a.simulated,
		}
		var err error
		done := make(chan error, 1)
		select {
		case rc.puts <- putReq{e: e, done: done}:
			err = <-done
		case <-t.g.ctx.Done(): // closing: no writer
			err = rc.put([]cache.Entry{e})
		}
		if err != nil {
			rc.errors.Add(1)
			t.g.log.Warn("storing an answer in the result cache", "error", err)
		}
		stored = err == nil
	}
	if t.claimed && !stored {
		// Not cacheable (an error, a cut stream) or not stored: the
		// processes waiting for this key send it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := rc.claims.Release(ctx, []cache.Key{t.key}, rc.origin)
		cancel()
		if err != nil {
			rc.errors.Add(1)
			t.g.log.Warn("releasing a claim in the result cache (it lapses after its lease)", "error", err)
		}
	}
	if t.done != nil {
		rc.mu.Lock()
		delete(rc.flights, t.key)
		rc.mu.Unlock()
		close(t.done)
	}
}

// answerCached answers the client with e: status 200, the stored body,
// the gateway's headers with x-apidispatch-cached: true, zero cost and
// zero attempts, and a zero-cost line in the client's ledger.
func (g *Gateway) answerCached(w http.ResponseWriter, client string, p msgParams, e cache.Entry) {
	g.rc.hits.Add(1)
	g.rc.saved.Add(e.CostNanos)
	id := newRequestID()
	g.ledger.record(client, Entry{Model: p.Model, RequestID: id, Route: RouteCache})
	h := w.Header()
	h.Set("content-type", "application/json")
	h.Set(anthropic.HeaderRequestID, id)
	g.rl.write(h, anthropic.PoolOf(p.Model))
	h.Set(headerCached, "true")
	h.Set(headerAttempts, "0")
	h.Set(headerCost, "0")
	h.Set("Content-Length", strconv.Itoa(len(e.Body)))
	w.WriteHeader(http.StatusOK)
	w.Write(e.Body)
}

// RouteCache is the ledger route of an answer the result cache gave.
const RouteCache = "cache"
