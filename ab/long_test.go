//go:build long

package ab

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/rundir"
)

func TestRunOrderABAB(t *testing.T) {
	t.Parallel()
	cfg, _ := smallConfig(t, 150)
	cfg.Order = OrderABAB
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 2 || !res.Complete {
		t.Fatalf("rounds %+v", res.Rounds)
	}
	if want := round3((res.Rounds[0].Speedup + res.Rounds[1].Speedup) / 2); res.Speedup != want {
		t.Fatalf("speedup %v, want the mean %v", res.Speedup, want)
	}
	if res.ProjectedCostUSD.Arms != 4 || res.ProjectedCostUSD.TotalNanos != 4*res.ProjectedCostUSD.PerArmNanos {
		t.Fatalf("projection %+v", res.ProjectedCostUSD)
	}
	for _, d := range []string{"baseline", "dispatcher", "round2/baseline", "round2/dispatcher"} {
		if _, err := os.Stat(filepath.Join(cfg.Dir, d, ArmFile)); err != nil {
			t.Error(err)
		}
	}
	if res.Rounds[1].Baseline.Dir != "round2/baseline" {
		t.Errorf("round 2 dir %q", res.Rounds[1].Baseline.Dir)
	}
}

// TestRunOrderABABBatch: with --order abab the batch arm runs after the
// two arms of each round, in batch/ and round2/batch, and the projection
// counts it once per round.
func TestRunOrderABABBatch(t *testing.T) {
	t.Parallel()
	cfg, _ := smallConfig(t, 150)
	cfg.Speed = 400
	cfg.Order = OrderABAB
	cfg.Arms = []string{ArmBaseline, ArmDispatcher, ArmBatch}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 2 || !res.Complete || res.Rounds[1].Batch == nil || res.Rounds[1].Batch.Dir != "round2/batch" {
		t.Fatalf("rounds %+v", res.Rounds)
	}
	pc := res.ProjectedCostUSD
	if pc.Arms != 6 || pc.TotalNanos != 4*pc.PerArmNanos+2*pc.BatchArmNanos {
		t.Fatalf("projection %+v", pc)
	}
	for _, rd := range res.Rounds {
		if rd.BatchCostRatio != 0.5 {
			t.Errorf("round %d: batch_cost_ratio %v", rd.Round, rd.BatchCostRatio)
		}
	}
	var started []string
	for _, e := range readEvents(t, filepath.Join(cfg.Dir, rundir.EventsFile)) {
		if strings.Contains(e.Note, "arm (round ") && strings.HasSuffix(e.Note, "started") {
			started = append(started, strings.Fields(e.Note)[0])
		}
	}
	if got := strings.Join(started, ","); got != "baseline,dispatcher,batch,baseline,dispatcher,batch" {
		t.Fatalf("arms started in order %s", got)
	}
}
