package apihttp

import (
	"context"
	"sync"
	"time"
)

// pausedAfter is how late a deadline's timer must fire for the process to
// count as having been stopped (SIGSTOP, a closed laptop lid, a VM pause)
// rather than merely busy.
const pausedAfter = time.Second

// AttemptContext is context.WithTimeout(parent, d) for one HTTP attempt,
// except that time the process spent stopped does not run the attempt out.
// The monotonic clock runs on while a process is stopped, so an ordinary
// deadline that passed during the stop ends the attempt the moment the
// process resumes, before it reads the answer that has been waiting in its
// socket: a request the API answered and billed would then be retried and
// billed again. Here a deadline whose timer fires more than a second late
// is moved on by that lateness (at most d) instead, once per stop; an
// attempt that is really slow still ends at d. Err reports
// context.DeadlineExceeded when the deadline ends it.
func AttemptContext(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	a := &attemptCtx{Context: ctx}
	a.mu.Lock()
	a.due = time.Now().Add(d)
	a.timer = time.AfterFunc(d, func() { a.fire(d, cancel) })
	a.mu.Unlock()
	return a, func() {
		a.mu.Lock()
		a.timer.Stop()
		a.mu.Unlock()
		cancel()
	}
}

type attemptCtx struct {
	context.Context
	mu       sync.Mutex
	due      time.Time
	timer    *time.Timer
	timedOut bool
}

func (a *attemptCtx) fire(d time.Duration, cancel context.CancelFunc) {
	a.mu.Lock()
	now := time.Now()
	if late := now.Sub(a.due); late > pausedAfter {
		// Stopped past the deadline: give the attempt the time the stop
		// took from it again (its answer is most likely read at once).
		more := min(late, d)
		a.due = now.Add(more)
		a.timer.Reset(more)
		a.mu.Unlock()
		return
	}
	a.timedOut = true
	a.mu.Unlock()
	cancel()
}

// Deadline reports the current deadline (it moves on after a stop).
func (a *attemptCtx) Deadline() (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pd, ok := a.Context.Deadline(); ok && pd.Before(a.due) {
		return pd, true
	}
	return a.due, true
}

// Err is context.DeadlineExceeded once the deadline has ended the attempt.
func (a *attemptCtx) Err() error {
	err := a.Context.Err()
	if err == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timedOut {
		return context.DeadlineExceeded
	}
	return err
}
