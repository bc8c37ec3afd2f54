//go:build long

package gateway

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// hangModels holds every GET /v1/models until its request's context ends.
type hangModels struct{ next http.RoundTripper }

func (h hangModels) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/models" {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return h.next.RoundTrip(r)
}

// While every key's first discovery request hangs, clients' requests
// wait for their lanes; a drain (the first SIGTERM) must answer each of
// them at once, none sent upstream, and Close must not wait for the hung
// discovery.
func TestAttackDrainAnswersRequestsHeldByAHungDiscovery(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 10, nil)
	g, srv := startGW(t, run, func(c *Config) { c.HTTPClient = &http.Client{Transport: hangModels{http.DefaultTransport}} })
	const n = 4
	got := make(chan int, n)
	for range n {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", bytes.NewReader([]byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hi."}]}`)))
			req.Header.Set("x-api-key", tokA)
			req.Header.Set("content-type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				got <- -1
				return
			}
			resp.Body.Close()
			got <- resp.StatusCode
		}()
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case s := <-got:
		t.Fatalf("a request was answered %d while every key's discovery hangs, want it held", s)
	default:
	}
	start := time.Now()
	g.Drain()
	for i := range n {
		select {
		case s := <-got:
			if s != statusOverloaded {
				t.Errorf("request %d answered %d at the drain, want %d", i, s, statusOverloaded)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d held requests not answered 5 s after the drain", n-i, n)
		}
	}
	answered := time.Since(start)
	srv.Close()
	cs := time.Now()
	g.Close()
	closed := time.Since(cs)
	msgs := run.Server.LedgerTotals().Requests
	t.Logf("held requests answered %v after the drain; Close took %v; %d messages reached the API", answered, closed, msgs)
	if msgs != 0 {
		t.Errorf("%d messages reached the API, want 0", msgs)
	}
	if closed > 3*time.Second {
		t.Errorf("Close took %v with the discovery hung, want at most 3 s", closed)
	}
}

// A key whose first discovery request hangs is held only for the
// discovery's timeout (the attempt timeout, at most 10 s): then its
// lanes send, one request at a time, as without discovery.
func TestAttackHungDiscoveryHoldsAKeyOnlyForItsTimeout(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	const timeout = 2 * time.Second
	_, srv := startGW(t, run, func(c *Config) {
		c.HTTPClient = &http.Client{Transport: hangModels{http.DefaultTransport}}
		c.Timeout = timeout
	})
	start := time.Now()
	status, answer, _ := gwPost(t, srv.URL, tokA, []byte(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"Hi."}]}`))
	took := time.Since(start)
	t.Logf("answered %d after %v with every key's discovery hung (discovery timeout %v)", status, took, timeout)
	if status != http.StatusOK {
		t.Fatalf("answered %d %s, want 200 once the discovery timed out", status, answer)
	}
	if took < timeout/2 || took > timeout+6*time.Second {
		t.Errorf("answered after %v, want about the discovery timeout %v (held while it is out, not longer)", took, timeout)
	}
}
