package gateway

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// A gateway's first requests that hang do not hold its lanes: gateway
// campaign seed 53, where a gateway restarted while the API was slow (+5m50s
// on 41 % of requests) sent nothing for 32 real seconds with requests
// waiting. Each lane sent one request until its first answer (its buckets
// unknown), and a key whose organisation was not known yet sent one and
// counted against every organisation's cap, so three hung first requests
// held every lane. Now each key's organisation is learnt from a request of
// its own (upstream.Orgs.Discover), and a lane whose first request is out
// past gate.FirstAnswerWait sends one more.
//
// Here every org's first request hangs for 20 real seconds (a slow fault
// on the API's first 2 s); the other 27 requests must be answered long
// before that: at least 20 of them within 10 real seconds. Before the
// change none was.
func TestFirstRequestsThatHangDoNotHoldTheLanes(t *testing.T) {
	t.Parallel()
	const speed = 10
	const hang = 200 * time.Second // API time: 20 real seconds
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, speed, func(c *sim.Config) {
		c.Faults = append(c.Faults, sim.Fault{Kind: sim.FaultSlow, Start: 0, Duration: 2 * time.Second, ExtraLatency: hang})
	})
	g, srv := startGW(t, run, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 30
	var answered atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			if postUntil(ctx, t, srv.URL, judgeBody(i, "")) == http.StatusOK {
				answered.Add(1)
			}
		})
	}
	const want, within = 20, 10 * time.Second
	for time.Since(start) < within && answered.Load() < want {
		time.Sleep(20 * time.Millisecond)
	}
	got, took := answered.Load(), time.Since(start)
	g.Abort() // the hung requests: not waited for
	cancel()
	wg.Wait()
	t.Logf("%d of %d requests answered in %v while each org's first hung for %v", got, n, took.Round(time.Millisecond), hang/speed)
	if got < want {
		t.Errorf("%d requests answered within %v, want ≥ %d: the hung first requests held the lanes", got, within, want)
	}
}

// postUntil posts body to url's Messages endpoint as client a until ctx
// ends; it returns the answer's status, 0 when none came.
func postUntil(ctx context.Context, t *testing.T, url string, body []byte) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("x-api-key", tokA)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0 // cancelled: a request still held
	}
	resp.Body.Close()
	return resp.StatusCode
}
