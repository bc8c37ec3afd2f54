package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/sim"
)

// A run whose first requests hang does not wait for them: gateway
// campaign seed 53's stall, on the engine's lanes (the same rules). Each
// lane sent one request until its first answer, and a key whose
// organisation was not known yet sent one and counted against every
// organisation's cap, so three hung first requests held every lane for
// their whole latency. Now each key's organisation is learnt from a
// request of its own (upstream.Orgs.Discover) and a lane whose first
// request is out past gate.FirstAnswerWait sends one more.
//
// Every org's first request hangs for 20 real seconds (a slow fault on
// the API's first 2 s); of the 57 others, at least 40 must be answered
// within 8 real seconds. Before the change none was.
func TestRunFirstRequestsThatHangDoNotHoldTheLanes(t *testing.T) {
	t.Parallel()
	const speed = 10
	const hang = 200 * time.Second // API time: 20 real seconds
	h := newHarness(t, sim.PresetOrigin3Org, speed, 60, nil)
	h.faults = []sim.Fault{{Kind: sim.FaultSlow, Duration: 2 * time.Second, ExtraLatency: hang}}
	const want, within = 40, 8 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	go func() {
		// Stopped once enough are answered (or at the bound); the hung
		// requests are cut then rather than waited for.
		for ctx.Err() == nil && h.sim.Server.LedgerTotals().Requests < want {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
	}()
	h.run(ctx, func(c *dispatch.Config) { c.Grace = time.Millisecond })
	got := h.sim.Server.LedgerTotals().Requests
	t.Logf("%d of 60 items answered in %v while each org's first hung for %v", got, time.Since(start).Round(time.Millisecond), hang/speed)
	if got < want {
		t.Errorf("%d items answered within %v, want ≥ %d: the hung first requests held the lanes", got, within, want)
	}
}
