package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// judgeBody is a non-streaming Messages body at temperature 0 (keyed
// without --cache-sampled); extra is spliced in before the last brace.
func judgeBody(i int, extra string) []byte {
	return fmt.Appendf(nil, `{"model":"claude-sonnet-4-5","max_tokens":256,"temperature":0,"system":"You are a judge.","messages":[{"role":"user","content":"Item %d. Provide your evaluation as a JSON object."}]%s}`, i, extra)
}

type gwAnswer struct {
	status int
	header http.Header
	body   []byte
}

func postMessage(t *testing.T, url, tok string, body []byte, header ...string) gwAnswer {
	t.Helper()
	return postTo(t, url+"/v1/messages", tok, body, header...)
}

func openCache(t testing.TB, path string) *cache.Cache {
	t.Helper()
	c, err := cache.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func cacheEntries(t *testing.T, c *cache.Cache) int64 {
	t.Helper()
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Entries
}

// An identical second request is answered from the cache: the stored
// body, 200, x-apidispatch-cached, nothing sent upstream (the simulator's
// ledger), billed once in the gateway's ledger, counted as a hit with
// what it saved; it is answered even for a client whose max_cost could
// not pay for it (with the cache shared across clients). A different body
// is a miss.
func TestGatewayCacheHitSendsNothingBillsNothing(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
	g, srv := startGW(t, run, func(c *Config) {
		c.Cache, c.CacheMode, c.CacheScope = cc, cache.ModeReadWrite, CacheScopeShared
		c.Clients[1].MaxCost = 1 // client b cannot pay for any request
	})
	first := postMessage(t, srv.URL, tokA, judgeBody(1, ""))
	if first.status != 200 || first.header.Get(headerCached) != "" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	billed := run.Server.LedgerTotals()
	if billed.Requests != 1 || cacheEntries(t, cc) != 1 {
		t.Fatalf("after the first: %d upstream, %d entries", billed.Requests, cacheEntries(t, cc))
	}
	// "stream": false is the same request.
	for i, body := range [][]byte{judgeBody(1, ""), judgeBody(1, `,"stream":false`)} {
		second := postMessage(t, srv.URL, tokA, body)
		if second.status != 200 || second.header.Get(headerCached) != "true" || !bytes.Equal(second.body, first.body) ||
			second.header.Get(headerCost) != "0" || second.header.Get("request-id") == "" {
			t.Fatalf("repeat %d: %d %v %s", i, second.status, second.header, second.body)
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 1 {
		t.Errorf("the repeats sent %d requests upstream, want 0", got-1)
	}
	// Client b's max_cost refuses anything sent, not a hit.
	if b := postMessage(t, srv.URL, tokB, judgeBody(1, "")); b.status != 200 || b.header.Get(headerCached) != "true" {
		t.Errorf("client b's hit: %d %s", b.status, b.body)
	}
	if b := postMessage(t, srv.URL, tokB, judgeBody(2, "")); b.status != 400 {
		t.Errorf("client b's miss over its max_cost: %d %s", b.status, b.body)
	}
	if g.ledger.spent("a") != cost.Nanos(billed.CostNanos) || g.ledger.spent("b") != 0 {
		t.Errorf("ledger: a spent %s, b %s; the simulator billed %d nanos once", g.ledger.spent("a"), g.ledger.spent("b"), billed.CostNanos)
	}
	st := g.Status().Cache
	if st == nil || st.Hits != 3 || st.Misses != 2 || st.Stored != 1 || st.SavedUSD != cost.Nanos(3*billed.CostNanos).USD() {
		t.Errorf("cache status %+v, want 3 hits saving 3 × $%v", st, cost.Nanos(billed.CostNanos).USD())
	}

	// A beta header or another API version may change the answer: a miss
	// each, and then a hit each.
	for round := range 2 {
		for _, hdr := range [][]string{{"anthropic-beta", "context-1m-2025-08-07"}, {"anthropic-version", "2099-01-01"}} {
			a := postMessage(t, srv.URL, tokA, judgeBody(1, ""), hdr...)
			if a.status != 200 || (a.header.Get(headerCached) == "true") != (round == 1) {
				t.Errorf("%v, round %d: %d cached=%q", hdr, round, a.status, a.header.Get(headerCached))
			}
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 3 {
		t.Fatalf("the header variants sent %d requests, want 2", got-1)
	}
	billed = run.Server.LedgerTotals()
	// A different body is a miss, sent and stored.
	if other := postMessage(t, srv.URL, tokA, judgeBody(3, "")); other.status != 200 || other.header.Get(headerCached) != "" {
		t.Errorf("another request: %d %v", other.status, other.header)
	}
	if got := run.Server.LedgerTotals().Requests; got != 4 || cacheEntries(t, cc) != 4 {
		t.Errorf("another request: %d upstream in all, %d entries; want 4, 4", got, cacheEntries(t, cc))
	}
}

// Identical requests arriving together are sent once: the others wait
// for it and are answered from the cache.
func TestGatewayCacheIdenticalRequestsAtOnceSentOnce(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
	g, srv := startGW(t, run, func(c *Config) { c.Cache = cc })
	const n = 20
	var wg sync.WaitGroup
	answers := make([]gwAnswer, n)
	for i := range n {
		wg.Go(func() { answers[i] = postMessage(t, srv.URL, tokA, judgeBody(7, "")) })
	}
	wg.Wait()
	cached := 0
	for i, a := range answers {
		if a.status != 200 || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d: %d %s", i, a.status, a.body)
		}
		if a.header.Get(headerCached) == "true" {
			cached++
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 1 || cached != n-1 || cacheEntries(t, cc) != 1 {
		t.Errorf("%d identical requests at once: %d sent upstream, %d from the cache, %d entries; want 1, %d, 1", n, got, cached, cacheEntries(t, cc), n-1)
	}
	if st := g.Status().Cache; st.Hits != n-1 || st.Misses != 1 {
		t.Errorf("cache status %+v", st)
	}
}

// A cache filled from one simulator never answers a gateway in front of
// another (another origin): the request is sent, and counted.
func TestGatewayCacheOtherOriginMisses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	runA, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	cc := openCache(t, path)
	_, srvA := startGW(t, runA, func(c *Config) { c.Cache = cc })
	if a := postMessage(t, srvA.URL, tokA, judgeBody(1, "")); a.status != 200 || cacheEntries(t, cc) != 1 {
		t.Fatalf("filling: %d, %d entries", a.status, cacheEntries(t, cc))
	}
	runB, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	gB, srvB := startGW(t, runB, func(c *Config) { c.Cache = cc })
	b := postMessage(t, srvB.URL, tokA, judgeBody(1, ""))
	if b.status != 200 || b.header.Get(headerCached) != "" || runB.Server.LedgerTotals().Requests != 1 {
		t.Errorf("another origin: %d cached=%q, %d sent", b.status, b.header.Get(headerCached), runB.Server.LedgerTotals().Requests)
	}
	if st := gB.Status().Cache; st.Hits != 0 || st.OtherOrigin != 1 || st.Stored != 1 {
		t.Errorf("cache status %+v", st)
	}
	// Each origin keeps its own answer; the second asks its own now.
	if b := postMessage(t, srvB.URL, tokA, judgeBody(1, "")); b.header.Get(headerCached) != "true" || cacheEntries(t, cc) != 2 {
		t.Errorf("repeat at B: cached=%q, %d entries", b.header.Get(headerCached), cacheEntries(t, cc))
	}
}

// --cache-mode read answers hits and stores nothing; write stores and
// answers nothing.
func TestGatewayCacheModes(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
	_, srvR := startGW(t, run, func(c *Config) { c.Cache, c.CacheMode = cc, cache.ModeRead })
	for range 2 {
		if a := postMessage(t, srvR.URL, tokA, judgeBody(1, "")); a.status != 200 || a.header.Get(headerCached) != "" {
			t.Fatalf("read mode: %d cached=%q", a.status, a.header.Get(headerCached))
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 2 || cacheEntries(t, cc) != 0 {
		t.Errorf("read mode: %d sent, %d entries; want 2, 0", got, cacheEntries(t, cc))
	}
	_, srvW := startGW(t, run, func(c *Config) { c.Cache, c.CacheMode = cc, cache.ModeWrite })
	for range 2 {
		if a := postMessage(t, srvW.URL, tokA, judgeBody(1, "")); a.status != 200 || a.header.Get(headerCached) != "" {
			t.Fatalf("write mode: %d cached=%q", a.status, a.header.Get(headerCached))
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 4 || cacheEntries(t, cc) != 1 {
		t.Errorf("write mode: %d sent in all, %d entries; want 4, 1", got, cacheEntries(t, cc))
	}
	if a := postMessage(t, srvR.URL, tokA, judgeBody(1, "")); a.header.Get(headerCached) != "true" || run.Server.LedgerTotals().Requests != 4 {
		t.Errorf("read mode after write: cached=%q", a.header.Get(headerCached))
	}
}

// A streaming request bypasses the cache: sent even when its request is
// stored, answered as a stream, and nothing stored.
func TestGatewayCacheStreamsBypass(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
	g, srv := startGW(t, run, func(c *Config) { c.Cache = cc })
	if a := postMessage(t, srv.URL, tokA, judgeBody(1, "")); a.status != 200 {
		t.Fatalf("filling: %d", a.status)
	}
	for i := range 2 {
		s := postMessage(t, srv.URL, tokA, judgeBody(1+i, `,"stream":true`))
		if s.status != 200 || s.header.Get(headerCached) != "" || !strings.HasPrefix(s.header.Get("content-type"), "text/event-stream") {
			t.Fatalf("stream %d: %d %v", i, s.status, s.header)
		}
		sc := bufio.NewScanner(bytes.NewReader(s.body))
		stop := false
		for sc.Scan() {
			stop = stop || sc.Text() == "event: message_stop"
		}
		if !stop {
			t.Errorf("stream %d did not end: %s", i, s.body)
		}
	}
	if got := run.Server.LedgerTotals().Requests; got != 3 || cacheEntries(t, cc) != 1 {
		t.Errorf("streams: %d sent in all, %d entries; want 3, 1", got, cacheEntries(t, cc))
	}
	if st := g.Status().Cache; st.Hits != 0 || st.Misses != 1 {
		t.Errorf("cache status %+v: streams are not counted", st)
	}
}

// A request without temperature (the API's default 1.0: one sample of
// many) is sent every time unless CacheSampled.
func TestGatewayCacheSampledOnlyWhenAsked(t *testing.T) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Write a poem."}]}`)
	for _, sampled := range []bool{false, true} {
		run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
		cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
		_, srv := startGW(t, run, func(c *Config) { c.Cache, c.CacheSampled = cc, sampled })
		postMessage(t, srv.URL, tokA, body)
		second := postMessage(t, srv.URL, tokA, body)
		want := int64(2)
		if sampled {
			want = 1
		}
		if got := run.Server.LedgerTotals().Requests; second.status != 200 || got != want || (second.header.Get(headerCached) == "true") != sampled {
			t.Errorf("CacheSampled %v: %d sent, cached=%q; want %d", sampled, got, second.header.Get(headerCached), want)
		}
	}
}

// BenchmarkGatewayCache measures, at 64 concurrent requests against the
// zero-latency simulator, one gateway without a cache, with a cache where
// every request is a new one (keyed, looked up twice, sent, stored), and
// answering every request from the cache.
//
//	go test ./gateway -run '^$' -bench GatewayCache -benchtime 5000x
func BenchmarkGatewayCache(b *testing.B) {
	const conc = 64
	distinct := func(off int64) func(int64) []byte {
		return func(i int64) []byte { return judgeBody(int(off+i), "") }
	}
	report := func(b *testing.B, lat []time.Duration, wall, cpu time.Duration) {
		b.ReportMetric(float64(b.N)/wall.Seconds(), "req/s")
		b.ReportMetric(float64(pct(lat, 0.5).Microseconds()), "p50-µs")
		b.ReportMetric(float64(pct(lat, 0.99).Microseconds()), "p99-µs")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("none", func(b *testing.B) {
		run := benchSim(b)
		_, srv := startGW(b, run, nil)
		driveBodies(b, srv.URL, tokA, 2000, conc, distinct(1e9))
		b.ResetTimer()
		lat, wall, cpu := driveBodies(b, srv.URL, tokA, b.N, conc, distinct(0))
		b.StopTimer()
		report(b, lat, wall, cpu)
	})
	b.Run("misses", func(b *testing.B) {
		run := benchSim(b)
		cc := openCache(b, filepath.Join(b.TempDir(), "c.db"))
		_, srv := startGW(b, run, func(c *Config) { c.Cache = cc })
		driveBodies(b, srv.URL, tokA, 2000, conc, distinct(1e9))
		b.ResetTimer()
		lat, wall, cpu := driveBodies(b, srv.URL, tokA, b.N, conc, distinct(0))
		b.StopTimer()
		report(b, lat, wall, cpu)
	})
	b.Run("hits", func(b *testing.B) {
		run := benchSim(b)
		cc := openCache(b, filepath.Join(b.TempDir(), "c.db"))
		_, srv := startGW(b, run, func(c *Config) { c.Cache = cc })
		const keys = 1000
		driveBodies(b, srv.URL, tokA, keys, conc, distinct(0))
		sent := run.Server.LedgerTotals().Requests
		b.ResetTimer()
		lat, wall, cpu := driveBodies(b, srv.URL, tokA, b.N, conc, func(i int64) []byte { return judgeBody(int(i%keys), "") })
		b.StopTimer()
		if got := run.Server.LedgerTotals().Requests; got != sent {
			b.Errorf("%d hits sent %d requests", b.N, got-sent)
		}
		report(b, lat, wall, cpu)
	})
}

// failFirst answers the first Messages request it sees with a terminal
// 400 after a pause (so that identical requests queue behind it), and
// passes the rest on (and every other request, such as the discovery of
// the keys' organisations).
// failFirst refuses the first Messages request it sends with a 400,
// after 200 ms; with started and release set, it closes started when that
// request is under way (the gateway has claimed it in the cache) and
// answers only once release is closed, so that a test decides what
// happens meanwhile rather than racing a sleep.
type failFirst struct {
	next             http.RoundTripper
	once             sync.Once
	started, release chan struct{}
}

func (f *failFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != "/v1/messages" {
		return f.next.RoundTrip(r)
	}
	first := false
	f.once.Do(func() { first = true })
	if !first {
		return f.next.RoundTrip(r)
	}
	if f.release != nil {
		close(f.started)
		<-f.release
	} else {
		time.Sleep(200 * time.Millisecond)
	}
	body := `{"type":"error","error":{"type":"invalid_request_error","message":"first one refused"}}`
	return &http.Response{StatusCode: 400, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// Identical requests waiting for one that fails are not answered by its
// failure: one of them is sent next, and its success answers the others.
func TestGatewayCacheLeaderFailsNextIsSent(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	cc := openCache(t, filepath.Join(t.TempDir(), "c.db"))
	_, srv := startGW(t, run, func(c *Config) {
		c.Cache = cc
		c.HTTPClient = &http.Client{Transport: &failFirst{next: http.DefaultTransport}}
	})
	const n = 5
	var wg sync.WaitGroup
	answers := make([]gwAnswer, n)
	for i := range n {
		wg.Go(func() {
			if i > 0 {
				time.Sleep(50 * time.Millisecond) // behind the first
			}
			answers[i] = postMessage(t, srv.URL, tokA, judgeBody(1, ""))
		})
	}
	wg.Wait()
	refused, sent, cached := 0, 0, 0
	for _, a := range answers {
		switch {
		case a.status == 400:
			refused++
		case a.status == 200 && a.header.Get(headerCached) == "true":
			cached++
		case a.status == 200:
			sent++
		}
	}
	if refused != 1 || sent != 1 || cached != n-2 || run.Server.LedgerTotals().Requests != 1 {
		t.Errorf("%d refused, %d sent, %d from the cache, %d reached the simulator; want 1, 1, %d, 1", refused, sent, cached, run.Server.LedgerTotals().Requests, n-2)
	}
}
