package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
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
