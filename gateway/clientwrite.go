package gateway

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// clientWriter passes a stream on to its client from a queue, in a
// goroutine of its own, so that reading the upstream answer never waits for
// the client: the answer is read to its end and its lane freed when the
// upstream is done, however slowly the client reads. Each write to the
// client has the gateway's write deadline (guard); a client that takes
// nothing for that long, or that lets more than maxUpstreamAnswer bytes
// pile up, is given up on (failed) and the rest is dropped. Make it with
// newClientWriter after the header is written; finish ends it.
type clientWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	wake chan struct{} // capacity 1
	done chan struct{} // closed when the goroutine has ended

	mu     sync.Mutex
	queue  []clientChunk
	queued int // bytes in queue
	closed bool
	gaveUp atomic.Bool
}

// clientChunk is bytes to write, or (flush) a flush.
type clientChunk struct {
	b     []byte
	flush bool
}

func newClientWriter(w http.ResponseWriter) *clientWriter {
	c := &clientWriter{w: w, rc: http.NewResponseController(w), wake: make(chan struct{}, 1), done: make(chan struct{})}
	go c.run()
	return c
}

// write queues a copy of b.
func (c *clientWriter) write(b []byte) { c.put(clientChunk{b: append([]byte(nil), b...)}) }

// flush queues a flush (an event's end).
func (c *clientWriter) flush() { c.put(clientChunk{flush: true}) }

func (c *clientWriter) put(ch clientChunk) {
	if c.gaveUp.Load() {
		return
	}
	c.mu.Lock()
	c.queue = append(c.queue, ch)
	c.queued += len(ch.b)
	over := c.queued > maxUpstreamAnswer
	c.mu.Unlock()
	if over {
		c.gaveUp.Store(true)
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// failed reports that the client was given up on.
func (c *clientWriter) failed() bool { return c.gaveUp.Load() }

// finish waits until everything queued is written (or the client given
// up on) and ends the goroutine. The ResponseWriter is the handler's again.
func (c *clientWriter) finish() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.done
}

func (c *clientWriter) run() {
	defer close(c.done)
	for {
		c.mu.Lock()
		q, closed := c.queue, c.closed
		c.queue, c.queued = nil, 0
		c.mu.Unlock()
		for _, ch := range q {
			if c.gaveUp.Load() {
				break
			}
			var err error
			if ch.flush {
				err = c.rc.Flush()
			} else {
				_, err = c.w.Write(ch.b)
			}
			if err != nil {
				c.gaveUp.Store(true)
			}
		}
		if closed {
			return
		}
		<-c.wake
	}
}
