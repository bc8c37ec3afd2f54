package ab

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestSDKShouldRetry(t *testing.T) {
	t.Parallel()
	p := LegacyRetry(1)
	conn := errors.New("connection reset by peer")
	cases := []struct {
		name   string
		status int
		h      http.Header
		err    error
		want   bool
	}{
		{"transport error", 0, nil, conn, true},
		{"408", 408, hdr(), nil, true},
		{"409", 409, hdr(), nil, true},
		{"429", 429, hdr(), nil, true},
		{"500", 500, hdr(), nil, true},
		{"503", 503, hdr(), nil, true},
		{"529", 529, hdr(), nil, true},
		{"400", 400, hdr(), nil, false},
		{"401", 401, hdr(), nil, false},
		{"403", 403, hdr(), nil, false},
		{"404", 404, hdr(), nil, false},
		{"413", 413, hdr(), nil, false},
		{"x-should-retry true on 400", 400, hdr("x-should-retry", "true"), nil, true},
		{"x-should-retry false on 429", 429, hdr("x-should-retry", "false"), nil, false},
		{"x-should-retry false cannot stop a transport retry", 0, hdr("x-should-retry", "false"), conn, true},
	}
	for _, c := range cases {
		if got := p.ShouldRetry(c.status, c.h, c.err); got != c.want {
			t.Errorf("%s: ShouldRetry = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSDKDelaySchedule pins the legacy retry schedule: the server's wait
// when 0 < v ≤ 60 s (retry-after-ms first), else min(0.5·2^k, 8) s with up
// to 25% jitter.
func TestSDKDelaySchedule(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 27, 12, 0, 0, 0, time.UTC)
	p := LegacyRetry(1)
	ms := time.Millisecond
	cases := []struct {
		name    string
		h       http.Header
		retries int
		u       float64
		want    time.Duration
	}{
		{"backoff k=0, no jitter", hdr(), 0, 0, 500 * ms},
		{"backoff k=1", hdr(), 1, 0, 1000 * ms},
		{"backoff k=2", hdr(), 2, 0, 2000 * ms},
		{"backoff k=3", hdr(), 3, 0, 4000 * ms},
		{"backoff k=4", hdr(), 4, 0, 8000 * ms},
		{"backoff capped at 8 s", hdr(), 9, 0, 8000 * ms},
		{"full jitter takes 25% off", hdr(), 2, 1, 1500 * ms},
		{"half jitter", hdr(), 0, 0.5, 437500 * time.Microsecond},
		{"retry-after seconds honoured", hdr("retry-after", "7"), 0, 0.9, 7 * time.Second},
		{"retry-after fractional", hdr("retry-after", "1.5"), 3, 0, 1500 * ms},
		{"retry-after-ms wins over retry-after", hdr("retry-after", "9", "retry-after-ms", "250"), 0, 0, 250 * ms},
		{"retry-after of exactly 60 s honoured", hdr("retry-after", "60"), 0, 0, 60 * time.Second},
		{"retry-after over 60 s falls back to backoff", hdr("retry-after", "61"), 1, 0, 1000 * ms},
		{"retry-after of 120 s falls back to backoff", hdr("retry-after", "120"), 4, 0, 8000 * ms},
		{"retry-after-ms over 60 s falls back", hdr("retry-after-ms", "60001"), 0, 0, 500 * ms},
		{"retry-after 0 falls back", hdr("retry-after", "0"), 2, 0, 2000 * ms},
		{"negative retry-after falls back", hdr("retry-after", "-3"), 0, 0, 500 * ms},
		{"garbage retry-after falls back", hdr("retry-after", "soon"), 0, 0, 500 * ms},
		{"HTTP-date retry-after", hdr("retry-after", now.Add(20*time.Second).Format(http.TimeFormat)), 0, 0, 20 * time.Second},
		{"HTTP-date over 60 s falls back", hdr("retry-after", now.Add(2*time.Minute).Format(http.TimeFormat)), 0, 0, 500 * ms},
	}
	for _, c := range cases {
		if got := p.Delay(c.h, c.retries, c.u, now); got != c.want {
			t.Errorf("%s: Delay = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSDKDelayUnderSpeed: under a simulator at K the server's wait is
// already real time and is judged in API time; the SDK's own back-off is
// divided by K.
func TestSDKDelayUnderSpeed(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := LegacyRetry(20)
	if got := p.Delay(hdr(), 3, 0, now); got != 200*time.Millisecond {
		t.Errorf("backoff at K=20: %v, want 4 s / 20 = 200ms", got)
	}
	// 2.5 s real at K=20 is 50 API-seconds: honoured.
	if got := p.Delay(hdr("retry-after-ms", "2500"), 0, 0, now); got != 2500*time.Millisecond {
		t.Errorf("retry-after-ms 2500 at K=20: %v", got)
	}
	// 3.5 s real at K=20 is 70 API-seconds, over the SDK's 60: back-off.
	if got := p.Delay(hdr("retry-after-ms", "3500"), 0, 0, now); got != 25*time.Millisecond {
		t.Errorf("retry-after-ms 3500 at K=20: %v, want 500ms / 20", got)
	}
}

func TestSDKDelayJitterBounds(t *testing.T) {
	t.Parallel()
	p := LegacyRetry(1)
	for k := range 8 {
		hi := p.Delay(nil, k, 0, time.Time{})
		lo := p.Delay(nil, k, 0.999999, time.Time{})
		if lo > hi || float64(lo) < 0.75*float64(hi)-1 {
			t.Errorf("retry %d: jitter range [%v, %v] is not (0.75, 1] of the back-off", k, lo, hi)
		}
	}
}
