package campaign

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A gateway batch by route sync whose gateway is killed -9 while the
// batch's requests are in flight ends after the restart: every custom_id
// once, within the clients' window. Found by gateway seed 19 (a kill 90 ms
// after a batch's create): on the code of 2026-12-05 the restarted
// gateway logs "an earlier run died with requests in flight" and leaves the
// batch in_progress, every item processing, for as long as it runs.
func TestGatewayBatchEndsAfterKillNineMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: spawns processes")
	}
	sc := gwScenario{Seed: 90019, Speed: 20, Gateways: 1, Cap: 2,
		Clients: []gwClient{{Name: "dave", Gateway: 0, MaxToks: 128, Batches: 1, BatchSize: 14, Route: "sync"}}}
	w := setupGateway(t, sc)
	w.window = 30 * time.Second
	// Kill the gateway once the simulator has billed two of the batch's
	// requests: the others are in flight or queued.
	go func() {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if len(w.sim.Server.Ledger()) >= 2 && w.gws[0].signal(w, syscall.SIGKILL) != nil {
				w.logf("gateway 0: kill -9 after the batch's first billings")
				return
			}
		}
	}()
	w.execute()
	kills := 0
	for _, inc := range w.gws[0].incs {
		if inc.killed {
			kills++
		}
	}
	if kills != 1 {
		t.Fatalf("the gateway was killed %d times, want 1:\n%s", kills, strings.Join(w.log, "\n"))
	}
	if v := checkGateway(w); len(v) > 0 {
		t.Errorf("%s\n- %s\n%s", strings.Join(w.log, "\n"), strings.Join(v, "\n- "), w.gws[0].incs[len(w.gws[0].incs)-1].out)
	}
}
