package dispatch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/promptcache"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// The cache seam. The feeder keys every pending item it streams (when the
// run has a cache) and answers the hits itself: their result lines go
// straight to the committer, and only the misses reach the scheduler. The
// scheduler sends one item per key at a time (the leader); the items of the
// same key behind it (duplicates inside the input) wait and are answered by
// its success. A success is stored in the cache in the same group commit as
// its result, just before it: a crash in between leaves an entry whose
// result the resume answers from the cache, never a result without its
// entry being attempted, and never a wrong one.

// elsewhere counts, per engine, the items whose request the cache holds
// only with another origin's answer: they are misses, and the run says so
// once, with the count.
type elsewhere struct {
	mu sync.Mutex
	n  int64
	by map[string]int64 // by cache.Describe of the origin
}

func (w *elsewhere) add(es []cache.Elsewhere) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[string]int64{}
	}
	for _, e := range es {
		w.n++
		w.by[cache.Describe(e.Origin, e.Simulated)]++
	}
}

// total is the count and what it is made of, most first.
func (w *elsewhere) total() (int64, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := slices.Collect(maps.Keys(w.by))
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(w.by[b], w.by[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d from %s", w.by[n], n)
	}
	return w.n, strings.Join(parts, ", ")
}

// origin is the API this engine asks, as the cache records it.
func (e *Engine) origin() string { return cache.OriginOf(e.base) }

// fed is one pending item as the feeder hands it to the scheduler.
type fed struct {
	it    store.Item
	key   cache.Key
	keyed bool // key is set: the item may be answered by or for its duplicates
	// pre is the prompt-cache prefix the item marks, when hasPre
	// (affinity.go).
	pre    promptcache.Prefix
	hasPre bool
	// worst is the most the item can cost, read from its params (cache
	// writes, inference_geo) when the spend gate has a cap; 0 without one.
	worst cost.Nanos
}

// answer is a success that answers items without a request of their own.
type answer struct {
	body      []byte
	org       string
	requestID string
	costN     cost.Nanos
}

// caching reports whether the run keys its items at all.
func (e *Engine) caching() bool { return e.cfg.Cache != nil && e.cfg.CacheMode != cache.ModeOff }

// keyItems keys items and, when the mode reads, answers the cache's hits
// through the committer. It returns the rest: those for the scheduler, and
// (readwrite) those whose key another process on the cache file is
// sending, which wait for its answer (recheck); the keys of the first are
// claimed for this run. It runs on the feeder goroutine.
func (e *Engine) keyItems(ctx context.Context, items []store.Item, com *committer) ([]fed, []fed, error) {
	out := make([]fed, len(items))
	var keys []cache.Key
	capped := e.gate.Capped() || e.cfg.WorstEvery
	for i, it := range items {
		out[i].it = it
		// A line shorter than the shortest prefix worth placing has none:
		// its body is read only for the result cache or a capped run's
		// worst case.
		if !e.caching() && !capped && it.Length < promptcache.MinBytes {
			continue
		}
		body, err := e.cfg.Body(it)
		if capped {
			// A body that cannot be read is bounded at every multiplier
			// here; sending it reports the error.
			if err != nil {
				body = nil
			}
			out[i].worst = e.worstCase(it, body)
		}
		if err != nil {
			if !e.caching() {
				continue // sending it reports the error
			}
			return nil, nil, fmt.Errorf("reading item %s: %w", it.CustomID, err)
		}
		out[i].pre, out[i].hasPre = itemPrefix(it.Model, body)
		if !e.caching() {
			continue
		}
		k, sampled, err := cache.Inspect(body)
		if err != nil || sampled && !e.cfg.CacheSampled {
			continue // not shared; an unkeyable item (validation passed it) is simply sent
		}
		if it.Provider == workload.ProviderOpenAI {
			// An OpenAI request's answer is a chat completion, never a
			// Message: its key is of a domain of its own.
			k = openaiKey(k)
		}
		out[i].key, out[i].keyed = k, true
		keys = append(keys, k)
	}
	if len(keys) == 0 || !e.cfg.CacheMode.Reads() {
		return out, nil, nil
	}
	hits, bad, other, err := e.cfg.Cache.Get(ctx, keys, e.origin())
	if err != nil {
		return nil, nil, err
	}
	// Counted here, said once with the count when the engine ends
	// (cacheSummary).
	e.c.cacheElsewhere.add(other)
	for _, b := range bad {
		e.c.cacheDamaged.Add(1)
		e.log.Warn("a damaged cache entry is treated as a miss", "cache", e.cfg.Cache.Path(), "key", b.Key.String(), "reason", b.Reason)
		e.cfg.Events.Emit(rundir.EventWarning, "cache "+e.cfg.Cache.Path()+": entry "+b.Key.String()+" is damaged ("+b.Reason+"); treated as a miss", nil)
	}
	rest := out[:0]
	for _, f := range out {
		h, ok := hits[f.key]
		if !f.keyed || !ok {
			rest = append(rest, f)
			continue
		}
		com.submitHit(hitOutcome(f.it, answer{body: h.Body, org: h.Org, requestID: h.RequestID, costN: cost.Nanos(h.CostNanos)}), cost.Nanos(h.CostNanos), false)
	}
	if e.claims == nil {
		return rest, nil, nil
	}
	ready, waiting, _, err := e.recheck(ctx, rest, com)
	return ready, waiting, err
}

// recheck claims the keys of fs for this run, in one transaction with
// their look-up: it answers the hits (stored since), and returns the items
// whose key this run holds now (and those not keyed) for the scheduler,
// and those another process holds, with the earliest end of those claims.
func (e *Engine) recheck(ctx context.Context, fs []fed, com *committer) (ready, waiting []fed, until time.Time, err error) {
	var keys []cache.Key
	for _, f := range fs {
		if f.keyed {
			keys = append(keys, f.key)
		}
	}
	if len(keys) == 0 {
		return fs, nil, until, nil
	}
	cl, err := e.claims.Claim(ctx, time.Now(), keys, e.origin())
	if err != nil {
		return nil, nil, until, err
	}
	ready = fs[:0:0]
	for _, f := range fs {
		if !f.keyed {
			ready = append(ready, f)
			continue
		}
		if h, ok := cl.Hits[f.key]; ok {
			com.submitHit(hitOutcome(f.it, answer{body: h.Body, org: h.Org, requestID: h.RequestID, costN: cost.Nanos(h.CostNanos)}), cost.Nanos(h.CostNanos), false)
			continue
		}
		if end, held := cl.Held[f.key]; held {
			waiting = append(waiting, f)
			if until.IsZero() || end.Before(until) {
				until = end
			}
			continue
		}
		ready = append(ready, f)
	}
	return ready, waiting, until, nil
}

// releaseClaim lets the run's claim on k go when no item of the run will
// send it now (its leader failed with no other behind it, or the run is
// stopping), so that a process waiting for it sends it. It runs on the
// scheduler goroutine.
func (e *Engine) releaseClaim(k cache.Key) {
	if e.claims == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.claims.Release(ctx, []cache.Key{k}, e.origin()); err != nil {
		e.log.Warn("releasing a claim in the result cache (the other processes wait for this run to end)", "error", err)
	}
}

// cacheEntry is what a success stores in the cache.
func (e *Engine) cacheEntry(a *attempt, now time.Time) *cache.Entry {
	return &cache.Entry{
		Key: a.w.key, Model: a.w.it.Model, Body: a.body, CostNanos: int64(a.costN),
		InputTok: a.usage.Input, OutputTok: a.usage.Output,
		CacheRead: a.usage.CacheRead, CacheWrite: a.usage.CacheWrite,
		Org: a.lane.org.Name, RequestID: a.reqID, CreatedAt: now,
		Origin: e.origin(), Simulated: a.simulated,
	}
}

// RouteCache is the route of items the result cache answered, in the
// store and the summary's by_route.
const RouteCache = "cache"

// hitOutcome is the result of an item answered without a request: the
// original response, request id and cost, and nothing charged to this run
// (no org served it, no tokens, no attempts, so it is left out of the
// latency percentiles and of every org's figures).
func hitOutcome(it store.Item, a answer) store.Outcome {
	out := store.Outcome{Seq: it.Seq, State: store.Succeeded, Route: RouteCache}
	d := rundir.Dispatch{Org: a.org, Route: store.RouteSync, Cost: a.costN, RequestID: a.requestID, Cached: true}
	if it.Provider == workload.ProviderOpenAI {
		out.Line = rundir.OpenAIResultLine(it.CustomID, http.StatusOK, a.body, "", "", d)
		return out
	}
	out.Line = rundir.ResultLine(it.CustomID, rundir.SucceededResult(a.body), d)
	return out
}

// openaiKey is the result cache's key of an OpenAI request whose body has
// the key k as a Messages request's params would: hashed again in a domain
// of its own, so that no answer of one API answers a request of the other.
func openaiKey(k cache.Key) cache.Key {
	return cache.Key(sha256.Sum256(append([]byte("apidispatch openai chat.completions\x00"), k[:]...)))
}

// enqueue puts a fed item in its pool's queue, or behind the leader of its
// key. It runs on the scheduler goroutine.
func (e *Engine) enqueue(f fed) {
	prov := upstream.Named(f.it.Provider)
	w := &work{it: f.it, prov: prov, pool: prov.PoolOf(f.it.Model), key: f.key, keyed: f.keyed, pre: f.pre, hasPre: f.hasPre, worst: f.worst}
	if ls := e.lanesFor(w.pool, f.it.Model, prov); len(ls) == 0 && e.noOrgs == "" {
		e.noOrgs = fmt.Sprintf("no %s org for item %s (line %d, model %s): its provider's orgs are needed", prov.Name(), f.it.CustomID, f.it.Line, f.it.Model)
	}
	e.held++
	if w.keyed {
		if _, ok := e.leaders[w.key]; ok {
			e.followers[w.key] = append(e.followers[w.key], w)
			return
		}
		e.leaders[w.key] = w
	}
	e.ready[w.pool] = append(e.ready[w.pool], w)
	e.nready++
}

// settleKey runs when a leader ends (success, terminal error, or dropped
// at a stop). A success answers its followers; otherwise the first
// follower becomes the leader and is sent (only successes are shared), or,
// when the run is stopping, they are all dropped (they stay pending).
func (e *Engine) settleKey(a *attempt, success, stopping bool, com *committer) {
	w := a.w
	if !w.keyed {
		return
	}
	delete(e.leaders, w.key)
	fs := e.followers[w.key]
	delete(e.followers, w.key)
	if !success && (len(fs) == 0 || stopping) {
		e.releaseClaim(w.key)
	}
	if len(fs) == 0 {
		return
	}
	switch {
	case success:
		ans := answer{body: a.body, org: a.lane.org.Name, requestID: a.reqID, costN: a.costN}
		for _, f := range fs {
			e.held--
			com.submitHit(hitOutcome(f.it, ans), a.costN, true)
		}
	case stopping:
		e.held -= len(fs)
	default:
		next := fs[0]
		e.leaders[w.key] = next
		if len(fs) > 1 {
			e.followers[w.key] = fs[1:]
		}
		e.ready[next.pool] = append(e.ready[next.pool], next)
		e.nready++
	}
}

// dropFollowers forgets the followers of leaders that are not in flight
// (at a stop, with the queues dropped); they stay pending in the store.
func (e *Engine) dropFollowers() {
	for k, fs := range e.followers {
		if l := e.leaders[k]; l != nil && l.sending {
			continue
		}
		e.held -= len(fs)
		delete(e.followers, k)
		delete(e.leaders, k)
	}
	for k, l := range e.leaders {
		if !l.sending {
			delete(e.leaders, k)
		}
	}
}

func (e *Engine) cacheSummary(agg store.Aggregate) *rundir.CacheSummary {
	if !e.caching() {
		return nil
	}
	hits := agg.Counters[rundir.CounterCacheHits]
	other, from := e.c.cacheElsewhere.total()
	if other > 0 {
		msg := fmt.Sprintf("cache %s: %d items were sent although the cache holds their request, answered by another API than this run's %s (%s): "+
			"an answer is reused only from the origin that gave it, so a simulator's never answers a real run",
			e.cfg.Cache.Path(), other, e.origin(), from)
		e.log.Warn(msg)
		e.cfg.Events.Emit(rundir.EventWarning, msg, map[string]any{"other_origin": other, "origin": e.origin()})
	}
	return &rundir.CacheSummary{
		Mode: string(e.cfg.CacheMode), Hits: hits, InputDuplicates: agg.Counters[rundir.CounterCacheDuplicates],
		Misses: agg.Succeeded + agg.Errored - hits, SavedUSD: cost.Nanos(agg.Counters[rundir.CounterCacheSavedNanos]).USD(),
		Damaged: e.c.cacheDamaged.Load(), WriteFailed: agg.Counters[rundir.CounterCacheWriteFailed], Origin: e.origin(), OtherOrigin: other,
	}
}
