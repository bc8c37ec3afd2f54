package campaign

import (
	"testing"
	"time"
)

// Seed 144: 4 processes × 403 GPT items on one OpenAI key whose --cap 3
// they share. The runs sent as fast as the cap let them (about 2.3 of the
// 3 slots in flight, 3.5 items a second each), and every first pass was
// still running at passTimeout, reported as a hang: the scenario asked for
// about 2 minutes of the cap alone. Every drawn scenario's GPT requests
// now fit gptBudget at the OpenAI orgs' full throughput.
func TestDrawFitsGPTRequestsInThePass(t *testing.T) {
	s := draw(144)
	if s.OpenAI.Orgs != 1 || s.Procs != 4 || s.Cap != 3 || !s.Shared || s.Route != "sync" {
		t.Fatalf("seed 144 draws another scenario now: %s", s)
	}
	before := s
	before.Items = 403 // what it drew before it was fitted
	if got := before.gptReal(); got < passTimeout {
		t.Errorf("seed 144 as it ran: its GPT requests need %v at the cap, want more than passTimeout (%v) (it ran past it)", got, passTimeout)
	}
	var n int
	for seed := int64(1); seed <= 1000; seed++ {
		s := draw(seed)
		if s.OpenAI.Orgs == 0 {
			continue
		}
		if need := s.gptReal(); need > gptBudget && s.Items > gptFewest {
			t.Errorf("seed %d: its GPT requests need %v at the OpenAI orgs' full throughput, more than %v: %s", seed, need.Round(time.Second), gptBudget, s)
		}
		if s.Items < gptFewest {
			t.Errorf("seed %d: %d items per process, fewer than %d", seed, s.Items, gptFewest)
		}
		if s.MaxCost > 0 && s.MaxCost > s.fileUSD(oaUSD(s.OpenAI.Model)) {
			t.Errorf("seed %d: --max-cost %.4f above what the file costs, %.4f", seed, s.MaxCost, s.fileUSD(oaUSD(s.OpenAI.Model)))
		}
		if before := s.Items; func() bool { s.fitOpenAI(); return s.Items != before }() {
			t.Errorf("seed %d: fitted twice", seed)
		}
		n++
	}
	t.Logf("%d OpenAI seeds of 1-1000 fit %v (seed 144 before: %v)", n, gptBudget, before.gptReal().Round(time.Second))
}

// oaUSD is what one item of model costs by sync (oaModels).
func oaUSD(model string) float64 {
	for _, m := range oaModels {
		if m.id == model {
			return m.usd
		}
	}
	return 0
}
