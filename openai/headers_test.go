package openai

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestParseResetDuration(t *testing.T) {
	t.Parallel()
	good := map[string]time.Duration{
		"6m0s": 6 * time.Minute, "1s": time.Second, "20ms": 20 * time.Millisecond, "1.5s": 1500 * time.Millisecond,
		"8.64s": 8640 * time.Millisecond, "1h2m3.25s": time.Hour + 2*time.Minute + 3250*time.Millisecond,
		"0s": 0, "17ms": 17 * time.Millisecond, " 2s ": 2 * time.Second, "3": 3 * time.Second, "0.5": 500 * time.Millisecond,
		"48h": 24 * time.Hour, "1m30.5s": 90500 * time.Millisecond,
	}
	for in, want := range good {
		got, err := ParseResetDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseResetDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "s", "-1s", "1x", "1.2.3s", "ms", "1 s", "-3", "NaN", "1e400"} {
		if d, err := ParseResetDuration(in); !errors.Is(err, ErrBadDuration) {
			t.Errorf("ParseResetDuration(%q) = %v, %v; want ErrBadDuration", in, d, err)
		}
	}
}

func TestFormatResetDurationRoundTrips(t *testing.T) {
	t.Parallel()
	cases := map[time.Duration]string{0: "0s", 20 * time.Millisecond: "20ms", 1500 * time.Microsecond: "2ms",
		time.Second: "1s", 1500 * time.Millisecond: "1.5s", 6 * time.Minute: "6m0s", 61*time.Second + 250*time.Millisecond: "1m1.25s"}
	for d, want := range cases {
		s := FormatResetDuration(d)
		if s != want {
			t.Errorf("FormatResetDuration(%v) = %q, want %q", d, s, want)
		}
		back, err := ParseResetDuration(s)
		if err != nil || back < d || back-d >= time.Millisecond {
			t.Errorf("%q read back as %v, %v; want %v to the millisecond, never early", s, back, err, d)
		}
	}
}

func TestParseRateLimits(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("x-ratelimit-limit-requests", "5000")
	h.Set("x-ratelimit-remaining-requests", "4999")
	h.Set("x-ratelimit-reset-requests", "12ms")
	h.Set("x-ratelimit-limit-tokens", "160000")
	h.Set("x-ratelimit-remaining-tokens", "159976")
	h.Set("x-ratelimit-reset-tokens", "6m0s")
	h.Set("openai-organization", "org-abc")
	rl := ParseRateLimits(h, t0)
	want := RateLimits{
		Requests:     Limit{true, 5000, 4999, t0.Add(12 * time.Millisecond)},
		Tokens:       Limit{true, 160000, 159976, t0.Add(6 * time.Minute)},
		Organization: "org-abc",
	}
	if rl != want {
		t.Fatalf("got %+v\nwant %+v", rl, want)
	}
	h.Set("x-ratelimit-remaining-tokens", "-5")
	h.Set("x-ratelimit-reset-tokens", "soon")
	h.Del("x-ratelimit-limit-requests")
	rl = ParseRateLimits(h, t0)
	if rl.Requests.Present || !rl.Tokens.Present || rl.Tokens.Remaining != 0 || !rl.Tokens.Reset.IsZero() {
		t.Fatalf("partial headers: %+v", rl)
	}
}

func FuzzParseResetDuration(f *testing.F) {
	for _, s := range []string{"6m0s", "1s", "20ms", "1.5s", "", "-1s", "1h2m3.25s", "99999999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseResetDuration(s)
		if err != nil {
			if !errors.Is(err, ErrBadDuration) {
				t.Fatalf("%q: error %v does not wrap ErrBadDuration", s, err)
			}
			return
		}
		if d < 0 || d > maxReset {
			t.Fatalf("%q: %v out of [0, 24h]", s, d)
		}
	})
}
