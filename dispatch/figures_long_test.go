//go:build long

package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

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

// Issue 29's done-means for 'run': 3,000 judge requests with a
// 4,000-token cached rubric over three orgs cost at most 1.05× the same
// requests through one org. (Measured at 1.0033× on the code before
// cache-affine placement too: at full load every org stays warm, so this
// guards the figure rather than pinning a bug; the documents test does.)
// The rate against the cap-bound ceiling is BenchmarkPromptCacheThreeOrgs'.
//
// Not parallel: its 6,000 requests of 14 KB would starve the timed fault
// windows of the parallel tests on a small machine.
func TestRunPromptCacheThreeOrgsCostLikeOne(t *testing.T) {
	const n = 3000
	one, _ := judgeRubricRun(t, n, 20, []string{"high_prio"}, false)
	three, _ := judgeRubricRun(t, n, 20, nil, false)
	ratio := float64(three.costN) / float64(one.costN)
	t.Logf("one org: %d writes, %d reads, $%.4f; three orgs: %d writes, %d reads, $%.4f (%.4f×)",
		one.writes, one.reads, float64(one.costN)/1e9, three.writes, three.reads, float64(three.costN)/1e9, ratio)
	if ratio > 1.05 {
		t.Errorf("three orgs cost %.4f× one org's, want ≤ 1.05×", ratio)
	}
}
