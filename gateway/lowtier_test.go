package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/sim"
)

// smallKey is issue 29's probe: one org whose key allows 30 requests per
// API minute from a bucket of 3 (a tenth of a minute: the API allows a
// burst smaller than a minute of the limit and does not publish it), each
// answered in 0.1 API s.
func smallKey(c *sim.Config) {
	c.Orgs = []sim.OrgConfig{{Name: "small", ServiceCapacity: 120,
		Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: {RPM: 30, ITPM: 30_000, OTPM: 8_000}}}}
	c.BurstFraction = 0.1
	c.Latency = sim.LatencyConfig{TTFT: 100 * time.Millisecond}
	c.PromptCaching = false
}

// shortParams is a small request whose answer stays well inside the
// key's token buckets.
func shortParams(i int) sdk.MessageNewParams {
	p := judgeParams(i)
	p.MaxTokens = 64
	return p
}

// timed sends p through c and returns how long it took in API seconds at
// speed k and the gateway's attempts header.
func timed(ctx context.Context, c sdk.Client, p sdk.MessageNewParams, k float64) (float64, string, error) {
	var raw *http.Response
	start := time.Now()
	_, err := c.Messages.New(ctx, p, option.WithResponseInto(&raw))
	took := time.Since(start).Seconds() * k
	attempts := ""
	if raw != nil {
		attempts = raw.Header.Get(headerAttempts)
	}
	return took, attempts, err
}

// roundTrip is how long, in API seconds at speed k, a count_tokens request
// takes through c now: the machine's own time for a request through the
// client, the gateway and the simulator, which no lane paces or holds
// (the simulator answers it at once). A loaded machine under -race takes
// up to 0.8 s of real time for it, many API seconds at the speeds here;
// the bounds below allow what it measures.
func roundTrip(t *testing.T, c sdk.Client, k float64) float64 {
	t.Helper()
	start := time.Now()
	if _, err := c.Messages.CountTokens(context.Background(), sdk.MessageCountTokensParams{Model: "claude-sonnet-4-5",
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("How long does a request take?"))}}); err != nil {
		t.Fatalf("count_tokens: %v", err)
	}
	return time.Since(start).Seconds() * k
}

// TestServeUsesASmallBurstKey is issue 29's first finding through 'serve':
// on a key of 30 RPM whose bucket holds 3, 8 sequential requests took
// 165 s; the key allows them in about 12 s (3 at once, then one every
// 2 s). The lane read the bucket's small size as someone else drawing on
// it and paced at 6 a minute.
func TestServeUsesASmallBurstKey(t *testing.T) {
	const k = 10
	run, _ := simtest.Start(t, sim.PresetBuild3Org, k, smallKey)
	g, srv := startGW(t, run, nil)
	c := sdkClient(srv.URL, tokA)
	// Stop well before the old pace (165 API s) would end.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(float64(100*time.Second)/k))
	defer cancel()
	var total, burst float64
	var each []string
	for i := range 8 {
		took, attempts, err := timed(ctx, c, shortParams(i), k)
		total += took
		if i < 3 {
			burst += took
		}
		each = append(each, fmt.Sprintf("%.1f", took))
		if err != nil {
			t.Fatalf("request %d after %.1f API s (each %v): %v; lanes %+v", i+1, total, each, err, g.lanes.snapshots(time.Now()))
		}
		if attempts != "1" {
			t.Errorf("request %d: %s attempts, want 1", i+1, attempts)
		}
	}
	t.Logf("8 requests in %.1f API s (each %v); lanes %+v", total, each, g.lanes.snapshots(time.Now()))
	// The bucket's 3 are sent at once, the other 5 one every 2 API s: about
	// 10.5 API s, and each request's own time through the SDK, the
	// gateway and the simulator on top. That is 0.1-0.2 API s alone, but
	// a loaded machine under -race took 0.45-0.77 s of real time for each
	// of the first three (4.5-7.7 API s here) and 21.7 API s for four. The
	// first three are not paced: their mean is what a request takes on this
	// machine now, and the bound allows it for each of the 8 beyond half a
	// second. The old pace (one every 10 API s) stays far outside it:
	// 50 API s for the last five alone.
	own := burst / 3
	if limit := 15 + 8*max(0, own-0.5); total > limit {
		t.Errorf("8 requests took %.1f API s, want ≤ %.1f (the key allows them in about 12; the first three took %.1f API s each)", total, limit, own)
	}
	for _, l := range g.lanes.snapshots(time.Now()) {
		if l.OthersSeen != 0 {
			t.Errorf("lane %s/%s saw others %d times on a key alone", l.Org, l.Pool, l.OthersSeen)
		}
	}
}

