package batch

import (
	"testing"
	"time"
)

// TestPacerSpacesCallsAndLearnsFrom429: calls go one interval apart at
// 90 % of the budget; a 429 holds every call until its retry-after and
// lengthens the interval; answers without one bring it back towards the
// budget's, never below.
func TestPacerSpacesCallsAndLearnsFrom429(t *testing.T) {
	p := newPacer(50, 1) // 45 calls a minute: 1.333 s apart
	t0 := time.Unix(1_000_000, 0)
	want := p.base // 60 s / 45
	if d := want - time.Minute/45; d < -time.Microsecond || d > time.Microsecond {
		t.Fatalf("interval %v; want 60 s / 45", want)
	}
	if at := p.reserve(t0); !at.Equal(t0) {
		t.Fatalf("first call at %v; want at once", at.Sub(t0))
	}
	if at := p.reserve(t0); at.Sub(t0) != want {
		t.Fatalf("second call %v later; want %v", at.Sub(t0), want)
	}
	// Over any minute, no more than the budget go.
	n := 0
	for at := p.reserve(t0); at.Before(t0.Add(time.Minute)); at = p.reserve(t0) {
		n++
	}
	if n+2 > 50 {
		t.Fatalf("%d calls in a minute; the budget is 50", n+2)
	}
	q := newPacer(50, 1)
	q.onLimited(t0, 10*time.Second)
	if at := q.reserve(t0); at.Before(t0.Add(10 * time.Second)) {
		t.Fatalf("a call %v after a 429 with retry-after 10 s", at.Sub(t0))
	}
	if q.interval <= q.base {
		t.Fatalf("interval %v after a 429; want longer than %v", q.interval, q.base)
	}
	for range 1000 {
		q.onAnswered()
	}
	if q.interval < q.base || q.interval > q.base+q.base/100 {
		t.Fatalf("interval %v after 1000 answers; want back to %v", q.interval, q.base)
	}
	// At speed K the interval is in wall time: K times shorter.
	if k := newPacer(50, 100); k.base-want/100 > time.Microsecond || want/100-k.base > time.Microsecond {
		t.Fatalf("interval at K=100: %v; want %v", k.base, want/100)
	}
	var zero *pacer
	if at := zero.reserve(t0); !at.Equal(t0) {
		t.Fatal("a nil pacer paces")
	}
}
