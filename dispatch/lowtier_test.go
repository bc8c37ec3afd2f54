package dispatch_test

import (
	"context"
	"fmt"
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

// TestRunUsesASmallBurstKeyAlone is issue 29's first finding for 'run': on
// a key alone whose request bucket holds 5 (a tenth of its 50 RPM), the
// mirrors took the bucket for a minute of the limit, refilled past the
// server's, and read the refill the server spilt as a colleague drawing on
// the org: the lane kept a colleague's reserve and paced at a fraction of
// the limit (200 requests at 1.6 RPM, 0.03 of the limit). It must reach
// 0.9 of the limit over the run, without a 429 and without seeing others.
func TestRunUsesASmallBurstKeyAlone(t *testing.T) {
	const n, k, rpm = 200, 20.0, 50.0
	h := newHarness(t, sim.PresetBuild3Org, k, n, tier1(0.1))
	// At 0.9 of the limit the run takes n/(0.9 × rpm) API minutes; give
	// it half as long again before calling it too slow.
	budget := time.Duration(1.5 * n / (0.9 * rpm) * float64(time.Minute) / k)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	_, api0 := h.sim.Server.Elapsed()
	res, err := h.run(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := h.sim.Server.Stats().Org("tier1")
	led := h.sim.Server.Ledger()
	if len(led) != n || res.Summary.Succeeded != n {
		t.Fatalf("%d billed, %d succeeded of %d within %s (API %s): the lane paced far below the limit (lanes %+v)",
			len(led), res.Summary.Succeeded, n, budget, time.Duration(float64(budget)*k), res.Summary.Lanes)
	}
	// The lane's pace is measured from the run's first answer (its probe's):
	// the process's start before it (opening the run directory, reading
	// the input) is not the lane's, and took up to 15 API s (0.75 s) on
	// a loaded machine under -race.
	t0 := led[0].APISeconds
	took := led[len(led)-1].APISeconds - t0
	rate := (n - 1) / took * 60
	first := 0 // completed in the first API minute after the first answer
	for _, e := range led {
		if e.APISeconds-t0 < 60 {
			first++
		}
	}
	startup := t0 - api0.Seconds()
	t.Logf("%d requests in %.1f API s from the first answer (%.1f API s after the run began): %.1f RPM of %.0f, %d in the first minute; %d 429s; lanes %+v",
		n, took, startup, rate, rpm, first, st.RateLimited429, res.Summary.Lanes)
	if rate < 0.9*rpm {
		t.Errorf("%.1f RPM, want ≥ 0.9 of the limit (%.0f)", rate, 0.9*rpm)
	}
	if float64(first) < 0.9*rpm {
		t.Errorf("%d completed in the first API minute, want ≥ 0.9 of the limit (%.0f)", first, 0.9*rpm)
	}
	if st.RateLimited429 != 0 {
		t.Errorf("%d 429s, want none", st.RateLimited429)
	}
	for _, l := range res.Summary.Lanes {
		if l.OthersSeen != 0 {
			t.Errorf("lane %s/%s saw others %d times on a key alone", l.Org, l.Pool, l.OthersSeen)
		}
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

// TestRunRecoversWithinThreeSecondsOfAStorm is issue 29's second finding
// for 'run': whatever held or slowed a lane during a storm ends with the
// storm. A 20 API-second storm of each kind strikes a tier-1-shaped key
// (50 RPM, a bucket of 2 requests) two minutes into a run. The first
// request after it must be answered within 5 API s of its end (the lane's
// longest hold through a storm, 2 s, then the probe's answer, about a
// second: 1.2-3.5 s measured), and the minute from 3 s after its end must
// complete 0.9 of the limit (48 of 50 measured). Before the fix the lane
// held up to 8 s after each 529 or 429 without retry-after, its back-off
// growing per answer (the first answer 7.4-7.7 s after the storm), the
// colleague estimate read the quiet bucket's spilt refill as someone
// else's draw (2 completions a minute), and requests hung in a storm of
// timeouts kept the mirrors empty until they timed out.
func TestRunRecoversWithinThreeSecondsOfAStorm(t *testing.T) {
	const k, rpm = 20.0, 50.0
	const start, length, after, window = 120 * time.Second, 20 * time.Second, 3 * time.Second, 60 * time.Second
	const firstWithin = 5 * time.Second
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
			// The run is stopped once the window has passed.
			res, err := h.run(ctx, func(c *dispatch.Config) { c.Timeout = time.Duration(float64(30*time.Second) / k) })
			if err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			var before, got int
			firstAfter := time.Duration(-1) // the first answer after the storm, from its end
			for _, e := range h.sim.Server.Ledger() {
				at := time.Duration(e.APISeconds * float64(time.Second))
				if at >= end && firstAfter < 0 {
					firstAfter = at - end
				}
				switch {
				case at >= api0+start-window && at < api0+start:
					before++
				case at >= end+after && at < end+after+window:
					got++
				}
			}
			want := 0.9 * rpm * window.Minutes()
			st := h.sim.Server.Stats().Org("tier1")
			var lanes any
			if res != nil && res.Summary != nil {
				lanes = res.Summary.Lanes
			}
			t.Logf("the first answer %.2f API s after the storm; %d completions in the %s from %s after it (%d in the %s before it); 429s %d; lanes %+v",
				firstAfter.Seconds(), got, window, after, before, window, st.RateLimited429, lanes)
			if firstAfter < 0 || firstAfter > firstWithin {
				t.Errorf("the first answer after the storm came %.2f API s after its end, want ≤ %s", firstAfter.Seconds(), firstWithin)
			}
			if float64(got) < want {
				t.Errorf("%d completions in the %s from %s after the storm ended, want ≥ %.0f (0.9 of %.0f RPM)", got, window, after, want, rpm)
			}
		})
	}
}
