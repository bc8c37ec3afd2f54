package campaign

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Issue 29's draws: low-tier limits and storms of every kind, and the
// liveness invariant. They come from a random stream of their own, so the
// seeds' other draws are those they always were.

// tier1 is a tier-1 org's limits per API minute, for every pool.
var tier1 = sim.Limits{RPM: 50, ITPM: 30_000, OTPM: 8_000}

// stormKinds are the storms the campaign draws: every request fails while
// one lasts (a probability of 1), in each way the API fails. A storm of
// slow answers keeps its requests in flight long past their latency, as
// timeouts do (the run's attempt timeout is 10 API minutes).
var stormKinds = []sim.FaultKind{
	sim.FaultServerError, sim.FaultServerErrorHTML, sim.FaultOverloaded,
	sim.FaultRateLimitStorm, sim.FaultConnectionReset, sim.FaultTruncatedBody, sim.FaultSlow,
}

// drawLowTier adds issue 29's options to s: a third of the seeds run on
// tier-1 orgs whose buckets hold a small burst (5 % to 30 % of a minute),
// with at least lowTierItems items per process so that the run outlasts a
// storm; and half of the seeds meet a storm of one kind, on every org or
// on one, that ends within the first 50 API seconds (a run on tier-1 orgs
// lasts about 100 or more), leaving the liveness check a window.
func drawLowTier(seed int64, s *Scenario) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x10e7_1e25_2029))
	if r.IntN(3) == 0 {
		s.LowTier = true
		s.Burst = 0.05 + 0.25*r.Float64()
		s.Items = max(s.Items, lowTierItems)
	}
	if r.IntN(2) == 0 {
		f := sim.Fault{Kind: stormKinds[r.IntN(len(stormKinds))], Probability: 1,
			Start: time.Duration(5+r.IntN(20)) * time.Second, Duration: time.Duration(10+r.IntN(16)) * time.Second}
		switch f.Kind {
		case sim.FaultRateLimitStorm:
			f.RetryAfter = time.Duration(r.IntN(3)) * time.Second
		case sim.FaultSlow:
			f.ExtraLatency = time.Duration(20+r.IntN(40)) * time.Second
		}
		if r.IntN(2) == 0 {
			f.Org = orgNames[r.IntN(len(orgNames))]
		}
		s.Faults = append(s.Faults, f)
	}
}

// lowTierItems is the fewest items per process on tier-1 orgs: about 100
// API s at 50 requests a minute on each of three orgs.
const lowTierItems = 250

// lowTierOrgs gives every org of cfg tier-1 limits with buckets of burst
// of a minute.
func lowTierOrgs(cfg *sim.Config, burst float64) {
	for i := range cfg.Orgs {
		cfg.Orgs[i].Limits = map[anthropic.Pool]sim.Limits{sim.AnyPool: tier1}
	}
	cfg.BurstFraction = burst
}

// livenessBound is how long after the last fault ends a run may take to
// be back at what the limits allow: a lane's longest back-off hold (1 s of
// server time, gate.ProbeBackoffMax) and the probe past it, answered within
// a second or two, or a retry-after of up to 2 s.
const livenessBound = 5 * time.Second

// livenessTail is left out at the end of a run: its last requests go out
// with nothing behind them, in flight for at most their latency.
const livenessTail = 10 * time.Second

// disturbanceRecovery is how long after a process disturbance ends (in
// real time) its run may take to be back at what the limits allow: a new
// pass's start (a probe, then a quarter of the cap ramping to all of it),
// and the lease and grace Redis keeps a stopped or cut-off process's slots
// for.
const disturbanceRecovery = 3 * time.Second

// checkLiveness is issue 29's invariant: after the last fault ends (of
// those the sync route meets; from the start when there is none), a run
// is back at what the limits allow within livenessBound (API time), or
// disturbanceRecovery (real time) after the last process disturbance
// ends if that is later: from the first real second past it to the run's
// last livenessTail, each org either holds ≥ livenessFloor of the --cap in flight
// (its concurrency binds: the most in flight in each second, on average)
// or admits as much of what its binding bucket refills, in requests (its
// rate binds: the RPM, or the token limits at the run's own tokens per
// request). It applies to the scenarios whose pace nothing
// else sets: one process on the sync route with no --max-cost or
// --pilot, no colleague, and a window of at least two real seconds before
// the work runs out. (Processes sharing a key with --shared hold their
// shares of it, which move at each lease renewal: their sum sits near 0.8
// of the cap between renewals with no fault at all, below what this
// check can tell from a slow recovery. One process with --shared is left
// out too: its lanes probe until a renewal after their first answer, and
// again on the organisation's budget once an answer names it, so it
// starts slowly (0.50-0.56 of a cap of 3 over a short run under -race in
// CI): a start-up cost, not a recovery this check judges.)
func checkLiveness(w *world, ledger []sim.LedgerEntry) []string {
	sc := w.sc
	if sc.Route != "sync" || sc.Procs > 1 || sc.Shared || sc.MaxCost > 0 || sc.Pilot > 0 || sc.OpenAI.Orgs > 0 {
		return nil
	}
	var end time.Duration // of the last fault the sync route meets
	for _, f := range sc.Faults {
		if f.Kind == sim.FaultColleague {
			return nil
		}
		if !strings.HasPrefix(string(f.Kind), "batch_") {
			end = max(end, f.Start+f.Duration)
		}
	}
	k := sc.Speed
	calm := time.Duration(float64(end+livenessBound) / k) // real time
	for _, d := range sc.Disturb {
		calm = max(calm, d.At+d.For+disturbanceRecovery)
	}
	// The first passes only: the cache pass starts later, alone.
	var last float64
	for _, e := range ledger {
		if e.ServiceTier != "batch" {
			last = max(last, e.APISeconds)
		}
	}
	// The window ends before the work runs out: the last billing less
	// the tail, and no later than the last pass of its items ended.
	stop := last/k - livenessTail.Seconds()/k // real seconds
	for _, p := range w.procs {
		var done time.Duration // when its last pass of its own items ended
		for _, ps := range p.passes {
			if !ps.cachePass {
				done = ps.to
			}
		}
		stop = min(stop, done.Seconds()-livenessTail.Seconds()/k)
	}
	from := int64(math.Ceil(calm.Seconds()))
	to := int64(math.Floor(stop)) - 1 // the last whole real second before it
	if to-from+1 < 2 {
		return nil
	}
	return orgsLive(w.logf, w.sim.Server.Stats(), simConfig(sc), ledger, k, sc.Cap, from, to, end, nil)
}

