package anthropic

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Limit is one rate-limit dimension as the response headers report it.
type Limit struct {
	Present   bool      // the -limit and -remaining headers were both parseable
	Limit     int64     // the limit per minute
	Remaining int64     // what is left now (token values are rounded to the nearest thousand by the API)
	Reset     time.Time // when the bucket will be full again; zero when absent or unparseable
}

// RateLimits are the anthropic-ratelimit-* headers of one response.
type RateLimits struct {
	Requests Limit
	Tokens   Limit // the most restrictive token limit (input+output unless a workspace limit applies)
	Input    Limit
	Output   Limit
	// OrganizationID is the anthropic-organization-id header ("" when absent).
	OrganizationID string
}

// ParseRateLimits reads the rate-limit headers of a response. Missing or
// malformed headers leave the corresponding Limit with Present false; it never
// fails. Negative values are clamped to zero.
func ParseRateLimits(h http.Header) RateLimits {
	return RateLimits{
		Requests:       parseLimit(h, HeaderRequestsLimit, HeaderRequestsRemaining, HeaderRequestsReset),
		Tokens:         parseLimit(h, HeaderTokensLimit, HeaderTokensRemaining, HeaderTokensReset),
		Input:          parseLimit(h, HeaderInputLimit, HeaderInputRemaining, HeaderInputReset),
		Output:         parseLimit(h, HeaderOutputLimit, HeaderOutputRemaining, HeaderOutputReset),
		OrganizationID: strings.TrimSpace(h.Get(HeaderOrganizationID)),
	}
}

func parseLimit(h http.Header, lk, rk, tk string) Limit {
	l, ok1 := parseCount(h.Get(lk))
	r, ok2 := parseCount(h.Get(rk))
	if !ok1 || !ok2 {
		return Limit{}
	}
	out := Limit{Present: true, Limit: l, Remaining: r}
	if t, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get(tk))); err == nil {
		out.Reset = t
	}
	return out
}

func parseCount(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || f > math.MaxInt64/2 || f < -math.MaxInt64/2 {
			return 0, false
		}
		v = int64(f)
	}
	return max(v, 0), true
}

// ParseRetryAfter returns the delay the server asked for: retry-after-ms
// (milliseconds, may be fractional) wins, then retry-after as seconds
// (integer or fractional) or as an HTTP date relative to now. Any length is
// honoured; negative values become zero. ok is false when neither header is
// present and valid.
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := strings.TrimSpace(h.Get(HeaderRetryAfterMs)); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return clampDuration(f * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get(HeaderRetryAfter))
	if v == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		return clampDuration(f * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampDuration(float64(t.Sub(now))), true
	}
	return 0, false
}

// maxDelay bounds a server-requested delay so arithmetic cannot overflow;
// a day is far beyond any real retry-after.
const maxDelay = 24 * time.Hour

func clampDuration(f float64) time.Duration {
	if f <= 0 {
		return 0
	}
	if f > float64(maxDelay) {
		return maxDelay
	}
	return time.Duration(f)
}
