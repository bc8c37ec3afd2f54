package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/runner"
)

// ErrDraining: the gateway is stopping (Drain): it admits nothing more.
var ErrDraining = errors.New("gateway: stopping: admitting nothing more")

// The gateway stops in two steps, as a team restarting it needs:
//
//   - Drain (the first signal) stops admitting at once: nothing more is
//     sent upstream, not even a retry or a request admitted a moment
//     before; every request still waiting for a lane, and every new one,
//     is answered with the API's retryable 529 overloaded_error, which the
//     SDKs retry (at the next gateway); gateway batches stop sending and
//     resume at the next start. Requests already upstream finish.
//   - Abort (a second signal, or the drain's grace run out) cuts what is
//     still upstream. A cut request may still run there and be billed: it
//     is recorded in the ledger at its worst case, counted as abandoned,
//     and its lane slot is not handed back (the shared budget then hands
//     it to the others only when its lease and grace have passed, as after
//     a kill). Its client gets a 529, or, in a stream, the API's error
//     event.

// lifecycle is the state of a gateway's stop.
type lifecycle struct {
	drainOnce sync.Once
	draining  chan struct{} // closed by Drain
	// batchCtx is the parent of gateway batches' runs: cancelled by Drain.
	batchCtx    context.Context
	stopBatches context.CancelFunc
	// cutCtx is the parent of every upstream attempt: cancelled by Abort.
	cutCtx context.Context
	cut    context.CancelFunc

	mu       sync.Mutex
	active   int             // requests in the gateway's handlers
	idle     []chan struct{} // closed when active reaches 0
	aborters map[*runner.Aborter]bool
	aborted  bool
}

func (l *lifecycle) init(parent context.Context) {
	l.draining = make(chan struct{})
	l.batchCtx, l.stopBatches = context.WithCancel(parent)
	l.cutCtx, l.cut = context.WithCancel(context.Background())
	l.aborters = map[*runner.Aborter]bool{}
}

// cutting reports whether Abort has cut the requests in flight.
func (l *lifecycle) cutting() bool { return l.cutCtx.Err() != nil }

func (l *lifecycle) isDraining() bool {
	select {
	case <-l.draining:
		return true
	default:
		return false
	}
}

// enter and leave count a request in a handler.
func (l *lifecycle) enter() {
	l.mu.Lock()
	l.active++
	l.mu.Unlock()
}

func (l *lifecycle) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active--; l.active == 0 {
		for _, c := range l.idle {
			close(c)
		}
		l.idle = nil
	}
}

// waitIdle waits until no request is in a handler, or d has passed; it
// reports the former.
func (l *lifecycle) waitIdle(d time.Duration) bool {
	l.mu.Lock()
	if l.active == 0 {
		l.mu.Unlock()
		return true
	}
	c := make(chan struct{})
	l.idle = append(l.idle, c)
	l.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c:
		return true
	case <-t.C:
		return false
	}
}

// aborter returns a runner.Aborter that Abort aborts (at once when Abort
// came first), and the function that forgets it.
func (l *lifecycle) aborter() (*runner.Aborter, func()) {
	a := &runner.Aborter{}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.aborted {
		a.Abort()
	}
	l.aborters[a] = true
	return a, func() {
		l.mu.Lock()
		delete(l.aborters, a)
		l.mu.Unlock()
	}
}

// Drain stops admitting at once (see above): it returns after every request
// waiting for a lane has been answered ErrDraining's 529 and gateway
// batches were told to stop. It is safe to call more than once, and from
// any goroutine.
func (g *Gateway) Drain() {
	g.life.drainOnce.Do(func() {
		close(g.life.draining)
		g.lanes.shut(ErrDraining)
		g.life.stopBatches()
		g.log.Info("stopping: admitting nothing more; requests in flight finish")
	})
}

// Abort drains (when not yet) and cuts every request in flight upstream,
// its gateway batches' too (see above). Their handlers record and answer
// them at once.
func (g *Gateway) Abort() {
	g.Drain()
	g.lanes.abort()
	g.life.mu.Lock()
	g.life.aborted = true
	for a := range g.life.aborters {
		a.Abort()
	}
	g.life.mu.Unlock()
	g.life.cut()
	g.log.Warn("stopping: cutting the requests in flight (each recorded at its worst case, as abandoned)")
}

// writeDraining answers a request the gateway will not send because it is
// stopping: the API's 529 overloaded_error, which the SDKs retry.
func writeDraining(w http.ResponseWriter, msg string) {
	w.Header().Set(anthropic.HeaderShouldRetry, "true")
	w.Header().Set(anthropic.HeaderRetryAfter, "1")
	writeError(w, statusOverloaded, anthropic.ErrOverloaded, "apidispatch gateway: "+msg)
}

// closeWait is how long Close waits for handlers still running.
const closeWait = 2 * time.Second

// statusOverloaded is the API's 529.
const statusOverloaded = 529

const (
	msgStopping = "stopping: this gateway admits nothing more; retry (a restarted gateway will serve it)"
	msgCut      = "stopped while the request was upstream; it may have been billed (recorded at its worst case); retry"
)

// refuseDraining answers r with the 529 of a stopping gateway when r would
// send upstream (messages, count_tokens, models, a new batch), and
// reports it. Reading, canceling and deleting batches go on while the
// gateway drains.
func (g *Gateway) refuseDraining(w http.ResponseWriter, r *http.Request) bool {
	if !g.life.isDraining() {
		return false
	}
	switch {
	case r.URL.Path == "/v1/messages", r.URL.Path == "/v1/messages/count_tokens",
		r.URL.Path == "/v1/models", strings.HasPrefix(r.URL.Path, "/v1/models/"),
		r.URL.Path == openai.PathChatCompletions,
		r.Method == http.MethodPost && r.URL.Path == "/v1/messages/batches":
		if g.isOpenAIRequest(r) {
			writeOADraining(w, msgStopping)
		} else {
			writeDraining(w, msgStopping)
		}
		return true
	}
	return false
}

// cutAtExit ends an attempt that Abort cut: one that may have been billed
// is recorded at its worst case as abandoned and keeps its lane slot (it
// may still run upstream); one that was not is let go. The client gets a
// 529. done is always true.
func (x *exchange) cutAtExit(gr grant, o anthropic.Outcome, hdr http.Header) (anthropic.Outcome, *answer, bool) {
	g := x.g
	if x.mayHaveBilled(o) {
		e := Entry{Cost: x.worst, Unread: x.worst, Org: gr.lane.up.Name, Abandoned: true}
		if hdr != nil {
			e.RequestID = x.prov.RequestID(hdr)
		}
		x.settle(e)
		g.stats.abandoned.Add(1)
		// The permit is kept, not released: see Abort.
	} else {
		g.lanes.release(gr, gate.Feedback{})
		x.settle(Entry{})
	}
	x.draining(msgCut)
	return o, nil, true
}
