package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

// Defaults of Serve.
const (
	// DefaultDrain is how long requests in flight have to finish once the
	// gateway is told to stop.
	DefaultDrain = 30 * time.Second
	// DefaultHeaderTimeout bounds reading a request's header.
	DefaultHeaderTimeout = 30 * time.Second
	// DefaultIdleTimeout closes a kept-alive connection idle that long.
	DefaultIdleTimeout = 5 * time.Minute
)

// abortWait is how long Serve lets handlers record and answer what Abort
// cut before it closes every connection.
const abortWait = time.Second

// ServeConfig configures Serve. Zero fields take the defaults noted.
type ServeConfig struct {
	// Stop brings the requests to stop: the first drains (Drain), the
	// next cuts what is still in flight (Abort), as the end of Drain does.
	Stop <-chan os.Signal
	// Drain is the grace of requests in flight (default DefaultDrain).
	Drain time.Duration
	// Conns bounds the client connections (see ConnLimits); Max must be
	// set (CheckConnLimits fills it in).
	Conns ConnLimits
	// HeaderTimeout (default DefaultHeaderTimeout) and IdleTimeout
	// (default DefaultIdleTimeout) are the http.Server's.
	HeaderTimeout, IdleTimeout time.Duration
	// TLSCert and TLSKey, when set, serve HTTPS.
	TLSCert, TLSKey string
	// Stderr gets a line for each step of a stop (nil: none).
	Stderr io.Writer
}

// Serve serves g on ln until sc.Stop asks it to stop, then drains: nothing
// more is admitted, queued requests are answered with the API's retryable
// 529, and requests in flight have sc.Drain to finish; a second stop, or
// the drain's end, cuts them (Abort). It returns when every connection is
// closed, with nil, or with the error that ended serving. Close the
// gateway after it (then the shared budget, whose slots of requests cut
// stay taken until their lease and grace pass).
func (g *Gateway) Serve(ln net.Listener, sc ServeConfig) error {
	if sc.Drain <= 0 {
		sc.Drain = DefaultDrain
	}
	if sc.HeaderTimeout <= 0 {
		sc.HeaderTimeout = DefaultHeaderTimeout
	}
	if sc.IdleTimeout <= 0 {
		sc.IdleTimeout = DefaultIdleTimeout
	}
	if sc.Conns.Max <= 0 {
		return fmt.Errorf("%w: Serve needs ServeConfig.Conns.Max (CheckConnLimits)", ErrConfig)
	}
	say := func(format string, a ...any) {
		if sc.Stderr != nil {
			fmt.Fprintf(sc.Stderr, format+"\n", a...)
		}
	}
	lim := newConnLimiter(ln, sc.Conns)
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: sc.HeaderTimeout, IdleTimeout: sc.IdleTimeout,
		ConnState: lim.connState, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan error, 1)
	go func() {
		if sc.TLSCert != "" {
			done <- srv.ServeTLS(lim, sc.TLSCert, sc.TLSKey)
		} else {
			done <- srv.Serve(lim)
		}
	}()
	select {
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-sc.Stop:
	}
	say("stopping: admitting nothing more (queued requests are answered 529, which clients retry); requests in flight have %v to finish, a second signal cuts them; gateway batches resume at the next start", sc.Drain)
	g.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), sc.Drain)
	defer cancel()
	second := make(chan struct{})
	go func() {
		select {
		case <-sc.Stop:
			close(second)
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := srv.Shutdown(ctx); err != nil {
		select {
		case <-second:
			say("second signal: cutting the requests in flight (each recorded at its worst case, as abandoned)")
		default:
			say("the drain's %v ran out: cutting the requests in flight (each recorded at its worst case, as abandoned)", sc.Drain)
		}
		g.Abort()
		// The handlers answer what Abort cut (a 529, a stream's error
		// event); the server waits for them to return and write those
		// answers out before it closes the connections (closed at once, a
		// client could read EOF instead of its 529 on a loaded machine).
		flush, cancelFlush := context.WithTimeout(context.Background(), 2*abortWait)
		srv.Shutdown(flush)
		cancelFlush()
		srv.Close()
	}
	<-done
	return nil
}
