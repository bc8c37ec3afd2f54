package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/openai"
)

// oaRateHeaders are OpenAI's (limit, remaining, reset) headers of
// requests and tokens, canonical.
var oaRateHeaders = [2][3]string{
	{http.CanonicalHeaderKey(openai.HeaderRequestsLimit), http.CanonicalHeaderKey(openai.HeaderRequestsRemaining), http.CanonicalHeaderKey(openai.HeaderRequestsReset)},
	{http.CanonicalHeaderKey(openai.HeaderTokensLimit), http.CanonicalHeaderKey(openai.HeaderTokensRemaining), http.CanonicalHeaderKey(openai.HeaderTokensReset)},
}

// writeOpenAI replaces the rate-limit headers of h (one org's, as the
// answer came) by pool's aggregate over the OpenAI orgs in rotation, in
// OpenAI's form: x-ratelimit-{limit,remaining,reset}-{requests,tokens},
// the reset a duration from now ("6m0s"). A client that paces by them
// paces to the whole gateway, not to the one org that answered.
func (a *rateAgg) writeOpenAI(h http.Header, pool anthropic.Pool, now time.Time) {
	dropHeaders(h, oaRateHeaders[:])
	dropHeaders(h, rateHeaders[:])
	ag := a.current(pool)
	if ag == nil {
		return
	}
	for i, s := range ag.sums[:2] { // requests, tokens
		if !s.Present {
			continue
		}
		h[oaRateHeaders[i][0]] = []string{strconv.FormatInt(s.Limit, 10)}
		h[oaRateHeaders[i][1]] = []string{strconv.FormatInt(s.Remaining, 10)}
		if !s.Reset.IsZero() {
			h[oaRateHeaders[i][2]] = []string{openai.FormatResetDuration(s.Reset.Sub(now))}
		}
	}
}

// writeLimits writes pool's aggregate rate-limit headers in the form of
// x's API.
func (x *exchange) writeLimits(h http.Header, pool anthropic.Pool) {
	if x.chat != nil {
		x.g.rl.writeOpenAI(h, pool, time.Now())
		return
	}
	x.g.rl.write(h, pool)
}
