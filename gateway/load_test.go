package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// loadThrough sends n judge requests at concurrency conc through the
// gateway (client SDK retries off) and returns how many were not 200.
func loadThrough(t *testing.T, url string, n, conc int) (failed int64) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}}
	c := sdkClient(url, tokA, option.WithHTTPClient(hc))
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	defer func() {
		w := time.Since(t0)
		t.Logf("%d requests at concurrency %d: %d not 200, %.2f s, %.0f requests/s", n, conc, failed, w.Seconds(), float64(n)/w.Seconds())
	}()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if _, err := c.Messages.New(context.Background(), judgeParams(int(i))); err != nil {
					if atomic.AddInt64(&failed, 1) <= 3 {
						t.Errorf("request %d: %v", i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	return failed
}

// checkPolite asserts the simulator never saw more than the cap in flight
// on a key, and that every org took part.
func checkPolite(t *testing.T, run *sim.Running) {
	t.Helper()
	capN := int64(dispatch.DefaultCaps["sonnet"])
	for _, o := range run.Server.Stats().Orgs {
		if o.MaxInFlight > capN {
			t.Errorf("org %s: %d in flight, cap %d", o.Name, o.MaxInFlight, capN)
		}
		if o.Completions == 0 {
			t.Errorf("org %s unused", o.Name)
		}
		t.Logf("org %s: %d completions, max in flight %d (cap %d), %d 429s absorbed by the gateway", o.Name, o.Completions, o.MaxInFlight, capN, o.RateLimited429)
	}
}

// 3,000 requests at concurrency 500 from one client: all 200, never above
// the cap in flight on a key, every org used.
func TestLoad3000AtConcurrency500(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	_, srv := startGW(t, run, nil)
	if f := loadThrough(t, srv.URL, 3000, 500); f != 0 {
		t.Errorf("%d requests failed", f)
	}
	checkPolite(t, run)
}

// The same under a 429 storm on every org shorter than --retry-for: the
// client still sees no 429. The storm (300 API seconds, 3 s here) begins
// once the simulator has billed the load's first request, so it strikes
// the load however slowly a loaded machine starts it (begun with the test,
// it was over before the load came, and no 429 was sent).
func TestLoadThroughA429Storm(t *testing.T) {
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 100, nil)
	_, srv := startGW(t, run, nil)
	stop := make(chan struct{})
	added := make(chan error, 1)
	go func() {
		for run.Server.Mark() == 0 {
			select {
			case <-stop:
				added <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		_, err := run.Server.AddFault(sim.Fault{ID: "storm", Kind: sim.FaultRateLimitStorm, FromNow: true, Duration: 300 * time.Second, RetryAfter: 5 * time.Second})
		added <- err
	}()
	f := loadThrough(t, srv.URL, 3000, 500)
	close(stop)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if f != 0 {
		t.Errorf("%d requests failed", f)
	}
	var s429 int64
	for _, o := range run.Server.Stats().Orgs {
		s429 += o.RateLimited429
	}
	if s429 == 0 {
		t.Error("the storm sent no 429: the test proves nothing")
	}
	checkPolite(t, run)
}
