package gateway

import (
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// countModels counts the GET /v1/models requests that reach the transport.
type countModels struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countModels) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/models" {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// A SIGTERM that comes while serve is starting (serve listens for signals
// before it makes the gateway, and Serve reads them) must stop the gateway
// before it sends anything: no request goes upstream after the first
// signal, and no client has asked for one. The discovery of the keys'
// organisations (GET /v1/models) started in New, before the signal
// waiting on Stop was read.
func TestAttackNoDiscoveryAfterASignalDuringStartUp(t *testing.T) {
	t.Parallel()
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 10, nil)
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM // came after serve's signal.Notify, before Serve
	cm := &countModels{next: http.DefaultTransport}
	g, _ := startGW(t, run, func(c *Config) { c.HTTPClient = &http.Client{Transport: cm} })
	// The rest of the start-up (listening, the announcement) takes a
	// moment.
	time.Sleep(200 * time.Millisecond)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Serve(ln, ServeConfig{Stop: sigs, Drain: time.Second, Conns: ConnLimits{Max: 10}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := cm.n.Load(); n != 0 {
		t.Errorf("%d GET /v1/models sent by a gateway stopped by a signal before it served anything, want 0", n)
	}
}
