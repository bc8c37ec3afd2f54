package gate

import (
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

func TestRetryWait(t *testing.T) {
	for n, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		if got := Backoff(n+1, 1, 0); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", n+1, got, want)
		}
	}
	if got := Backoff(1, 10, 1); got != 37500*time.Microsecond {
		t.Errorf("Backoff(1, speed 10, full jitter) = %v, want 37.5ms", got)
	}
	ra := func(d time.Duration) anthropic.Outcome { return anthropic.Outcome{HasRetryAfter: true, RetryAfter: d} }
	if got := RetryWait(ra(100*time.Millisecond), 1, 1, 0); got != 500*time.Millisecond {
		t.Errorf("a 500's retry-after shorter than the back-off: waited %v, want the back-off", got)
	}
	if got := RetryWait(ra(3*time.Second), 1, 1, 0); got != 3*time.Second {
		t.Errorf("a 500's retry-after longer than the back-off: waited %v, want it", got)
	}
	busy := ra(100 * time.Millisecond)
	busy.Overloaded = true
	if got := RetryWait(busy, 1, 1, 0); got != 100*time.Millisecond {
		t.Errorf("a 529's retry-after shorter than the back-off: waited %v, want it, as its lane holds", got)
	}
}
