package runner

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/batch"
	"github.com/apidispatch/apidispatch/dispatch"
)

// Aborter abandons a run's requests in flight at once: the second signal.
// Give one to Config.Abort and call Abort from anywhere; an engine that
// starts after Abort is aborted as it starts. The zero value is ready;
// it is safe for concurrent use.
type Aborter struct {
	mu      sync.Mutex
	eng     *dispatch.Engine
	aborted bool
}

// Abort abandons the requests in flight of the running engine, if any,
// and of every later one. It returns once the engine was told.
func (a *Aborter) Abort() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.aborted = true
	if a.eng != nil {
		a.eng.Abort()
	}
}

// attach makes eng the engine Abort aborts (nil: none).
func (a *Aborter) attach(eng *dispatch.Engine) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.eng = eng
	if eng != nil && a.aborted {
		eng.Abort()
	}
}

// onEngine is Run's Exec.OnEngine: the engine joins the Aborter, and,
// with Progress, a progress display on w runs while it does.
func (cfg *Config) onEngine(w io.Writer) func(*dispatch.Engine) func() {
	return func(eng *dispatch.Engine) func() {
		cfg.Abort.attach(eng)
		if !cfg.Progress {
			return func() { cfg.Abort.attach(nil) }
		}
		pctx, pstop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			dispatch.WatchProgress(pctx, eng, w, cfg.TTY)
		}()
		return func() { pstop(); <-done; cfg.Abort.attach(nil) }
	}
}

// watchBatches prints a line about the batch route every few seconds until
// the returned function is called, which waits for it.
func watchBatches(rt *batch.Route, w io.Writer) func() {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "batches: %d requests in open batches\n", rt.Held())
			}
		}
	}()
	return func() { close(done); <-exited }
}
