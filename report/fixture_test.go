package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/rundir"
)

// synth describes a synthetic but plausible run: lanes that start at a
// quarter of their cap and ramp up, complete in-flight work at cap/latency
// per second with some noise, and (when storm is set) meet a burst of 429s
// that cuts one lane's limit, holds it, and lets it recover additively.
type synth struct {
	orgs      []string // one lane per org, pool "sonnet"
	cap       int
	fixed     bool    // the legacy arm: in flight fixed at cap, no AIMD
	n         int     // items
	latency   float64 // mean seconds per request, measured time
	speed     float64 // the simulator's speed factor
	storm     [2]float64
	stormOrg  string
	colleague [2]float64 // colleagues seen on stormOrg during this window
	retryRate float64    // other retries per second (529s), on average
	costPer   float64    // USD per item
	seed      uint64
	laneStop  bool // stop the last lane half way with a lane event
	startTS   time.Time
}

// writeSynth writes events.jsonl and summary.json for s into dir and
// returns the summary.
func writeSynth(t testing.TB, dir string, s synth) rundir.Summary {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	ts := s.startTS
	if ts.IsZero() {
		ts = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	}
	emit := func(at float64, kind, note string, data any) {
		enc.Encode(rundir.Event{TS: ts.Add(time.Duration(at * float64(time.Second))), Kind: kind, Note: note, Data: data})
	}
	emit(0, rundir.EventStarted, "synthetic", map[string]any{"n": s.n, "base_url": "http://127.0.0.1:8080", "speed": s.speed})

	rng := rand.New(rand.NewPCG(s.seed, 7))
	type lane struct {
		org                   string
		limit                 float64
		cuts                  int
		held                  float64
		heldS                 float64
		maxIn                 int
		done                  int64
		stopped               string
		othersSeen            int
		inflight              int
		succeeded, erroredCnt int64
	}
	lanes := make([]*lane, len(s.orgs))
	for i, o := range s.orgs {
		l := &lane{org: o, limit: float64(s.cap)}
		if !s.fixed {
			l.limit = float64(s.cap) / 4
		}
		lanes[i] = l
	}
	var done, r429, retries int64
	var cost float64
	var latSum float64
	tm := 0.0
	dt := 1.0
	cutThisStorm := false
	for done < int64(s.n) {
		tm += dt
		remaining := int64(s.n) - done
		byOrg := map[string]int64{}
		var snaps []gate.LaneSnapshot
		inStorm := tm >= s.storm[0] && tm < s.storm[1]
		for i, l := range lanes {
			if s.laneStop && i == len(lanes)-1 && l.stopped == "" && float64(done) > float64(s.n)/2 {
				l.stopped = "401 authentication_error: invalid x-api-key"
				emit(tm, rundir.EventLane, l.org+"/sonnet stopped: "+l.stopped, nil)
			}
			if l.stopped != "" {
				l.inflight = 0
				byOrg[l.org] += 0
				snaps = append(snaps, gate.LaneSnapshot{Org: l.org, Pool: "sonnet", Cap: s.cap, Limit: l.limit, MaxInFlight: l.maxIn, Cuts: l.cuts, HeldS: l.heldS, Disabled: l.stopped})
				continue
			}
			held := l.held > 0
			if held {
				l.held -= dt
				l.heldS += dt
			}
			if !s.fixed {
				switch {
				case inStorm && l.org == s.stormOrg && !cutThisStorm:
					l.limit = math.Max(1, l.limit*0.5)
					l.cuts++
					l.held = 3
					cutThisStorm = true
				case l.cuts == 0:
					l.limit = math.Min(float64(s.cap), l.limit+float64(s.cap)/8)
				default:
					l.limit = math.Min(float64(s.cap), l.limit+math.Max(1, float64(s.cap)/50))
				}
			}
			if !inStorm {
				cutThisStorm = false
			}
			want := int(l.limit)
			if held {
				want = 0
			}
			l.inflight = int(math.Min(float64(want), float64(remaining)))
			l.maxIn = max(l.maxIn, l.inflight)
			rate := float64(l.inflight) / s.latency
			c := int64(math.Max(0, math.Round(rate*dt*(1+0.12*rng.NormFloat64()))))
			if c == 0 && l.inflight > 0 && remaining <= int64(l.inflight) {
				c = 1 // the tail: the last few requests do finish
			}
			c = min(c, remaining)
			remaining -= c
			done += c
			l.done += c
			l.succeeded += c
			byOrg[l.org] += c
			latSum += float64(c) * s.latency
			others := tm >= s.colleague[0] && tm < s.colleague[1] && l.org == s.stormOrg
			if others {
				l.othersSeen++
			}
			snaps = append(snaps, gate.LaneSnapshot{Org: l.org, Pool: "sonnet", Cap: s.cap, Limit: math.Round(l.limit*10) / 10,
				InFlight: l.inflight, MaxInFlight: l.maxIn, Cuts: l.cuts, HeldS: l.heldS, Held: held, Others: others, OthersSeen: l.othersSeen})
			cost += float64(c) * s.costPer
		}
		if inStorm {
			r429 += int64(8 + rng.IntN(20))
		}
		if s.retryRate > 0 && rng.Float64() < s.retryRate {
			retries += int64(1 + rng.IntN(3))
		}
		inFlight := 0
		for _, l := range lanes {
			inFlight += l.inflight
		}
		emit(tm, rundir.EventSample, "", map[string]any{
			"t_s": tm, "dt_s": dt, "completed_by_org": byOrg, "lanes": snaps,
			"rate_limited_429": r429, "retries": retries, "cost_usd": cost, "in_flight": inFlight,
		})
		if tm > 100000 {
			t.Fatal("synthetic run does not finish")
		}
	}
	sum := rundir.Summary{
		N: int64(s.n), Succeeded: int64(s.n), ErroredByType: map[string]int64{},
		DataLoss: rundir.DataLoss{Inputs: int64(s.n), Outcomes: int64(s.n), Passed: true},
		Cost:     rundir.CostUSD{Total: cost, ByOrg: map[string]float64{}},
		Attempts: int64(s.n) + r429 + retries, RateLimited429: r429, Overloaded529: retries,
		LatencyMs:      rundir.Latency{P50: int64(s.latency * 1000 * s.speed * 0.9), P95: int64(s.latency * 1000 * s.speed * 1.8), P99: int64(s.latency * 1000 * s.speed * 2.6)},
		RequestsPerMin: float64(s.n) / tm * 60, CompletedThisRun: int64(s.n), WallS: tm, Speed: s.speed,
		APIEquivalentWallS: tm * s.speed, ByOrg: map[string]rundir.OrgSplit{},
	}
	for _, l := range lanes {
		c := float64(l.done) * s.costPer
		sum.Cost.ByOrg[l.org] = c
		sum.ByOrg[l.org] = rundir.OrgSplit{Succeeded: l.succeeded, CostUSD: c, Key: fingerprints[l.org]}
		sum.Lanes = append(sum.Lanes, gate.LaneSnapshot{Org: l.org, Pool: "sonnet", Cap: s.cap, Limit: l.limit, MaxInFlight: l.maxIn, Cuts: l.cuts, HeldS: l.heldS, OthersSeen: l.othersSeen, Disabled: l.stopped})
	}
	emit(tm, rundir.EventCompleted, fmt.Sprintf("%d succeeded, %d errored", sum.Succeeded, sum.Errored), sum)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(dir, "summary.json"), sum)
	return sum
}

