//go:build long

package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/shared"
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

// Two gateways on one Redis (--shared), each with its own key of one
// organisation. Each learns its key's organisation from the discovery
// with its first request (a Haiku one, answered at once); then Sonnet
// requests come while the API holds every Sonnet request for minutes.
// The Sonnet lanes, made after the organisation was learnt, must be on
// the organisation's budget from their first request: together the two
// never have more than the cap in flight (measured at the simulator).
func TestAttackALaterPoolOfAKnownOrganisationSharesItsCap(t *testing.T) {
	const capN = 4
	run, gws, urls := oneOrgOnSharedGateways(t, []string{"sk-ant-sim-attack-one-organisation-key-a", "sk-ant-sim-attack-one-organisation-key-b"}, capN, nil)
	ctx, cancel := context.WithCancel(context.Background())
	send := func(url, model string, i int) int {
		return postUntil(ctx, t, url, fmt.Appendf(nil, `{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"Item %d."}]}`, model, i))
	}
	for i, u := range urls {
		if st := send(u, "claude-haiku-4-5", i); st != http.StatusOK {
			t.Fatalf("the first (Haiku) request: %d", st)
		}
	}
	for i, g := range gws {
		name := []string{"a", "b"}[i]
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if id, known := g.lanes.up.SameOrg().ID(name); known && id != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %d: key %s's organisation not known after 5 s", i, name)
			}
		}
	}
	var wg sync.WaitGroup
	for _, u := range urls {
		for i := range 20 {
			wg.Go(func() { send(u, "claude-sonnet-4-5", 100+i) })
		}
	}
	// 80 API seconds: time enough for the held Sonnet requests to pass
	// the cap, were either gateway's lane on its key's own budget.
	time.Sleep(8 * time.Second)
	o := run.Server.Stats().Orgs[0]
	for _, g := range gws {
		g.Abort()
	}
	cancel()
	wg.Wait()
	t.Logf("organisation %s: max in flight %d (cap %d)", o.Name, o.MaxInFlight, capN)
	if o.MaxInFlight > capN {
		t.Errorf("organisation %s had %d in flight from two gateways on two of its keys, each knowing the organisation; the cap is %d", o.Name, o.MaxInFlight, capN)
	}
}

// slowModels holds every GET /v1/models back for half a second.
type slowModels struct{ next http.RoundTripper }

func (m slowModels) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/models" {
		time.Sleep(500 * time.Millisecond)
	}
	return m.next.RoundTrip(r)
}

// Three gateways on one Redis (--shared), each with its own key of one
// organisation that no one knows yet (a fresh organisation: Redis has no
// record of its keys), a cap of 2 on Sonnet, an API that holds every
// Sonnet request, and a models list that takes half a second to answer, as
// the API's own may: one client request to each. From the first request
// on, the organisation must never have more than its cap in flight.
//
// It had 3: each gateway's key, of an organisation it does not know yet,
// sends its first request beside the discovery, and nothing tells the
// three processes that their keys are one organisation's until an answer
// does. (With a models list that answers at once the discovery mostly
// wins the race against the first renewal, and the cap mostly holds.) The
// in-process rule (an unknown key's request counts against every
// organisation's cap) has no counterpart across processes: it needs one in
// Redis (the unknown keys' requests in flight per pool, counted on every
// organisation's budget), or, with --shared, a first message held until
// the discovery has answered.
func TestAttackFirstRequestsOfKeysOfOneOrgInSeveralProcessesBeforeDiscoveryAnswers(t *testing.T) {
	const capN = 2
	keys := []string{"sk-ant-sim-attack-first-key-a", "sk-ant-sim-attack-first-key-b", "sk-ant-sim-attack-first-key-c"}
	run, gws, urls := oneOrgOnSharedGateways(t, keys, capN, slowModels{next: http.DefaultTransport})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() { postUntil(ctx, t, u, judgeBody(i, "")) })
	}
	time.Sleep(3 * time.Second)
	o := run.Server.Stats().Orgs[0]
	for _, g := range gws {
		g.Abort()
	}
	cancel()
	wg.Wait()
	t.Logf("organisation %s: max in flight %d (cap %d)", o.Name, o.MaxInFlight, capN)
	if o.MaxInFlight > capN {
		t.Errorf("organisation %s had %d in flight from three gateways on three of its keys; the cap is %d", o.Name, o.MaxInFlight, capN)
	}
}

// oneOrgOnSharedGateways starts a simulator whose one organisation has
// keys, its Sonnet requests held (a slow fault of 300 API s), and one
// --shared gateway per key on one Redis, each capped at capN for Sonnet
// (rt, when set, is the gateways' upstream transport).
func oneOrgOnSharedGateways(t *testing.T, keys []string, capN int, rt http.RoundTripper) (*sim.Running, []*Gateway, []string) {
	t.Helper()
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 10, func(c *sim.Config) {
		c.Orgs = c.Orgs[:1]
		c.Orgs[0].Keys = keys
		c.Orgs[0].ServiceCapacity = 0
		c.Orgs[0].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 10_000_000, ITPM: 10_000_000_000, OTPM: 10_000_000_000}}
		c.Faults = append(c.Faults, sim.Fault{Kind: sim.FaultSlow, Pool: anthropic.PoolOf("claude-sonnet-4-5"), ExtraLatency: 300 * time.Second})
	})
	rs := testredis.Start(t)
	var gws []*Gateway
	var urls []string
	for i, k := range keys {
		o := org.Org{Name: string(rune('a' + i)), Key: org.NewKey(k)}
		g, srv := startGW(t, run, func(c *Config) {
			c.Orgs = []org.Org{o}
			c.Caps = map[string]int{"sonnet": capN}
			if rt != nil {
				c.HTTPClient = &http.Client{Transport: rt}
			}
			sb, err := shared.Open(context.Background(), shared.Config{URL: "redis://" + rs.Addr + "/0", Orgs: c.Orgs})
			if err != nil {
				t.Fatal(err)
			}
			sb.Start(context.Background())
			t.Cleanup(func() { sb.Close() })
			c.NewGate = sb.NewGate
		})
		gws = append(gws, g)
		urls = append(urls, srv.URL)
	}
	return run, gws, urls
}
