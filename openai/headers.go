package openai

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Limit is one rate-limit dimension as the x-ratelimit-* headers report
// it. Its fields are those of anthropic.Limit, in the same order, so that
// the provider seam converts one into the other (anthropic.Limit(l)) and
// feeds the same bucket mirrors.
type Limit struct {
	Present   bool      // the -limit and -remaining headers were both parseable
	Limit     int64     // the limit per minute
	Remaining int64     // what is left now
	Reset     time.Time // when the bucket is full again (now + the -reset duration); zero when absent or unparseable
}

// RateLimits are the x-ratelimit-* headers of one answer, per organisation
// (and project) and model. Tokens is one bucket for input and output
// together: the API charges a request's prompt and its maximum completion
// when it admits it, so it mirrors as a bucket charged at admission.
type RateLimits struct {
	Requests Limit
	Tokens   Limit
	// Organization is the openai-organization header ("" when absent).
	Organization string
}

// ParseRateLimits reads the rate-limit headers of an answer received at
// now. Missing or malformed headers leave the Limit with Present false
// (a malformed reset leaves Reset zero); it never fails. Negative counts
// are clamped to zero.
func ParseRateLimits(h http.Header, now time.Time) RateLimits {
	return RateLimits{
		Requests:     parseLimit(h, now, HeaderRequestsLimit, HeaderRequestsRemaining, HeaderRequestsReset),
		Tokens:       parseLimit(h, now, HeaderTokensLimit, HeaderTokensRemaining, HeaderTokensReset),
		Organization: strings.TrimSpace(h.Get(HeaderAnswerOrganization)),
	}
}

func parseLimit(h http.Header, now time.Time, lk, rk, tk string) Limit {
	l, ok1 := parseCount(h.Get(lk))
	r, ok2 := parseCount(h.Get(rk))
	if !ok1 || !ok2 {
		return Limit{}
	}
	out := Limit{Present: true, Limit: l, Remaining: r}
	if d, err := ParseResetDuration(h.Get(tk)); err == nil {
		out.Reset = now.Add(d)
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

// ErrBadDuration is wrapped by ParseResetDuration's errors.
var ErrBadDuration = errors.New("openai: malformed reset duration")

// maxReset bounds a reset duration: a day is far beyond any per-minute
// bucket (a per-day limit resets within 24 h).
const maxReset = 24 * time.Hour

// ParseResetDuration reads an x-ratelimit-reset-* value: a sequence of
// decimal numbers with units h, m, s or ms ("6m0s", "1s", "20ms", "1.5s",
// "1h2m3.25s"), as the API writes durations. A bare number is seconds.
// Values above a day are clamped to a day. Anything else, a negative
// value included, is an error wrapping ErrBadDuration.
func ParseResetDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("%w: empty", ErrBadDuration)
	}
	if len(s) > 64 {
		return 0, fmt.Errorf("%w: %d bytes", ErrBadDuration, len(s))
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return 0, fmt.Errorf("%w: %q", ErrBadDuration, s)
		}
		return min(time.Duration(math.Min(f, maxReset.Seconds())*float64(time.Second)), maxReset), nil
	}
	var total float64 // nanoseconds
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("%w: %q", ErrBadDuration, s)
		}
		v, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %q", ErrBadDuration, s)
		}
		rest = rest[i:]
		j := 0
		for j < len(rest) && rest[j] >= 'a' && rest[j] <= 'z' {
			j++
		}
		var unit float64
		switch rest[:j] {
		case "h":
			unit = float64(time.Hour)
		case "m":
			unit = float64(time.Minute)
		case "s":
			unit = float64(time.Second)
		case "ms":
			unit = float64(time.Millisecond)
		case "us", "µs":
			unit = float64(time.Microsecond)
		case "ns":
			unit = 1
		default:
			return 0, fmt.Errorf("%w: unit %q in %q", ErrBadDuration, rest[:j], s)
		}
		rest = rest[j:]
		total += v * unit
	}
	if total > float64(maxReset) {
		return maxReset, nil
	}
	return time.Duration(total), nil
}

// FormatResetDuration writes d as the API writes reset durations: whole
// milliseconds below a second ("20ms"), else hours, minutes and seconds
// with up to three decimals ("1s", "1.5s", "6m0s"). ParseResetDuration
// reads it back to the millisecond.
func FormatResetDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	d = (d + time.Millisecond - 1).Truncate(time.Millisecond) // round up: never promise a reset early
	if d < time.Second {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	return d.String()
}

// ParseRetryAfter returns the delay the server asked for: retry-after-ms
// (milliseconds, may be fractional) wins, then retry-after as seconds or
// an HTTP date relative to now. Negative values become zero and a day is
// the most. ok is false when neither header is present and valid.
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := strings.TrimSpace(h.Get(HeaderRetryAfterMs)); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return clampDelay(f * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get(HeaderRetryAfter))
	if v == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		return clampDelay(f * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampDelay(float64(t.Sub(now))), true
	}
	return 0, false
}

func clampDelay(f float64) time.Duration {
	if f <= 0 {
		return 0
	}
	if f > float64(maxReset) {
		return maxReset
	}
	return time.Duration(f)
}