// TestServeAnswersAtOnceAfterAStorm is issue 29's second finding through
// 'serve': after a 20 s storm, every request took 31 s with one attempt,
// each answered upstream in 0.12 s. A request rides each kind of storm out
// inside the gateway; once the storm has ended, two clean requests in a
// row must each be answered within 3 API seconds, at the first attempt.
func TestServeAnswersAtOnceAfterAStorm(t *testing.T) {
	// The lane may hold up to 2 API s past the storm's last answer (its
	// longest back-off), so a clean request takes up to about 2.2 s by
	// design; at K=5 the 0.8 s left to the bound is 160 ms of real time
	// (at K=10 one took 2.54 s), and a loaded machine under -race takes
	// up to 0.8 s of real time for a request through the gateway (4 API
	// s). Each clean request is allowed what a count_tokens request
	// through the same client and gateway takes just before and after it;
	// the defect this pins held each for 31 API s.
	const k = 5
	const storm = 20 * time.Second
	for _, f := range []sim.Fault{
		{Kind: sim.FaultServerError},
		{Kind: sim.FaultOverloaded},
		// A retry-after is honoured: one of 1 s leaves the 3 s bound
		// room for a loaded machine.
		{Kind: sim.FaultRateLimitStorm, RetryAfter: time.Second},
		{Kind: sim.FaultRateLimitStorm},
		{Kind: sim.FaultConnectionReset},
		{Kind: sim.FaultSlow, ExtraLatency: time.Hour},
	} {
		name := string(f.Kind)
		switch {
		case f.Kind == sim.FaultRateLimitStorm && f.RetryAfter > 0:
			name = fmt.Sprintf("%s_retry_after_%s", f.Kind, f.RetryAfter)
		case f.Kind == sim.FaultRateLimitStorm:
			name += "_no_retry_after"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run, _ := simtest.Start(t, sim.PresetBuild3Org, k, smallKey)
			// An attempt times out after 10 API s (the storm of timeouts).
			g, srv := startGW(t, run, func(c *Config) { c.Timeout = time.Duration(float64(10*time.Second) / k) })
			c := sdkClient(srv.URL, tokA)
			ctx := context.Background()
			if _, _, err := timed(ctx, c, shortParams(0), k); err != nil {
				t.Fatal(err)
			}
			f.FromNow, f.Duration = true, storm
			_, from := run.Server.Elapsed()
			if _, err := run.Server.AddFault(f); err != nil {
				t.Fatal(err)
			}
			end := from + storm
			var wg sync.WaitGroup
			var rode float64
			var rodeAttempts string
			var rodeErr error
			wg.Go(func() { rode, rodeAttempts, rodeErr = timed(ctx, c, shortParams(1), k) })
			for {
				if _, now := run.Server.Elapsed(); now > end+100*time.Millisecond {
					break
				}
				time.Sleep(time.Millisecond)
			}
			for i := range 2 {
				// The machine's own time for a request, measured just
				// before and after the clean one, is allowed on top of
				// the bound.
				before := roundTrip(t, c, k)
				took, attempts, err := timed(ctx, c, shortParams(2+i), k)
				if err != nil {
					t.Fatalf("clean request %d: %v", i+1, err)
				}
				own := max(before, roundTrip(t, c, k))
				t.Logf("clean request %d after the storm: %.2f API s, %s attempt(s); a request through the gateway alone %.2f API s", i+1, took, attempts, own)
				if took > 3+own || attempts != "1" {
					t.Errorf("clean request %d after the storm took %.2f API s with %s attempt(s), want ≤ 3 s and what a request takes on this machine now (%.2f s) at the first; lanes %+v",
						i+1, took, attempts, own, g.lanes.snapshots(time.Now()))
				}
			}
			wg.Wait()
			if rodeErr != nil {
				t.Fatalf("the request sent into the storm: %v", rodeErr)
			}
			t.Logf("the request sent into the storm rode it out in %.1f API s, %s attempts", rode, rodeAttempts)
		})
	}
}
