package dispatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/sim"
)

// lapsingGate hands out every third permit on a lease that has already
// ended, as a shared gate does for a process paused between admission and
// sending.
type lapsingGate struct {
	gate.Gate
	n, lapsed *atomic.Int64
}

func (g lapsingGate) TryAdmit(now time.Time, d gate.Demand) (gate.Permit, time.Duration, bool) {
	p, w, ok := g.Gate.TryAdmit(now, d)
	if ok && g.n.Add(1)%3 == 0 {
		p.Until = now.Add(-time.Nanosecond)
		g.lapsed.Add(1)
	}
	return p, w, ok
}

// TestPermitPastItsLeaseIsNotSent: a request admitted on a lease that
// ended before it went out is not sent (the simulator never sees it) and
// is not an attempt; its item goes back to the queue and ends once.
func TestPermitPastItsLeaseIsNotSent(t *testing.T) {
	t.Parallel()
	const n = 300
	h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
	var count, lapsed atomic.Int64
	res, err := h.run(context.Background(), func(c *dispatch.Config) {
		c.NewGate = func(lc gate.LaneConfig) gate.Gate {
			return lapsingGate{Gate: gate.NewLane(lc), n: &count, lapsed: &lapsed}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete || res.Summary.Succeeded != n {
		t.Fatalf("summary: %+v", res.Summary)
	}
	h.requireEachOnce(n)
	sent := h.sim.Server.LedgerTotals().Requests
	if lapsed.Load() < n/3 {
		t.Fatalf("only %d permits lapsed", lapsed.Load())
	}
	if sent != n || count.Load() != sent+lapsed.Load() {
		t.Fatalf("%d admitted, %d of them on a lapsed lease, and the simulator billed %d for %d items: a permit past its lease was sent", count.Load(), lapsed.Load(), sent, n)
	}
	if a := res.Summary.Attempts; a != sent {
		t.Fatalf("summary counts %d attempts, the simulator saw %d", a, sent)
	}
}