// orgsLive judges the real seconds from to to of a run on the simulator
// at speed k whose last fault ended at end (API time): each org either
// holds ≥ livenessFloor of the cap in flight (the most in flight in each
// second, on average) or admits as much of what its binding bucket
// refills, in requests (the RPM, or the token limits at the run's own
// tokens per request, from the ledger's entries outside the batch tier),
// give or take one request at each edge of the window (pacedShare).
// busy, when set, keeps only the seconds it reports true for.
func orgsLive(logf func(string, ...any), st sim.Stats, cfg sim.Config, ledger []sim.LedgerEntry, k float64, cap int, from, to int64, end time.Duration, busy func(sec int64) bool) []string {
	// Each org's binding limit in requests per real second, at its own
	// tokens per request.
	type toks struct{ n, in, out float64 }
	per := map[string]*toks{}
	for _, e := range ledger {
		if e.ServiceTier == "batch" {
			continue
		}
		t := per[e.Org]
		if t == nil {
			t = &toks{}
			per[e.Org] = t
		}
		t.n++
		t.in += float64(e.InputTokens + e.CacheWrite5m + e.CacheWrite1h)
		t.out += float64(e.OutputTokens)
	}
	var v []string
	for _, o := range st.Orgs {
		var lim sim.Limits
		for _, oc := range cfg.Orgs {
			if oc.Name == o.Name {
				lim = oc.Limits[sim.AnyPool]
				if l, ok := oc.Limits[anthropic.PoolOf(workload.DefaultModel)]; ok {
					lim = l
				}
			}
		}
		rate := float64(lim.RPM) // requests per API minute
		if t := per[o.Name]; t != nil && t.n > 0 {
			if lim.ITPM > 0 && t.in > 0 {
				rate = min(rate, float64(lim.ITPM)/(t.in/t.n))
			}
			if lim.OTPM > 0 && t.out > 0 {
				rate = min(rate, float64(lim.OTPM)/(t.out/t.n))
			}
		}
		perReal := rate / 60 * k // requests per real second
		var inFlight, admitted float64
		n := 0
		for _, p := range o.Series {
			if p.T < from || p.T > to || (busy != nil && !busy(p.T)) {
				continue
			}
			// The most in flight during the second, not the count at its
			// end: a lane at its cap sits one below it between an answer
			// and the next admission, and on a cap of 3 one such end of a
			// second in two read as 0.83 of the cap (seed 22).
			inFlight += float64(min(p.InFlightMax, int64(cap)))
			admitted += float64(p.Admitted)
			n++
		}
		if n < 2 {
			continue
		}
		held := inFlight / float64(n) / float64(cap)
		paced := pacedShare(admitted, n, perReal)
		logf("liveness: org %s at %.2f of --cap %d in flight, %.2f of %.1f requests per API minute, %d real seconds of %d-%d", o.Name, held, cap, paced, rate, n, from, to)
		if max(held, paced) < livenessFloor() {
			v = append(v, fmt.Sprintf("liveness: org %s was at %.2f of --cap %d in flight and %.2f of its binding limit (%.1f requests per API minute) in %d real seconds from %s to %s (API) after the last fault ended at %s, want ≥ %.2f of one within %s (or %s of real time after a disturbance)",
				o.Name, held, cap, paced, rate, n, time.Duration(float64(from)*k*float64(time.Second)), time.Duration(float64(to+1)*k*float64(time.Second)), end, livenessFloor(), livenessBound, disturbanceRecovery))
		}
	}
	return v
}

// pacedShare is the share of what its binding bucket refills that an org
// admitted in n real seconds (perReal requests a second), with one request
// of slack at each edge of the window: a bucket that refills evenly does
// not admit evenly (a lane at its cap waits for an answer, a refill comes
// just after the window opens), so each edge may cut one admission off. At
// 50 requests a minute and speed 15, a request is 4 % of a two-second
// window: the 500-seed run of 2026-12-05 judged seed 479 at 0.8999 of its
// limit with one request of slack, on a machine loaded by two seeds at a
// time; alone it ran at 1.08 (2 of 2). The defect the check exists for
// left an org at 0.05.
func pacedShare(admitted float64, n int, perReal float64) float64 {
	return (admitted + 2) / float64(n) / perReal
}

// livenessFloor is the share of what the limits allow the liveness check
// wants: 0.9, or 0.75 in a race build on a loaded machine (CI's, where a
// healthy run held 0.83 of its cap or of a tier-1 RPM; the defect it
// catches left a run at 0.05).
func livenessFloor() float64 {
	if raceBuild {
		return 0.75
	}
	return 0.9
}