// fingerprints are made-up key fingerprints of the fixture's orgs.
var fingerprints = map[string]string{"high_prio": "b94495b5", "batch": "3fa9c2d1", "low_prio": "af04cd8f"}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// abFixture writes a plausible A/B directory at N items, simulated at
// the given speed factor with a 2-second API latency: the legacy arm on one
// org at 50 in flight, the dispatcher over three orgs at a cap of 100, with
// a 429 storm on one org.
func abFixture(t testing.TB, dir string, n int, speed float64) (base, disp rundir.Summary) {
	t.Helper()
	base = writeSynth(t, filepath.Join(dir, "baseline"), synth{
		orgs: []string{"high_prio"}, cap: 50, fixed: true, n: n, latency: 2.0 / speed, speed: speed,
		retryRate: 0.08, costPer: 0.00213, seed: 1,
	})
	disp = writeSynth(t, filepath.Join(dir, "dispatcher"), synth{
		orgs: []string{"batch", "high_prio", "low_prio"}, cap: 100, n: n, latency: 2.0 / speed, speed: speed,
		storm: [2]float64{14, 17}, stormOrg: "low_prio", colleague: [2]float64{20, 32}, retryRate: 0.15, costPer: 0.00213, seed: 2,
	})
	arm := func(s rundir.Summary) map[string]any {
		return map[string]any{
			"wall_s": s.WallS, "api_equivalent_wall_s": s.APIEquivalentWallS, "cost_usd": s.Cost.Total, "ledger_cost_usd": s.Cost.Total,
			"requests_per_min": s.RequestsPerMin, "succeeded": s.Succeeded, "errored": s.Errored, "unfinished": s.Unfinished,
			"rate_limited_429": s.RateLimited429, "latency_ms": s.LatencyMs, "by_org": s.ByOrg, "data_loss": s.DataLoss,
		}
	}
	perArm := 0.00213 * float64(n)
	writeJSON(t, filepath.Join(dir, "ab.json"), map[string]any{
		"speedup": base.WallS / disp.WallS, "target_met": base.WallS/disp.WallS >= 5, "simulated": true, "speed_factor": speed,
		"n": n, "model": "claude-sonnet-4-5-20250929",
		"projected_cost_usd": map[string]any{"per_arm": perArm, "total": 2 * perArm},
		"arms":               map[string]any{"baseline": arm(base), "dispatcher": arm(disp)},
	})
	return base, disp
}
