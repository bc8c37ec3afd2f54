package gateway

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// rateAgg keeps the last rate-limit headers each org sent for each pool,
// and writes their aggregate: limits and remaining summed over the orgs in
// rotation, the latest reset. A client that paces by the headers then
// paces to the whole gateway, never to one key. Safe for concurrent use:
// note computes the aggregate once, and write, on every answer, only
// reads it (no lock).
type rateAgg struct {
	mu   sync.Mutex
	last map[anthropic.Pool]map[*upstream]anthropic.RateLimits
	agg  sync.Map // anthropic.Pool → *aggHeaders
}

// aggHeaders is one pool's aggregate, ready to write.
type aggHeaders struct {
	vals [4][3][]string     // by rateHeaders; nil: absent
	sums [4]anthropic.Limit // requests, tokens, input, output
	ups  []*upstream        // the orgs summed (in rotation when computed)
}

func newRateAgg() *rateAgg {
	return &rateAgg{last: map[anthropic.Pool]map[*upstream]anthropic.RateLimits{}}
}

// note records the headers of one upstream answer.
func (a *rateAgg) note(pool anthropic.Pool, u *upstream, rl anthropic.RateLimits) {
	if !rl.Requests.Present && !rl.Input.Present && !rl.Output.Present && !rl.Tokens.Present {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.last[pool]
	if m == nil {
		m = map[*upstream]anthropic.RateLimits{}
		a.last[pool] = m
	}
	m[u] = rl
	a.computeLocked(pool)
}

// computeLocked sums pool's headers over the orgs in rotation. a.mu is held.
func (a *rateAgg) computeLocked(pool anthropic.Pool) *aggHeaders {
	ag := &aggHeaders{}
	var sums [4]anthropic.Limit
	for u, rl := range a.last[pool] {
		if u.Disabled() != "" {
			continue
		}
		ag.ups = append(ag.ups, u)
		for i, l := range [4]anthropic.Limit{rl.Requests, rl.Tokens, rl.Input, rl.Output} {
			if !l.Present {
				continue
			}
			sums[i].Present = true
			sums[i].Limit += l.Limit
			sums[i].Remaining += l.Remaining
			if l.Reset.After(sums[i].Reset) {
				sums[i].Reset = l.Reset
			}
		}
	}
	for i, s := range sums {
		if !s.Present {
			continue
		}
		ag.vals[i][0] = []string{strconv.FormatInt(s.Limit, 10)}
		ag.vals[i][1] = []string{strconv.FormatInt(s.Remaining, 10)}
		if !s.Reset.IsZero() {
			ag.vals[i][2] = []string{s.Reset.UTC().Format(time.RFC3339)}
		}
	}
	ag.sums = sums
	a.agg.Store(pool, ag)
	return ag
}

// write replaces the anthropic-ratelimit-* headers of h by the aggregate
// of pool.
func (a *rateAgg) write(h http.Header, pool anthropic.Pool) {
	dropHeaders(h, rateHeaders[:])
	ag := a.current(pool)
	if ag == nil {
		return
	}
	for i := range ag.vals {
		for j, vs := range ag.vals[i] {
			if vs != nil {
				// The slices are shared by every answer and never changed.
				h[rateHeaders[i][j]] = vs
			}
		}
	}
}

// current is pool's aggregate over the orgs in rotation now (nil: none).
func (a *rateAgg) current(pool anthropic.Pool) *aggHeaders {
	v, ok := a.agg.Load(pool)
	if !ok {
		return nil
	}
	ag := v.(*aggHeaders)
	for _, u := range ag.ups {
		if u.Disabled() != "" {
			// An org left rotation since: sum again without it.
			a.mu.Lock()
			ag = a.computeLocked(pool)
			a.mu.Unlock()
			break
		}
	}
	return ag
}

// rateHeaders are the canonical names of (limit, remaining, reset) for
// requests, tokens, input and output.
var rateHeaders = [4][3]string{
	{http.CanonicalHeaderKey(anthropic.HeaderRequestsLimit), http.CanonicalHeaderKey(anthropic.HeaderRequestsRemaining), http.CanonicalHeaderKey(anthropic.HeaderRequestsReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderTokensLimit), http.CanonicalHeaderKey(anthropic.HeaderTokensRemaining), http.CanonicalHeaderKey(anthropic.HeaderTokensReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderInputLimit), http.CanonicalHeaderKey(anthropic.HeaderInputRemaining), http.CanonicalHeaderKey(anthropic.HeaderInputReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderOutputLimit), http.CanonicalHeaderKey(anthropic.HeaderOutputRemaining), http.CanonicalHeaderKey(anthropic.HeaderOutputReset)},
}

// dropHeaders deletes every header named in names from h.
func dropHeaders(h http.Header, names [][3]string) {
	for _, k := range names {
		for _, n := range k {
			delete(h, n)
		}
	}
}
