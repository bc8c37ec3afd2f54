package shared

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
)

// A process that closes while Redis is cut off (a partition: connections
// open, nothing passes) exits promptly: gateway campaign seed 459, where
// a gateway given its second signal just as it was cut off took 6 s to
// exit. go-redis ignored the closing calls' deadlines (each read had the
// whole read timeout), and the budget released each of its lanes' slots
// in turn, a timeout each. Now every call's context bounds it, Close
// cancels the spend budget's loop mid-call, the release stops at the
// first failure (the rest lapse with their leases), and the spend
// budget's alive mark is not deleted when its flush could not reach
// Redis. Twelve lanes at the default TTL (a read timeout of 0.5 s): Close
// of the spend budget and of the budget within 3 s (4.0-4.5 s before,
// about 1 s after, under -race).
func TestCloseWhileCutOffFromRedisIsPrompt(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	srv := rs.URL()
	px := netproxy.Start(t, srv[len("redis://"):len(srv)-len("/0")])
	var orgs []org.Org
	for i := range 12 {
		orgs = append(orgs, freshOrg(string(rune('a'+i))))
	}
	b, err := Open(context.Background(), Config{URL: "redis://" + px.Addr + "/0", Orgs: orgs})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, o := range orgs {
		lc := lane(10)
		lc.Org = o.Name
		b.NewGate(lc)
	}
	b.renewAll(context.Background()) // scripts loaded, slots held
	b.Start(context.Background())
	s := b.Spend("gw-a")
	budgets := []spend.Budget{{Name: "client:alice", Cap: 1_000_000_000}}
	id, err := s.Reserve(budgets, 1000, false, "-")
	if err != nil {
		t.Fatal(err)
	}
	px.BlackHole(true)
	s.End(id, budgets, spend.OpSettle, 500) // queued: Redis does not answer
	start := time.Now()
	serr := s.Close()
	mid := time.Since(start)
	berr := b.Close()
	took := time.Since(start)
	t.Logf("closed in %v while cut off (the spend budget in %v: %v; the budget: %v)", took.Round(time.Millisecond), mid.Round(time.Millisecond), serr, berr)
	if serr == nil {
		t.Error("the spend budget closed without saying its settle could not reach Redis")
	}
	if took > 3*time.Second {
		t.Errorf("closing while cut off from Redis took %v, want ≤ 3 s", took)
	}
}

// A process that finishes hands each idle lane's slots and cap back to
// Redis at once, before it has exited, and records each in its events: the
// others on the key may go up to their own larger --cap from then. The
// campaign's checker bounds a key by a process's --cap only until that
// record (seed 4 under load: the two processes with a cap of 4 handed back
// 1 s before they were seen to exit, and the one with a cap of 6 had 5 in
// flight meanwhile, all its own). A lane with a request still out keeps its
// slots and its cap, and records nothing.
func TestCloseRecordsEachLaneItHandsBack(t *testing.T) {
	t.Parallel()
	url := testredis.URL(t)
	oa, ob := freshOrg("a"), freshOrg("b")
	orgs := []org.Org{oa, ob}
	path := filepath.Join(t.TempDir(), "events.jsonl")
	ev, err := rundir.OpenEventLog(path)
	if err != nil {
		t.Fatal(err)
	}
	// A long lease: nothing of the small process lapses while the test
	// runs, however slow the machine.
	small, err := Open(context.Background(), Config{URL: url, Orgs: orgs, TTL: 10 * time.Second, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	large := openIdle(t, url, orgs)
	lanes := func(b *Budget, capacity int) (a, bl *Gate) {
		la, lb := lane(capacity), lane(capacity)
		lb.Org = "b"
		return b.NewGate(la).(*Gate), b.NewGate(lb).(*Gate)
	}
	sa, _ := lanes(small, 4) // lane b stays idle
	la, lb := lanes(large, 6)
	small.renewAll(context.Background())
	if n := len(fill(sa)); n != 4 {
		t.Fatalf("the small process admitted %d on lane a, want its cap of 4", n)
	}
	laneCap := func(g *Gate) int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.laneCap
	}
	large.renewAll(context.Background())
	if a, b := laneCap(la), laneCap(lb); a != 4 || b != 4 {
		t.Fatalf("with the small process in Redis: lane caps %d and %d, want 4 and 4", a, b)
	}
	if err := small.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	large.renewAll(context.Background())
	if a, b := laneCap(la), laneCap(lb); a != 4 || b != 6 {
		t.Errorf("after the small process closed with a request out on lane a: lane caps %d and %d, want 4 (still held) and 6 (handed back)", a, b)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back []string
	for line := range strings.Lines(string(raw)) {
		var e struct {
			Kind string `json:"kind"`
			Data struct {
				Org        string `json:"org"`
				HandedBack bool   `json:"handed_back"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events line %q: %v", strings.TrimSpace(line), err)
		}
		if e.Kind == rundir.EventLane && e.Data.HandedBack {
			back = append(back, e.Data.Org)
		}
	}
	if !slices.Equal(back, []string{"b"}) {
		t.Errorf("lanes recorded as handed back: %q, want [b] (lane a had a request out)", back)
	}
}
