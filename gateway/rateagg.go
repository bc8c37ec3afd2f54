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
// paces to the whole gateway, never to one key. Safe for concurrent use.
type rateAgg struct {
	mu   sync.Mutex
	last map[anthropic.Pool]map[*upstream]anthropic.RateLimits
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
}

// write replaces the anthropic-ratelimit-* headers of h by the aggregate
// of pool.
func (a *rateAgg) write(h http.Header, pool anthropic.Pool) {
	for _, k := range rateHeaders {
		h.Del(k[0])
		h.Del(k[1])
		h.Del(k[2])
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.last[pool]
	if len(m) == 0 {
		return
	}
	var sums [4]anthropic.Limit
	for u, rl := range m {
		if u.Disabled() != "" {
			continue
		}
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
		h[rateHeaders[i][0]] = []string{strconv.FormatInt(s.Limit, 10)}
		h[rateHeaders[i][1]] = []string{strconv.FormatInt(s.Remaining, 10)}
		if !s.Reset.IsZero() {
			h[rateHeaders[i][2]] = []string{s.Reset.UTC().Format(time.RFC3339)}
		}
	}
}

// rateHeaders are the canonical names of (limit, remaining, reset) for
// requests, tokens, input and output.
var rateHeaders = [4][3]string{
	{http.CanonicalHeaderKey(anthropic.HeaderRequestsLimit), http.CanonicalHeaderKey(anthropic.HeaderRequestsRemaining), http.CanonicalHeaderKey(anthropic.HeaderRequestsReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderTokensLimit), http.CanonicalHeaderKey(anthropic.HeaderTokensRemaining), http.CanonicalHeaderKey(anthropic.HeaderTokensReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderInputLimit), http.CanonicalHeaderKey(anthropic.HeaderInputRemaining), http.CanonicalHeaderKey(anthropic.HeaderInputReset)},
	{http.CanonicalHeaderKey(anthropic.HeaderOutputLimit), http.CanonicalHeaderKey(anthropic.HeaderOutputRemaining), http.CanonicalHeaderKey(anthropic.HeaderOutputReset)},
}
