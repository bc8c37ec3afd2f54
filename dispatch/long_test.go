//go:build long

package dispatch_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// TestStormLosesNothing pins docs/design.md §23: under a sustained 429 storm on
// every org (five minutes of server time, in the middle of the run, with and
// without retry-after), every item still succeeds exactly once.
func TestStormLosesNothing(t *testing.T) {
	t.Parallel()
	for _, ra := range []time.Duration{5 * time.Second, 0} {
		t.Run("retry-after="+ra.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, sim.PresetOrigin3Org, 100, 2000, nil)
			h.faults = []sim.Fault{{ID: "storm", Kind: sim.FaultRateLimitStorm, Start: 4 * time.Second, Duration: 5 * time.Minute, RetryAfter: ra}}
			res, err := h.run(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			if s.Succeeded != 2000 || s.Errored != 0 || !s.DataLoss.Passed {
				t.Fatalf("summary after storm: succeeded %d errored %d %+v", s.Succeeded, s.Errored, s.DataLoss)
			}
			if s.RateLimited429 == 0 || s.APIEquivalentWallS < 300 {
				t.Fatalf("the storm did not hold the run (429s %d, %.0f API-s): the test proves nothing", s.RateLimited429, s.APIEquivalentWallS)
			}
			h.requireEachOnce(2000)
			t.Logf("429s %d over %d attempts; %.0f API-seconds", s.RateLimited429, s.Attempts, s.APIEquivalentWallS)
		})
	}
}

func TestPoliteWhenAColleagueSharesTheOrg(t *testing.T) {
	for _, c := range []politeCase{politeCases[0], politeCases[1], politeCases[2]} {
		t.Run(c.name, func(t *testing.T) {
			r := runPolite(t, c, 600, politeTestSpeed())
			t.Logf("%v", r)
			if r.lost != 0 {
				t.Errorf("lost %d items", r.lost)
			}
			for o, rate := range r.rate429 {
				if rate > 0.03 {
					t.Errorf("org %s: 429s %.1f%% of %d attempts, want ≤ 3%%", o, rate*100, r.attempts[o])
				}
			}
			if r.refused > 0.03 {
				t.Errorf("the colleague's draws refused %.1f%%, want ≤ 3%%", r.refused*100)
			}
			if r.throughput < 0.8 {
				t.Errorf("throughput %.2f of what the buckets leave, want ≥ 0.8", r.throughput)
			}
		})
	}
}

// TestPoliteWhenThreeSharedProcessesShareTheOrg is the same for three
// processes on the same keys with --shared, started 3 API seconds apart
// (issue 22): together they must be no ruder than one. A process joining
// others mirrored its share of the buckets while the others still mirrored
// theirs as before it came, and together they believed the buckets held
// more than they did: 5-22 % 429s per org in the first 20 API seconds.
func TestPoliteWhenThreeSharedProcessesShareTheOrg(t *testing.T) {
	c := politeCases[5]
	r := runPolite(t, c, 600, politeTestSpeed())
	t.Logf("%v", r)
	if r.lost != 0 {
		t.Errorf("lost %d items", r.lost)
	}
	// Issue 22 states this case's 429s combined over the orgs; per org the
	// -race build on a loaded machine has shown 4.7 % on one org (1.8 %
	// combined), so per org the bound is wider there. The code before the
	// shared fixes gave 5.5-10 % on one org and 3.9-8.6 % on the others.
	var n429, attempts float64
	perOrg := 0.03
	if raceBuild {
		perOrg = 0.08
	}
	for o, rate := range r.rate429 {
		n429 += rate * float64(r.attempts[o])
		attempts += float64(r.attempts[o])
		if rate > perOrg {
			t.Errorf("org %s: 429s %.1f%% of %d attempts, want ≤ %.0f%%", o, rate*100, r.attempts[o], perOrg*100)
		}
	}
	if attempts == 0 || n429/attempts > 0.03 {
		t.Errorf("429s %.0f of %.0f attempts over the orgs, want ≤ 3%%", n429, attempts)
	}
	if r.refused > 0.03 {
		t.Errorf("the colleague's draws refused %.1f%%, want ≤ 3%%", r.refused*100)
	}
	if r.throughput < 0.8 {
		t.Errorf("throughput %.2f of what the buckets leave, want ≥ 0.8", r.throughput)
	}
}

func TestCacheHalfOverlapSendsTheOtherHalf(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 50, 1, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	lines := judgeLines(t, 800, workload.GenOptions{})
	dir := filepath.Dir(h.dir)
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	writeLines(t, a, lines[:400])
	writeLines(t, b, lines[200:600]) // 200 of A's, 200 new
	h.runInto(a, "a", c, nil)
	sent := h.sim.Server.LedgerTotals().Requests
	// plan projects only the misses.
	ws, err := rundir.Validate(b, cost.Default())
	if err != nil {
		t.Fatal(err)
	}
	ph, err := plan.ProjectCache(context.Background(), b, ws, c, cache.ModeReadWrite, false, mustOrigin(t, h.sim.URL))
	if err != nil || ph.Hits != 200 || ph.Misses.N != 200 || ph.Misses.Models[workload.DefaultModel].N != 200 || ph.Saved <= 0 {
		t.Fatalf("ProjectCache: %+v, %v", ph, err)
	}
	s := h.runInto(b, "b", c, nil)
	if d := h.sim.Server.LedgerTotals().Requests - sent; d != 200 {
		t.Fatalf("the overlapping input sent %d requests, want exactly 200", d)
	}
	if s.Cache.Hits != 200 || s.Cache.Misses != 200 || s.Succeeded != 400 {
		t.Fatalf("cache summary %+v, %d succeeded", s.Cache, s.Succeeded)
	}
}

// TestFaultMatrix: every fault alone, then all together.
func TestFaultMatrix(t *testing.T) { faultMatrix(t, faultCases()) }
