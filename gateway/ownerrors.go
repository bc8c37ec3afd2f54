package gateway

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// The gateway's own answers where the API would answer 429: they carry
// what the API's 429 carries (and what the official SDKs read): the
// aggregate anthropic-ratelimit-* headers of the request's pool over the
// orgs in rotation, retry-after in whole seconds, and x-should-retry: true.

// rateLimited answers x with the gateway's own 429: no lane admitted the
// request within --retry-for.
func (x *exchange) rateLimited() {
	g := x.g
	h := x.w.Header()
	pool := x.prov.PoolOf(x.p.Model)
	x.writeLimits(h, pool)
	h.Set(anthropic.HeaderRetryAfter, strconv.Itoa(retryAfterSeconds(g.lanes.admitIn(pool, time.Now()))))
	h.Set(anthropic.HeaderShouldRetry, "true")
	h.Set(headerAttempts, strconv.Itoa(x.attempts))
	x.fail(http.StatusTooManyRequests, anthropic.ErrRateLimit, fmt.Sprintf("apidispatch gateway: no lane admitted the request within --retry-for %s", g.cfg.RetryFor))
}

// retryAfterSeconds is d as a retry-after value: whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// admitIn is how long until a lane of pool may admit again, as far as the
// pool's queue knows (its timer for the earliest blocked lane), or 0.
func (s *laneSet) admitIn(pool anthropic.Pool, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.pools[pool]; q != nil && q.timer != nil && q.timerAt.After(now) {
		return q.timerAt.Sub(now)
	}
	return 0
}
