package batch

import (
	"context"
	"sync"
	"time"
)

// DefaultRPM is the batch-endpoint budget assumed for an org whose limit
// is not known: the lowest tier's HTTP RPM for all batch endpoints
// together (docs/design.md §14 "Other pools": legacy Tier 1, 50).
const DefaultRPM = 50

// paceShare is the part of an org's batch RPM the route uses: the rest is
// room for the clock's jitter and for colleagues on the org.
const paceShare = 0.9

// pacer spaces one org's calls to the Message Batches endpoints (create,
// retrieve, list, results, cancel), which share one RPM per org: calls go
// one at a time, at least interval apart, so that no minute holds more
// than the budget. A 429 holds every call until its retry-after and
// lengthens the interval by a third; each call answered without one
// shortens it again by a twentieth of the way back to the budget's.
//
// The core takes the time as an argument (reserve, limited, answered);
// wait is the thin outer layer. A pacer is safe for concurrent use; its
// zero value does not pace.
type pacer struct {
	mu       sync.Mutex
	base     time.Duration // wall time between calls at the budget
	interval time.Duration // now, learnt from 429s
	next     time.Time     // the earliest the next call may go
	limited  int64         // 429s seen
}

// newPacer paces rpm calls per API minute at the server's speed.
func newPacer(rpm float64, speed float64) *pacer {
	if rpm <= 0 {
		rpm = DefaultRPM
	}
	if speed <= 0 {
		speed = 1
	}
	d := time.Duration(float64(time.Minute) / (rpm * paceShare) / speed)
	return &pacer{base: d, interval: d}
}

// reserve books the next call at or after now and returns when it may go.
func (p *pacer) reserve(now time.Time) time.Time {
	if p == nil || p.base <= 0 {
		return now
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	at := p.next
	if at.Before(now) {
		at = now
	}
	p.next = at.Add(p.interval)
	return at
}

// onLimited records a 429 answered at now: nothing goes before
// now + retryAfter, and the interval grows by a third.
func (p *pacer) onLimited(now time.Time, retryAfter time.Duration) {
	if p == nil || p.base <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limited++
	p.interval = min(p.interval*4/3, 64*p.base)
	if t := now.Add(max(retryAfter, p.interval)); t.After(p.next) {
		p.next = t
	}
}

// onAnswered records a call answered without a 429: the interval comes a
// twentieth of the way back to the budget's.
func (p *pacer) onAnswered() {
	if p == nil || p.base <= 0 {
		return
	}
	p.mu.Lock()
	p.interval -= (p.interval - p.base) / 20
	p.mu.Unlock()
}

// wait blocks until the next call may go, or ctx ends (then ctx.Err()).
func (p *pacer) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := time.Until(p.reserve(time.Now()))
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
