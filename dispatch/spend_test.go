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
