package dispatch_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/sim"
)

// tier1 is a tier-1-shaped org alone (50 RPM, 30,000 ITPM and 8,000 OTPM
// per API minute) whose buckets hold burst of a minute each: the API
// allows a burst smaller than a minute of the limit, and does not publish
// its size.
func tier1(burst float64) func(*sim.Config) {
	return func(c *sim.Config) {
		c.Orgs = []sim.OrgConfig{{Name: "tier1", ServiceCapacity: 120,
			Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 50, ITPM: 30_000, OTPM: 8_000}}}}
		c.BurstFraction = burst
		c.PromptCaching = false
	}
}

// stormKinds are the storms of issue 29: 500s, 529s, 429s with and
// without retry-after, connection resets and timeouts (requests that hang
// past the client's timeout), each on every request while it lasts.
func stormKinds() []sim.Fault {
	return []sim.Fault{
		{Kind: sim.FaultServerError},
		{Kind: sim.FaultOverloaded},
		{Kind: sim.FaultRateLimitStorm, RetryAfter: 2 * time.Second},
		{Kind: sim.FaultRateLimitStorm},
		{Kind: sim.FaultConnectionReset},
		{Kind: sim.FaultSlow, ExtraLatency: time.Hour},
	}
}

func stormName(f sim.Fault) string {
	if f.Kind == sim.FaultRateLimitStorm {
		if f.RetryAfter > 0 {
			return fmt.Sprintf("%s_retry_after_%s", f.Kind, f.RetryAfter)
		}
		return string(f.Kind) + "_no_retry_after"
	}
	return string(f.Kind)
}

// sendClock records, in the simulator's API time, when each request that
// was answered 200 went out (a transport wrapper: the engine's sending is
// what a lane's hold delays; the answer adds the server's own latency).
type sendClock struct {
	srv interface {
		Elapsed() (time.Duration, time.Duration)
	}
	mu   sync.Mutex
	sent []time.Duration
}

func (c *sendClock) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, at := c.srv.Elapsed()
		resp, err := rt.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusOK {
			c.mu.Lock()
			c.sent = append(c.sent, at)
			c.mu.Unlock()
		}
		return resp, err
	})
}

// firstAfter is the first send at or after end that was answered 200,
// from end (-1: none).
func (c *sendClock) firstAfter(end time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := time.Duration(-1)
	for _, at := range c.sent {
		if at >= end && (first < 0 || at-end < first) {
			first = at - end
		}
	}
	return first
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestRunRecoversWithinThreeSecondsOfAStorm is issue 29's second finding
// for 'run': whatever held or slowed a lane during a storm ends with the
// storm. A 20 API-second storm of each kind strikes a tier-1-shaped key
// (50 RPM, a bucket of 2 requests) 80 API s into a run. The lane must send
// again within 3 API s of the storm's end (the first request sent after
// it that is answered 200; measured in API time where it leaves the
// engine), and the minute from 3 s after its end must complete 0.9 of the
// limit. What holds it after the end is at most the storm's retry-after
// (2 s here), the lane's back-off without one (at most 1 s,
// gate.ProbeBackoffMax), or the key's own pace (a request every 1.2 s);
// the first answer comes the request's latency later (1-3 API s in the
// simulator, the server's time, not the lane's). Before issue 29's fixes
// the lane held up to 8 s after each 529 or 429 without retry-after, the
// colleague estimate read the quiet bucket's spilt refill as someone
// else's draw (2 completions a minute), and requests hung in a storm of
// timeouts kept the mirrors empty until they timed out; with a back-off
// of up to 2 s the probe after a storm went out up to 2 s after its end
// and the first answer came 3.5-4.6 API s after it.
func TestRunRecoversWithinThreeSecondsOfAStorm(t *testing.T) {
	// At speed 10 the 1 API s between the longest expected hold (the
	// retry-after) and the bound is 100 ms of wall time.
	const k, rpm = 10.0, 50.0
	const start, length, after, window = 80 * time.Second, 20 * time.Second, 3 * time.Second, 60 * time.Second
	const sendWithin = 3 * time.Second
	for _, f := range stormKinds() {
		t.Run(stormName(f), func(t *testing.T) {
			t.Parallel()
			// Enough items to keep the key busy to the window's end.
			h := newHarness(t, sim.PresetBuild3Org, k, 240, tier1(0.04))
			_, api0 := h.sim.Server.Elapsed()
			f.Start, f.Duration = api0+start, length
			if err := h.sim.Server.SetFaults(f); err != nil {
				t.Fatal(err)
			}
			end := api0 + start + length
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(float64(end+after+window+5*time.Second)/k))
			defer cancel()
			clock := &sendClock{srv: h.sim.Server}
			// The run is stopped once the window has passed.
			res, err := h.run(ctx, func(c *dispatch.Config) {
				c.Timeout = time.Duration(float64(30*time.Second) / k)
				c.WrapTransport = clock.wrap
			})
			if err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			var before, got int
			firstAnswer := time.Duration(-1) // the first answer after the storm, from its end
			for _, e := range h.sim.Server.Ledger() {
				at := time.Duration(e.APISeconds * float64(time.Second))
				if at >= end && firstAnswer < 0 {
					firstAnswer = at - end
				}
				switch {
				case at >= api0+start-window && at < api0+start:
					before++
				case at >= end+after && at < end+after+window:
					got++
				}
			}
			firstSend := clock.firstAfter(end)
			want := 0.9 * rpm * window.Minutes()
			st := h.sim.Server.Stats().Org("tier1")
			var lanes any
			if res != nil && res.Summary != nil {
				lanes = res.Summary.Lanes
			}
			t.Logf("sent again %.2f API s after the storm, answered %.2f API s after it; %d completions in the %s from %s after it (%d in the %s before it); 429s %d; lanes %+v",
				firstSend.Seconds(), firstAnswer.Seconds(), got, window, after, before, window, st.RateLimited429, lanes)
			if firstSend < 0 || firstSend > sendWithin {
				t.Errorf("the first request answered 200 after the storm went out %.2f API s after its end, want ≤ %s", firstSend.Seconds(), sendWithin)
			}
			if float64(got) < want {
				t.Errorf("%d completions in the %s from %s after the storm ended, want ≥ %.0f (0.9 of %.0f RPM)", got, window, after, want, rpm)
			}
		})
	}
}
