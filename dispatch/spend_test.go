package dispatch_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/spend"
)

// TestEngineWaitsForRoomAnotherRouteHolds: the engine shares the run's
// spend gate with another route (a batch's worst case, held). While that
// holds the room, the engine sends nothing and neither stops nor calls it
// "no usable lane"; once the hold is settled the engine takes the room
// and completes. When the hold is kept for good instead, the engine stops
// with an error matching spend.ErrCapReached and the --max-cost figures.
func TestEngineWaitsForRoomAnotherRouteHolds(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		name := "released"
		if keep {
			name = "kept"
		}
		t.Run(name, func(t *testing.T) {
			const n = 200
			h := newHarness(t, sim.PresetOrigin3Org, 50, n, nil)
			capN := cost.Nanos(50) * cost.NanosPerUSD
			gate := spend.New("--max-cost", capN, 0)
			other := gate.Hold(capN - 1000) // room for no request's worst case
			sentWhileHeld := make(chan int64, 1)
			go func() {
				time.Sleep(300 * time.Millisecond)
				sentWhileHeld <- h.sim.Server.LedgerTotals().Requests
				if keep {
					other.Keep()
				} else {
					other.Settle(capN / 10)
				}
			}()
			res, err := h.run(t.Context(), func(c *dispatch.Config) { c.Spend = gate })
			if sent := <-sentWhileHeld; sent != 0 {
				t.Fatalf("%d requests billed while another route held the room", sent)
			}
			if keep {
				if !errors.Is(err, spend.ErrCapReached) || !errors.Is(err, dispatch.ErrIncomplete) || !strings.Contains(res.StopReason, "--max-cost") {
					t.Fatalf("a hold kept for good: %v (stop %q); want ErrIncomplete wrapping ErrCapReached", err, res.StopReason)
				}
				if got := h.sim.Server.LedgerTotals().Requests; got != 0 {
					t.Fatalf("%d requests billed with no room", got)
				}
				return
			}
			if err != nil || !res.Complete {
				t.Fatalf("after the hold settled: %v", err)
			}
			h.requireEachOnce(n)
			led := h.sim.Server.LedgerTotals()
			if gate.Spent() != capN/10+cost.Nanos(led.CostNanos) || gate.Reserved() != 0 || gate.Open() != 0 {
				t.Fatalf("gate spent %s reserved %s open %d; want %s + the ledger's %s, nothing reserved", gate.Spent(), gate.Reserved(), gate.Open(), capN/10, cost.Nanos(led.CostNanos))
			}
		})
	}
}

// Campaign seed 426 (three processes, --max-cost, truncated answers, a
// resume after the stop at the cap): a truncated answer was billed by the
// API though no usage came back, and the run that saw it counted its worst
// case as held, but only in memory: the resume's gate started from the
// recorded usage alone and spent that room again, passing --max-cost by
// what the truncated answers had cost ($0.668544 over $0.660773 and more).
// The worst case is kept in the store (possible_duplicate_billing_nanos)
// and a resume counts it as spent.
func TestResumeCountsTheTruncatedAnswersItMayHaveBeenBilledFor(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sim.PresetOrigin3Org, 50, 300, nil)
	h.faults = []sim.Fault{{Kind: sim.FaultTruncatedBody, Probability: 0.4, Duration: time.Hour}}
	capN := cost.Nanos(0.30 * float64(cost.NanosPerUSD)) // about a fifth of the items
	maxCost := func(c *dispatch.Config) { c.MaxCost = capN }
	// Each resume on the old code found the truncated answers' room free
	// again; a few passes took the ledger over the cap.
	for pass := 1; pass <= 8; pass++ {
		res, err := h.run(t.Context(), maxCost)
		led := h.sim.Server.LedgerTotals()
		if billed := cost.Nanos(led.CostNanos); billed > capN {
			t.Fatalf("after pass %d the ledger billed %s, over --max-cost %s (%d requests, %d billed again)", pass, billed, capN, led.Requests, led.Duplicates)
		}
		if err == nil && res.Complete {
			t.Fatalf("pass %d completed every item under a cap of about a fifth of their cost", pass)
		}
		if !errors.Is(err, spend.ErrCapReached) {
			t.Fatalf("pass %d: %v; want a stop at --max-cost", pass, err)
		}
	}
}
