package sim

import "time"

// Prompt caching as the API documents it: a cache belongs to one
// organisation and one model; a prefix is written by a request that is
// processed (never by one refused before admission) and becomes readable
// only once that request's response has begun; it lives 5 minutes (1 hour
// with "ttl":"1h") after it is written, and each read refreshes it.

// promptCacheID names one cached prefix of an org: the model (its display
// name, so a dated id and its alias share one cache) and the prefix's hash.
type promptCacheID struct {
	model  string
	prefix [16]byte
}

// promptCacheEntry is one cached prefix, in API time since the start.
type promptCacheEntry struct {
	ready   time.Duration // readable from here (the writer's first token)
	expires time.Duration
}

// promptCacheSweepEvery: every so many writes an org's expired entries
// are dropped, so the map holds what is live, not every prefix ever seen.
const promptCacheSweepEvery = 256

// promptCacheReadable reports whether id can be read at api. o.mu is held.
func (o *orgState) promptCacheReadable(id promptCacheID, api time.Duration) bool {
	e, ok := o.cache[id]
	return ok && e.ready <= api && api < e.expires
}

// promptCacheUse records an admitted request's use of id at api: a read
// refreshes the entry; a write makes it readable from api+first (the
// response's first token) for ttl. o.mu is held.
func (o *orgState) promptCacheUse(id promptCacheID, api, first, ttl time.Duration, read bool) {
	e, ok := o.cache[id]
	switch {
	case read:
		e.expires = max(e.expires, api+ttl)
	case ok && api < e.expires:
		// Written again while another write is still before its first
		// token: readable from whichever begins first.
		e.ready = min(e.ready, api+first)
		e.expires = max(e.expires, api+first+ttl)
	default:
		e = promptCacheEntry{ready: api + first, expires: api + first + ttl}
		o.cacheWrites++
		if o.cacheWrites%promptCacheSweepEvery == 0 {
			for k, v := range o.cache {
				if v.expires <= api {
					delete(o.cache, k)
				}
			}
		}
	}
	o.cache[id] = e
}

// firstTokenShare is the part of a request's latency lat (API time)
// before its first token: the TTFT share of the median latency of out
// output tokens.
func (s *Server) firstTokenShare(lat time.Duration, outTokens int64) time.Duration {
	l := s.lat.cfg
	if l.Zero || l.TTFT <= 0 {
		return lat
	}
	return time.Duration(float64(lat) * float64(l.TTFT) / float64(l.TTFT+time.Duration(outTokens)*l.PerToken))
}
