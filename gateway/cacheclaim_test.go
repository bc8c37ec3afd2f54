package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cache"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// Two gateways on one cache file (two connections to it, as two processes
// have), the same 50 prompts sent to both at once: each prompt is billed
// once, and both clients of a prompt get the same body. Before claims in
// the cache file, each gateway sent its own: about 100 billed.
func TestGatewayCacheTwoGatewaysOneFileSendOnce(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	_, srv1 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	_, srv2 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	const n = 50
	var answers [2][n]gwAnswer
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		for s, url := range []string{srv1.URL, srv2.URL} {
			wg.Go(func() {
				<-start
				answers[s][i] = postMessage(t, url, tokA, judgeBody(1000+i, ""))
			})
		}
	}
	close(start)
	wg.Wait()
	differ := 0
	for i := range n {
		a, b := answers[0][i], answers[1][i]
		if a.status != 200 || b.status != 200 {
			t.Fatalf("prompt %d: %d and %d:\n%s\n%s", i, a.status, b.status, a.body, b.body)
		}
		if !bytes.Equal(a.body, b.body) {
			differ++
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d prompts got two different bodies from the two gateways", differ, n)
	}
	if got := run.Server.LedgerTotals().Requests; got != n {
		t.Errorf("%d prompts sent to two gateways on one cache file at once: the API billed %d requests, want %d", n, got, n)
	}
	if got := cacheEntries(t, openCache(t, path)); got != n {
		t.Errorf("%d entries, want %d", got, n)
	}
}

// gatewayKey is the key g gives body sent by client without headers.
func gatewayKey(t *testing.T, g *Gateway, client string, body []byte) cache.Key {
	t.Helper()
	k, _, err := cache.InspectMessage(body)
	if err != nil {
		t.Fatal(err)
	}
	return g.scoped(k, client)
}

// A process claimed a request and died before sending it (its claim is
// left in the file, never renewed): a gateway's identical request waits
// for the claim's lease to end, then takes it over and sends it; the API
// bills it once (the dead owner sent nothing; had it sent, the API might
// have billed it too, which no waiter can know).
func TestGatewayCacheTakesOverADeadOwnersClaim(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	g, srv := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	body := judgeBody(1, "")
	k := gatewayKey(t, g, "a", body)

	dead, err := cache.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 1500 * time.Millisecond
	owner := dead.NewClaimer(lease)
	defer owner.Close()
	claimedAt := time.Now()
	if got, err := owner.Claim(context.Background(), claimedAt, []cache.Key{k}, cache.OriginOf(mustURL(t, run.URL))); err != nil || len(got.Claimed) != 1 {
		t.Fatalf("the owner's claim: %+v, %v", got, err)
	}
	dead.Close() // dies: nothing renews or releases its claim

	a := postMessage(t, srv.URL, tokA, body)
	took := time.Since(claimedAt)
	if a.status != 200 || a.header.Get(headerCached) == "true" {
		t.Fatalf("the waiter: %d cached=%q %s", a.status, a.header.Get(headerCached), a.body)
	}
	if took < lease-50*time.Millisecond {
		t.Errorf("answered %v after the dead owner's claim; it must wait out its lease of %v", took, lease)
	}
	if got := run.Server.LedgerTotals().Requests; got != 1 {
		t.Errorf("billed %d, want 1", got)
	}
	if st := g.Status().Cache; st.Misses != 1 || st.Stored != 1 {
		t.Errorf("cache status %+v", st)
	}
	// Its answer is stored: the next one is a hit.
	if b := postMessage(t, srv.URL, tokA, body); b.header.Get(headerCached) != "true" || !bytes.Equal(b.body, a.body) {
		t.Errorf("after: %d cached=%q", b.status, b.header.Get(headerCached))
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A request waiting for another process's answer ends its wait when its
// client goes away: nothing is sent, and it holds no claim afterwards
// (when the other releases, the key is free for anyone).
func TestGatewayCacheWaiterLeavesWithItsClient(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	g, srv := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	body := judgeBody(1, "")
	k := gatewayKey(t, g, "a", body)
	origin := cache.OriginOf(mustURL(t, run.URL))
	other := openCache(t, path).NewClaimer(time.Minute)
	defer other.Close()
	if got, err := other.Claim(context.Background(), time.Now(), []cache.Key{k}, origin); err != nil || len(got.Claimed) != 1 {
		t.Fatalf("the other process's claim: %+v, %v", got, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("x-api-key", tokA)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d while another process holds the request", resp.StatusCode)
	}
	// The handler ends once it sees its client gone.
	for end := time.Now().Add(10 * time.Second); g.rc.waitedElsewhere.Load() != 1 || inFlight(g, k); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the waiter did not end with its client (waited %d)", g.rc.waitedElsewhere.Load())
		}
	}
	if err := other.Release(context.Background(), []cache.Key{k}, origin); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * claimPollMax)
	third := openCache(t, path).NewClaimer(time.Minute)
	defer third.Close()
	if got, err := third.Claim(context.Background(), time.Now(), []cache.Key{k}, origin); err != nil || len(got.Claimed) != 1 {
		t.Errorf("after the waiter left and the other released: %+v, %v (the waiter took the key)", got, err)
	}
	if got := run.Server.LedgerTotals().Requests; got != 0 {
		t.Errorf("billed %d, want 0", got)
	}
}

