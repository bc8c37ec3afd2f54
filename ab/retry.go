package ab

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// SDKRetry is the retry policy of the official Anthropic SDKs as the legacy
// path used it (docs/design.md §17, §22): the Python client built
// with max_retries=5. It is plain data and its methods are pure, so the
// schedule is tested without sleeping. The zero value is not useful; start
// from LegacyRetry.
type SDKRetry struct {
	// MaxRetries is how many times a request is retried after its first
	// attempt (the legacy client: 5, so at most 6 attempts).
	MaxRetries int
	// Initial and Max shape the back-off: min(Initial·2^k, Max) for the
	// k-th retry (k from 0), times a jitter factor in (0.75, 1].
	Initial, Max time.Duration
	// MaxRetryAfter is the longest server retry-after the SDK honours
	// (60 s); longer or non-positive values fall back to the back-off.
	MaxRetryAfter time.Duration
	// Speed is the server's time compression K (1 for the real API). The
	// server's retry-after is already in real time (the simulator divides
	// it by K); it is judged against MaxRetryAfter in API time (×K). The
	// SDK's own back-off is divided by K.
	Speed float64
}

// LegacyRetry returns the legacy client's policy at speed K (≤ 0 means 1).
func LegacyRetry(speed float64) SDKRetry {
	if speed <= 0 {
		speed = 1
	}
	return SDKRetry{MaxRetries: 5, Initial: 500 * time.Millisecond, Max: 8 * time.Second, MaxRetryAfter: 60 * time.Second, Speed: speed}
}

// ShouldRetry reports whether the SDK retries an attempt that ended with
// status and headers h, or with a transport error (a connection error, a
// reset, a truncated body or a timeout: always retried). Otherwise an
// x-should-retry header of "true" or "false" decides, and without it 408,
// 409, 429 and every status ≥ 500 (529 included) are retried. Whether
// retries remain is the caller's business (see Delay and MaxRetries).
func (p SDKRetry) ShouldRetry(status int, h http.Header, transportErr error) bool {
	if transportErr != nil {
		return true
	}
	switch strings.ToLower(strings.TrimSpace(h.Get(anthropic.HeaderShouldRetry))) {
	case "true":
		return true
	case "false":
		return false
	}
	return status == http.StatusRequestTimeout || status == http.StatusConflict ||
		status == http.StatusTooManyRequests || status >= 500
}

// Delay is how long the SDK sleeps before retry number retriesDone+1
// (retriesDone counts the retries already made, from 0). u is a uniform
// number in [0, 1) for the jitter; now resolves an HTTP-date retry-after.
//
// The server's wait wins when present and 0 < v ≤ MaxRetryAfter (judged
// in API time): retry-after-ms first, then retry-after (seconds or an HTTP
// date). Otherwise the back-off min(Initial·2^retriesDone, Max)·(1 − 0.25u),
// divided by Speed.
func (p SDKRetry) Delay(h http.Header, retriesDone int, u float64, now time.Time) time.Duration {
	speed := p.Speed
	if speed <= 0 {
		speed = 1
	}
	if v, ok := retryAfter(h, now); ok && v > 0 && float64(v)*speed <= float64(p.MaxRetryAfter) {
		return v
	}
	k := float64(min(max(retriesDone, 0), 1000))
	back := math.Min(float64(p.Initial)*math.Pow(2, k), float64(p.Max))
	back *= 1 - 0.25*min(max(u, 0), 1)
	return time.Duration(back / speed)
}

// retryAfter reads the server's wait the way the Python SDK does:
// retry-after-ms (float milliseconds) wins, then retry-after as float
// seconds, then as an HTTP date. Unlike anthropic.ParseRetryAfter it keeps
// zero and negative values (ok with v ≤ 0), which the SDK then ignores.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	if s := strings.TrimSpace(h.Get(anthropic.HeaderRetryAfterMs)); s != "" {
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return clampWait(f * float64(time.Millisecond)), true
		}
	}
	s := strings.TrimSpace(h.Get(anthropic.HeaderRetryAfter))
	if s == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		return clampWait(f * float64(time.Second)), true
	}
	if t, err := http.ParseTime(s); err == nil {
		return clampWait(float64(t.Sub(now))), true
	}
	return 0, false
}

// clampWait converts nanoseconds to a Duration without overflow.
func clampWait(ns float64) time.Duration {
	const limit = float64(24 * time.Hour)
	return time.Duration(math.Max(-limit, math.Min(ns, limit)))
}
