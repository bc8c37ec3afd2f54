package campaign

import (
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

// Issue 29's draws for the gateway scenarios, as drawLowTier's for the run
// scenarios: low-tier limits and storms of every kind, and the liveness
// invariant. They come from a random stream of their own, so a seed's
// other draws are those they always were.

// gwLowTierRequests is the fewest requests of a well-behaved client on
// tier-1 orgs: about 50 API s of work at 50 requests a minute on each of
// three orgs, so that the work outlasts a storm.
const gwLowTierRequests = 120

// drawGatewayLowTier adds issue 29's options to s: a third of the seeds
// run on tier-1 orgs whose buckets hold a small burst (5 % to 30 % of a
// minute), their well-behaved clients with at least gwLowTierRequests
// requests and enough of them at once to keep every org at its cap (4 ×
// --cap, a cap's worth to spare), so that the gateway, not the clients, sets the pace; and half
// of those meet a storm of one kind, on every org or on one, while the
// clients' work runs (from 15 to 35 API s after the simulator's start,
// for 10 to 25 s), leaving the liveness check a window after it.
func drawGatewayLowTier(seed int64, s *gwScenario) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x10e7_9a7e_2029))
	if r.IntN(3) != 0 {
		return
	}
	s.LowTier = true
	s.Burst = 0.05 + 0.25*r.Float64()
	// The caps grow with the work, so that they bind at the share of it
	// drawn (a gateway's --max-cost reached sooner would refuse a hostile
	// client's requests with its own 400 before the API's 403).
	var was, now float64
	for i := range s.Clients {
		c := &s.Clients[i]
		if c.Hostile != "" {
			continue
		}
		per := gwPerRequestUSD(c.MaxToks)
		batch := float64(c.Batches*c.BatchSize) * per / 2
		before := float64(c.Requests)*per + batch
		c.Requests = max(c.Requests, gwLowTierRequests)
		c.Conc = max(c.Conc, 4*s.Cap)
		after := float64(c.Requests)*per + batch
		c.MaxCost *= after / before
		was, now = was+before, now+after
	}
	if was > 0 {
		s.MaxCost *= now / was
	}
	if r.IntN(2) == 0 {
		f := sim.Fault{Kind: stormKinds[r.IntN(len(stormKinds))], Probability: 1,
			Start: time.Duration(15+r.IntN(21)) * time.Second, Duration: time.Duration(10+r.IntN(16)) * time.Second}
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

// gwDeadHoldAPI is how long, in API time, a gateway started after a kill
// -9 holds the slot of an attempt of maxTokens its predecessor left in
// flight: twice as long as the API may run it (an hour for 128,000 tokens,
// at least 10 s), never past the attempt timeout (the gateway's
// gate.StillRunningBound; docs/campaign.md, "the killed gateway's
// requests").
func gwDeadHoldAPI(maxTokens int) time.Duration {
	return min(gwAttemptTimeoutAPI, 2*max(10*time.Second, time.Duration(float64(time.Hour)*float64(maxTokens)/128_000)))
}

// checkGatewayLiveness is issue 29's invariant for the gateway: after the
// last fault ends (livenessBound of API time after it), and
// disturbanceRecovery of real time after the last disturbance of a
// gateway ends, after the last start of a gateway process and after a
// restarted gateway's hold of its killed predecessor's slots, in every
// real second in which the well-behaved clients without max_cost have at
// least 3 × --cap requests waiting for their answers on average (enough
// to hold every org at its cap), each org either holds ≥ livenessFloor of the --cap in
// flight or admits as much of what its binding bucket refills (see
// orgsLive). It applies to every scenario but those whose pace something
// else sets: a gateway's --max-cost (its requests wait for room), a
// colleague, several gateways without --shared (each the others'
// colleague), and --shared (the gateways hold shares of the cap that move
// at each lease renewal, see checkLiveness). A client with max_cost is left
// out of the count of waiting requests (its requests may wait for room),
// and so are hostile clients and the batches' items.
func checkGatewayLiveness(w *gwWorld, ledger []sim.LedgerEntry) []string {
	sc := w.sc
	if sc.Shared || sc.MaxCost > 0 || sc.Gateways > 1 {
		// Several gateways without --shared are each other's colleagues
		// on the keys: each sees the others' draws in the buckets and
		// leaves them room (seed 448: three, 0.57-0.80 of the binding
		// limit after a storm).
		return nil
	}
	var end time.Duration // of the last fault the lanes meet
	for _, f := range sc.Faults {
		if f.Kind == sim.FaultColleague {
			return nil
		}
		if !strings.HasPrefix(string(f.Kind), "batch_") && f.Kind != sim.FaultBetaForbidden {
			end = max(end, f.Start+f.Duration)
		}
	}
	k := sc.Speed
	calm := time.Duration(float64(end+livenessBound) / k) // real time
	for _, d := range sc.Disturb {
		calm = max(calm, w.t0+d.At+d.For+disturbanceRecovery)
	}
	// A gateway started again after a kill -9 holds the slots of the
	// attempts its predecessor had in flight for as long as the API may
	// run them (gwDeadHoldAPI): its lanes are full of them meanwhile, by
	// design (the cap holds across the kill).
	most := 0
	for _, c := range w.clients {
		most = max(most, c.c.MaxToks)
	}
	dead := time.Duration(float64(gwDeadHoldAPI(most)) / k)
	for _, g := range w.gws {
		g.mu.Lock()
		for _, inc := range g.incs {
			calm = max(calm, inc.from+disturbanceRecovery)
			if inc.killed {
				calm = max(calm, inc.to+dead+disturbanceRecovery)
			}
		}
		g.mu.Unlock()
	}
	// waiting[s]: how many requests waited for their answers during the
	// real second s, on average (a request waits well under a second
	// when the orgs keep up).
	waiting := map[int64]float64{}
	last := int64(-1)
	for _, c := range w.clients {
		if c.c.Hostile != "" || c.c.MaxCost > 0 {
			continue
		}
		for _, q := range c.reqs {
			if q.tries == 0 {
				continue
			}
			a, b := q.first.Seconds(), q.end.Seconds()
			for s := int64(math.Floor(a)); float64(s) < b; s++ {
				waiting[s] += min(b, float64(s+1)) - max(a, float64(s))
				last = max(last, s)
			}
		}
	}
	from := int64(math.Ceil(calm.Seconds()))
	busy := func(s int64) bool { return waiting[s] >= float64(3*sc.Cap) }
	n := 0
	for s := from; s <= last; s++ {
		if busy(s) {
			n++
		}
	}
	w.logf("liveness: %d real seconds with %d or more requests waiting from %d s (the last fault ended at %s API) to %d s", n, 3*sc.Cap, from, end, last)
	if n < 2 {
		return nil
	}
	return orgsLive(w.logf, w.sim.Server.Stats(), gwSimConfig(sc), ledger, k, sc.Cap, from, last, end, busy)
}