// inFlight reports whether g has a leader for k.
func inFlight(g *Gateway, k cache.Key) bool {
	g.rc.mu.Lock()
	defer g.rc.mu.Unlock()
	_, ok := g.rc.flights[k]
	return ok
}

// With the default per-client scope, two gateways on one file share a
// client's requests, never two clients': a's prompt sent to both at once
// is billed once, b's identical prompt once more.
func TestGatewayCacheTwoGatewaysKeepClientScope(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 50, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	_, srv1 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	_, srv2 := startGW(t, run, func(c *Config) { c.Cache = openCache(t, path) })
	var answers [4]gwAnswer
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, to := range []struct{ url, tok string }{{srv1.URL, tokA}, {srv2.URL, tokA}, {srv1.URL, tokB}, {srv2.URL, tokB}} {
		wg.Go(func() {
			<-start
			answers[i] = postMessage(t, to.url, to.tok, judgeBody(5, ""))
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if a.status != 200 {
			t.Fatalf("answer %d: %d %s", i, a.status, a.body)
		}
	}
	if !bytes.Equal(answers[0].body, answers[1].body) || !bytes.Equal(answers[2].body, answers[3].body) || bytes.Equal(answers[0].body, answers[2].body) {
		t.Errorf("a's two answers the same %v, b's the same %v, a's and b's differ %v",
			bytes.Equal(answers[0].body, answers[1].body), bytes.Equal(answers[2].body, answers[3].body), !bytes.Equal(answers[0].body, answers[2].body))
	}
	if got := run.Server.LedgerTotals().Requests; got != 2 {
		t.Errorf("billed %d, want 2 (one per client)", got)
	}
}

// A gateway whose request fails (a terminal 400, not cacheable) releases
// its claim at once: the other gateway waiting for the same request sends
// it then, long before the claim's lease would have ended.
func TestGatewayCacheFailureReleasesTheClaim(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	path := filepath.Join(t.TempDir(), "c.db")
	const lease = time.Minute
	ff := &failFirst{next: http.DefaultTransport, started: make(chan struct{}), release: make(chan struct{})}
	_, srv1 := startGW(t, run, func(c *Config) {
		c.Cache, c.CacheLease = openCache(t, path), lease
		c.HTTPClient = &http.Client{Transport: ff}
	})
	g2, srv2 := startGW(t, run, func(c *Config) { c.Cache, c.CacheLease = openCache(t, path), lease })
	var first, second gwAnswer
	var wg sync.WaitGroup
	wg.Go(func() { first = postMessage(t, srv1.URL, tokA, judgeBody(1, "")) })
	// The second is sent once the first has claimed the request and is
	// under way, and the first fails once the second waits for its claim
	// (a sleep of 50 ms for the one and 200 ms for the other raced a
	// loaded machine's scheduling).
	select {
	case <-ff.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never went upstream")
	}
	start := time.Now()
	wg.Go(func() { second = postMessage(t, srv2.URL, tokA, judgeBody(1, "")) })
	for end := time.Now().Add(10 * time.Second); g2.Status().Cache.WaitedElsewhere == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			close(ff.release)
			wg.Wait()
			t.Fatalf("the second gateway never waited for the first's claim: first %d, second %d", first.status, second.status)
		}
	}
	close(ff.release)
	wg.Wait()
	if first.status != 400 || second.status != 200 || second.header.Get(headerCached) == "true" {
		t.Fatalf("first %d, second %d cached=%q", first.status, second.status, second.header.Get(headerCached))
	}
	if took := time.Since(start); took > lease/4 {
		t.Errorf("the second waited %v: the failed claim was not released (lease %v)", took, lease)
	}
	if got, waited := run.Server.LedgerTotals().Requests, g2.Status().Cache.WaitedElsewhere; got != 1 || waited != 1 {
		t.Errorf("billed %d, the second gateway waited for the first %d times; want 1, 1", got, waited)
	}
}
