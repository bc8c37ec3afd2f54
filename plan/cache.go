package plan

import (
	"context"
	"maps"
	"os"
	"runtime"
	"sync"

	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// CacheOrigin is the cache's origin of a run against baseURL (""
// meaning apihttp.DefaultBaseURL): what 'plan' and the projection look
// answers up by, as the engine does.
func CacheOrigin(baseURL string) (string, error) {
	u, err := apihttp.ResolveBaseURL(baseURL)
	if err != nil {
		return "", err
	}
	return cache.OriginOf(u), nil
}

// CacheHits is what the cache would answer of an input before it is sent.
type CacheHits struct {
	// Misses is the workload still to send: the input less its hits and
	// less all but one of each set of duplicates.
	Misses *workload.Summary
	// Hits are the items answered without a request of their own, and
	// Saved what the cached ones cost when they were sent (a duplicate
	// saves about as much again, not counted: its request has no price yet).
	Hits, InputDuplicates int64
	Saved                 cost.Nanos
}

// ProjectCache reads the input and looks every item up in c as a run with
// the same settings would, for 'plan' and the run's projection: only the
// misses are projected. It reads the cache, never writes it. Batches of
// items are keyed and looked up on every core (it runs before anything is
// sent); the counts do not depend on the order they finish in.
//
// origin is the API the run would ask (cache.OriginOf its base URL): only
// that origin's answers count as hits, as in the run.
func ProjectCache(ctx context.Context, path string, ws *workload.Summary, c *cache.Cache, mode cache.Mode, sampled bool, origin string) (*CacheHits, error) {
	// Every figure of the input (its OpenAI items too: a caller tells a
	// file of OpenAI items only from an empty one by them), less the
	// Anthropic hits below.
	misses := *ws
	misses.Models, misses.OpenAIModels = maps.Clone(ws.Models), maps.Clone(ws.OpenAIModels)
	out := &CacheHits{Misses: &misses}
	if c == nil || mode == cache.ModeOff {
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type keyed struct {
		it    store.Item
		key   cache.Key
		hit   bool
		costN int64
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []store.Item, runtime.GOMAXPROCS(0))
	done := make(chan []keyed, runtime.GOMAXPROCS(0))
	var errMu sync.Mutex
	var firstErr error
	setErr := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	var workers sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		workers.Go(func() {
			for b := range batches {
				var ks []keyed
				var keys []cache.Key
				for _, it := range b {
					body, err := workload.ReadAt(f, it)
					if err != nil {
						setErr(err)
						return
					}
					k, isSampled, err := cache.Inspect(body)
					if err != nil || isSampled && !sampled {
						continue
					}
					ks, keys = append(ks, keyed{it: it, key: k}), append(keys, k)
				}
				if mode.Reads() && len(keys) > 0 {
					costs, err := c.Costs(ctx, keys, origin)
					if err != nil {
						setErr(err)
						return
					}
					for i := range ks {
						ks[i].costN, ks[i].hit = costs[ks[i].key]
					}
				}
				select {
				case done <- ks:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		workers.Wait()
		close(done)
	}()
	var scanErr error
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		defer close(batches)
		batch := make([]store.Item, 0, 1024)
		scanErr = workload.Scan(path, func(it store.Item) error {
			if it.Provider != "" {
				return nil // the projection is of the Anthropic items (Models)
			}
			batch = append(batch, it)
			if len(batch) < cap(batch) {
				return nil
			}
			select {
			case batches <- batch:
			case <-ctx.Done():
				return ctx.Err()
			}
			batch = make([]store.Item, 0, 1024)
			return nil
		})
		if scanErr == nil && len(batch) > 0 {
			select {
			case batches <- batch:
			case <-ctx.Done():
			}
		}
	}()
	drop := func(it store.Item) {
		models := out.Misses.Models
		if it.Provider == org.OpenAI {
			models = out.Misses.OpenAIModels
			out.Misses.OpenAI--
		}
		ms := models[it.Model]
		ms.N--
		ms.MaxTokens -= it.MaxTokens
		ms.EstInput -= it.EstInput
		models[it.Model] = ms
		out.Misses.N--
	}
	seen := map[cache.Key]bool{}
	for ks := range done {
		for _, k := range ks {
			switch {
			case k.hit:
				out.Hits++
				out.Saved += cost.Nanos(k.costN)
				drop(k.it)
			case seen[k.key]:
				out.Hits++
				out.InputDuplicates++
				drop(k.it)
			default:
				seen[k.key] = true
			}
		}
	}
	// done is closed once every worker returned; the scanner returns
	// once batches are drained or ctx ends (an error cancels it).
	cancel()
	<-scanDone
	switch {
	case firstErr != nil:
		return nil, firstErr
	case parent.Err() != nil:
		return nil, parent.Err()
	case scanErr != nil:
		return nil, scanErr
	}
	return out, nil
}
