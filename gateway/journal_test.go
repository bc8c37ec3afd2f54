package gateway

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
)

// A gateway that starts on the state directory of one that died counts
// every attempt the dead one's journal holds open at its worst case, as an
// unread, abandoned entry of its client and org, and spends it from the
// client's cap; attempts the journal ended are not counted again. The
// journal is then deleted, and this gateway's own is deleted at a clean
// close with every attempt ended.
func TestRestartCountsTheAttemptsAJournalHoldsOpen(t *testing.T) {
	dir := t.TempDir()
	j, err := rundir.OpenDurableJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	tag := func(client, org string) string {
		b, _ := json.Marshal(spendTag{Client: client, Org: org, Model: "claude-sonnet-4-5"})
		return string(b)
	}
	for _, rec := range []struct {
		seq    int64
		worst  cost.Nanos
		client string
		ended  bool
	}{{1, 4_000_000, "a", false}, {2, 3_000_000, "a", true}, {3, 2_000_000, "b", false}, {4, 1_000_000, "a", false}} {
		if err := j.SentTagged(rec.seq, 1, rec.worst, tag(rec.client, "high_prio")); err != nil {
			t.Fatal(err)
		}
		if rec.ended {
			j.Ended(rec.seq, 1, false)
		}
	}
	j.Close(false) // killed: the file stays
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 200, nil)
	g, srv := startGW(t, run, func(c *Config) {
		c.StateDir = dir
		c.Clients = []Client{{Name: "a", Token: tokA, MaxCost: 10_000_000}, {Name: "b", Token: tokB}}
	})
	es := ledgerEntries(t, g)
	read, unread := splitLedger(es)
	if len(es) != 3 || read != 0 || unread != 7_000_000 || g.gates["a"].Spent() != 5_000_000 || g.gates["b"].Spent() != 2_000_000 {
		t.Fatalf("ledger %+v; a spent %v, b %v: want the three open attempts at their worst case", es, g.gates["a"].Spent(), g.gates["b"].Spent())
	}
	for _, e := range es {
		if !e.Abandoned || e.Org != "high_prio" || e.Model != "claude-sonnet-4-5" {
			t.Errorf("entry %+v", e)
		}
	}
	paths, open, err := rundir.OpenAttempts(dir)
	if err != nil || len(paths) != 1 || len(open) != 0 {
		t.Fatalf("journals %v, open %v, %v: want this gateway's own, empty", paths, open, err)
	}
	// Alice has $0.005 left of $0.01: a request whose worst case is more
	// is refused; one that fits is sent, journaled and ended.
	status, answer, _ := gwPost(t, srv.URL, tokA, []byte(`{"model":"claude-sonnet-4-5","max_tokens":512,"messages":[{"role":"user","content":"hi"}]}`))
	if !refusedByCap(status, answer) {
		t.Errorf("a worst case past the cap: %d %s", status, answer)
	}
	if status, answer, _ := gwPost(t, srv.URL, tokA, []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)); status != 200 {
		t.Fatalf("a request that fits: %d %s", status, answer)
	}
	srv.Close()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if paths, _ := filepath.Glob(filepath.Join(dir, "attempts-*.journal")); len(paths) != 0 {
		t.Errorf("journals left after a clean close: %v", paths)
	}
	if es := readLedgerFile(t, filepath.Join(dir, ledgerFile)); len(es) != 4 || es[3].Unread != 0 || es[3].Cost == 0 {
		t.Errorf("ledger after the answer %+v", es)
	}
}

