package gateway

import (
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// servedGW is a gateway served by Serve on loopback until its Stop
// channel says so.
type servedGW struct {
	g      *Gateway
	url    string
	stop   chan os.Signal
	served chan error
}

// serveGW serves a gateway of run's first org (changed by mutate) with
// Serve, the drain given, until the test ends.
func serveGW(t *testing.T, run *sim.Running, drain time.Duration, mutate func(*Config)) *servedGW {
	t.Helper()
	cfg := Config{Orgs: run.Server.Orgs()[:1], BaseURL: run.URL, Speed: run.Server.Speed(), Prices: cost.Default(),
		Clients: []Client{{Name: "a", Token: tokA}}, StateDir: t.TempDir(), RetryFor: time.Minute}
	if mutate != nil {
		mutate(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &servedGW{g: g, url: "http://" + ln.Addr().String(), stop: make(chan os.Signal, 2), served: make(chan error, 1)}
	go func() { s.served <- g.Serve(ln, ServeConfig{Stop: s.stop, Drain: drain, Conns: ConnLimits{Max: 1000}}) }()
	t.Cleanup(func() {
		s.stop <- syscall.SIGTERM
		s.stop <- syscall.SIGTERM
		<-s.served
		g.Close()
	})
	return s
}

// sentUpstream is how many requests reached the simulator: answered or
// under way.
func sentUpstream(run *sim.Running) (n int64) {
	for _, o := range run.Server.Stats().Orgs {
		n += o.Requests + o.InFlight
	}
	return n
}

// fill sends inFlight requests (the first streams of them streams) and
// waits until they are upstream, then queued more and waits until they
// wait for a lane; it returns each one's answer, when it comes.
func fill(t *testing.T, s *servedGW, run *sim.Running, inFlight, streams, queued int) []chan gwAnswer {
	t.Helper()
	var out []chan gwAnswer
	send := func(i int) {
		c := make(chan gwAnswer, 1)
		out = append(out, c)
		extra := ""
		if i < streams {
			extra = `,"stream":true`
		}
		go func() {
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/messages", strings.NewReader(string(judgeBody(i, extra))))
			req.Header.Set("x-api-key", tokA)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				c <- gwAnswer{status: 0, body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					break
				}
			}
			c <- gwAnswer{status: resp.StatusCode, header: resp.Header, body: []byte(b.String())}
		}()
	}
	base := sentUpstream(run)
	for i := range inFlight {
		send(i)
	}
	for end := time.Now().Add(10 * time.Second); sentUpstream(run)-base < int64(inFlight); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d requests upstream", sentUpstream(run)-base, inFlight)
		}
	}
	for i := range queued {
		send(inFlight + i)
	}
	for end := time.Now().Add(10 * time.Second); s.g.Status().Queued < queued; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d requests queued", s.g.Status().Queued, queued)
		}
	}
	return out
}

// The first stop admits nothing more: the requests waiting for a lane are
// answered the API's 529 at once (the SDKs retry it), nothing more is sent
// upstream, and the requests in flight finish within the drain and are
// answered and priced as usual; then Serve returns.
func TestDrainAnswersTheQueuedAndLetsInFlightFinish(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 100 * time.Second}); err != nil { // 1 s real
		t.Fatal(err)
	}
	s := serveGW(t, run, 30*time.Second, func(c *Config) { c.Caps = map[string]int{"sonnet": 2} })
	// One request first: the lane admits one until its first answer.
	if a := postMessage(t, s.url, tokA, judgeBody(99, "")); a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	answers := fill(t, s, run, 2, 1, 4)
	sent := sentUpstream(run)
	stopped := time.Now()
	s.stop <- syscall.SIGTERM
	for i, c := range answers[2:] {
		a := <-c
		if a.status != 529 || !strings.Contains(string(a.body), `"overloaded_error"`) || a.header.Get("x-should-retry") != "true" || time.Since(stopped) > 500*time.Millisecond {
			t.Errorf("queued request %d: %d after %v: %s; want the API's 529 at once", i, a.status, time.Since(stopped), a.body)
		}
	}
	for i, c := range answers[:2] {
		if a := <-c; a.status != 200 || (i == 0 && !strings.Contains(string(a.body), "event: message_stop")) {
			t.Errorf("request %d in flight: %d %.300s; want its answer", i, a.status, a.body)
		}
	}
	select {
	case err := <-s.served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		s.served <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running after its requests in flight finished")
	}
	if n := sentUpstream(run) - sent; n != 0 {
		t.Errorf("%d requests sent upstream after the stop", n)
	}
	s.g.Ledger().Flush()
	if _, tot := s.g.Ledger().Totals(); tot.Requests != 3 || tot.Abandoned != 0 {
		t.Errorf("ledger %+v, want the 3 answered", tot)
	}
}

// When the drain runs out, what is still upstream is cut: a plain request
// gets a 529, a stream ends with the API's error event, each is recorded
// at its worst case and counted abandoned (the status says so), and Serve
// returns at once.
func TestDrainEndCutsWhatIsInFlight(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, func(c *sim.Config) { c.BillAbandoned = true })
	if _, err := run.Server.AddFault(sim.Fault{ID: "slow", Kind: sim.FaultSlow, ExtraLatency: 300 * time.Second}); err != nil { // 3 s real
		t.Fatal(err)
	}
	s := serveGW(t, run, 1500*time.Millisecond, func(c *Config) { c.Caps = map[string]int{"sonnet": 2} })
	var wg sync.WaitGroup
	wg.Go(func() { postMessage(t, s.url, tokA, judgeBody(98, "")) }) // the lane's first answer
	wg.Wait()
	answers := fill(t, s, run, 2, 1, 0)
	s.stop <- syscall.SIGTERM
	stopped := time.Now()
	stream, plain := <-answers[0], <-answers[1]
	if stream.status == 200 && !strings.Contains(string(stream.body), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"") ||
		stream.status != 200 && stream.status != 529 {
		t.Errorf("stream cut: %d ...%s", stream.status, stream.body[max(0, len(stream.body)-300):])
	}
	if plain.status != 529 || !strings.Contains(string(plain.body), `"overloaded_error"`) {
		t.Errorf("plain request cut: %d %s", plain.status, plain.body)
	}
	select {
	case <-s.served:
		s.served <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running after the drain ran out")
	}
	if d := time.Since(stopped); d > 4*time.Second {
		t.Errorf("Serve returned %v after the stop, the drain being 1.5 s", d)
	}
	s.g.Ledger().Flush()
	_, tot := s.g.Ledger().Totals()
	worst, _ := cost.Default().WorstCase(cost.Bound{Model: "claude-sonnet-4-5", Input: int64(len(judgeBody(0, `,"stream":true`))), MaxTokens: 256})
	if tot.Abandoned != 2 || tot.SpentUSD < 2*worst.USD()*0.9 || s.g.Status().Abandoned != 2 {
		t.Errorf("ledger %+v, status abandoned %d; want the 2 cut at their worst case (~$%v each)", tot, s.g.Status().Abandoned, worst.USD())
	}
}