// A gateway killed with requests in flight leaves them running upstream
// (the API does not stop when its client dies): its successor on the same
// state directory held none of their slots, and filled the keys on top of
// them (the gateway campaign's seed 12: 4 in flight on a cap of 2 after a
// kill -9 and a restart). The restart now holds a slot per open attempt of
// the journal, on its (org, pool), while the API may run it (bounded by the
// attempt timeout) from the journal's last write.
func TestRestartHoldsTheSlotsOfTheDeadGatewaysAttempts(t *testing.T) {
	dir := t.TempDir()
	j, err := rundir.OpenDurableJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Long answers: the API may run them half an hour (more than the
	// attempt timeout, which bounds the hold).
	b, _ := json.Marshal(spendTag{Client: "a", Org: "high_prio", Model: "claude-sonnet-4-5", MaxTokens: 64_000})
	for seq := int64(1); seq <= 2; seq++ {
		if err := j.SentTagged(seq, 1, 1_000_000, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	j.Close(false) // killed: the file stays
	run, _ := simtest.Start(t, sim.PresetOrigin3Org, 20, nil)
	_, srv := startGW(t, run, func(c *Config) {
		c.StateDir = dir
		c.Caps = map[string]int{"sonnet": 2}
		c.Timeout = time.Minute // the hold lasts a minute from the journal's last write
	})
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"question %d"}]}`, i)
			if status, answer, _ := gwPost(t, srv.URL, tokA, []byte(body)); status != 200 {
				t.Errorf("request %d: %d %s", i, status, answer)
			}
		})
	}
	wg.Wait()
	for _, o := range run.Server.Stats().Orgs {
		switch {
		case o.Name == "high_prio" && o.MaxInFlight != 0:
			t.Errorf("high_prio: %d in flight on top of the dead gateway's 2, on a cap of 2", o.MaxInFlight)
		case o.Name != "high_prio" && o.MaxInFlight == 0:
			t.Errorf("%s served nothing: the hold is for high_prio alone", o.Name)
		}
	}
}

// The hold of a dead attempt lasts as long as the API may still run it
// (gate.StillRunningBound: twice its max_tokens at the API's own pace for
// long requests), not the whole attempt timeout: a gateway killed with its
// lanes full is back in service when its predecessor's answers are surely
// over (the campaign's seed 11: held the full 10 API minutes, every
// request of a minute got the gateway's own 429). It is the bound the
// shared budget holds a silent process's slots for: a hold of once the
// API's pace let a restarted gateway send beside a long answer still
// running.
func TestDeadAttemptsHeldAsLongAsTheAPIMayRunThem(t *testing.T) {
	s := newLaneSet(nil, gate.LaneConfig{}, func(*upstreampkg.Provider, string) int { return 2 }, 10, nil, nil)
	last := time.Now()
	s.holdDead([]spendTag{
		{Org: "o", Model: "claude-sonnet-4-5", MaxTokens: 64},     // twice 10 API s (the floor): 2 s
		{Org: "o", Model: "claude-sonnet-4-5", MaxTokens: 6_400},  // twice 3 API min: 36 s
		{Org: "o", Model: "claude-sonnet-4-5", MaxTokens: 64_000}, // twice 30 API min: the timeout, 60 s
		{Org: "o", Model: "claude-haiku-4-5", MaxTokens: 64},
	}, last, time.Minute)
	h := s.dead[deadKey{"o", anthropic.PoolOf("claude-sonnet-4-5")}]
	for _, c := range []struct {
		at   time.Duration
		n    int
		next time.Duration
	}{{0, 3, 2 * time.Second}, {3 * time.Second, 2, 36 * time.Second}, {40 * time.Second, 1, time.Minute}, {61 * time.Second, 0, 0}} {
		n, next := h.held(last.Add(c.at))
		if n != c.n || (n > 0 && !next.Equal(last.Add(c.next))) {
			t.Errorf("at +%v: %d held, next end %v; want %d, +%v", c.at, n, next.Sub(last), c.n, c.next)
		}
	}
	if h := s.dead[deadKey{"o", anthropic.PoolOf("claude-haiku-4-5")}]; h == nil || len(h.until) != 1 {
		t.Errorf("haiku's hold %+v, want its own one slot", h)
	}
}
