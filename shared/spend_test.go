package shared

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/spend"
)

// spendOf is the shared spend budget of owner through its own connection
// to the Redis at url (as a gateway process of its own has).
func spendOf(t *testing.T, url, owner string) *Spend {
	t.Helper()
	s := process(t, url, nil).Spend(owner)
	t.Cleanup(func() { s.Close() })
	return s
}

func figures(t *testing.T, s *Spend, key string) SpendFigures {
	t.Helper()
	f, err := s.Figures(key)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Two gateways reserving at once against one client's cap and the
// gateway's: exactly as many worst cases are admitted as the smaller cap
// holds, whoever asks, and settling them leaves their cost spent.
func TestSharedSpendReservesAtomicallyAcrossGateways(t *testing.T) {
	url := testredis.EmptyDB(t, 4)
	a, b := spendOf(t, url, "gw-a"), spendOf(t, url, "gw-b")
	budgets := []spend.Budget{{Key: "client:alice", Name: "alice", Cap: 1000}, {Key: "gateway", Name: "gw", Cap: 5000}}
	var admitted atomic.Int64
	var mu sync.Mutex
	var ids []func()
	var wg sync.WaitGroup
	for i := range 40 {
		s := []*Spend{a, b}[i%2]
		wg.Go(func() {
			id, err := s.Reserve(budgets, 100, false, "")
			var ce *spend.CapError
			switch {
			case err == nil:
				admitted.Add(1)
				mu.Lock()
				ids = append(ids, func() { s.End(id, budgets, spend.OpSettle, 60) })
				mu.Unlock()
			case errors.As(err, &ce) && ce.Name == "alice" && ce.Cap == 1000:
			default:
				t.Errorf("reserve: %v", err)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 10 {
		t.Errorf("%d worst cases of 100 admitted under a cap of 1000 by two gateways, want 10", n)
	}
	for _, end := range ids {
		end()
	}
	for _, k := range []string{"client:alice", "gateway"} {
		if f := figures(t, a, k); f != (SpendFigures{Spent: 600}) {
			t.Errorf("%s: %+v after settling 10 at 60, want spent 600 and nothing reserved", k, f)
		}
	}
}

// A charge moves cost to spent, a settle adds what the charges did not,
// a release frees the rest, a keep holds it for good, a settle past the
// worst case is spent all the same, and an end repeated does nothing.
func TestSharedSpendEnds(t *testing.T) {
	url := testredis.EmptyDB(t, 4)
	s := spendOf(t, url, "gw-a")
	bg := []spend.Budget{{Key: "k", Name: "k", Cap: 10_000}}
	res := func() string {
		id, err := s.Reserve(bg, 100, false, "")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := res()
	s.End(id, bg, spend.OpCharge, 30)
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 30, Reserved: 70}) {
		t.Errorf("after a charge of 30 on 100: %+v", f)
	}
	s.End(id, bg, spend.OpSettle, 50)
	s.End(id, bg, spend.OpSettle, 50) // again: nothing
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 50}) {
		t.Errorf("after settling at 50: %+v", f)
	}
	s.End(res(), bg, spend.OpRelease, 0)
	s.End(res(), bg, spend.OpKeep, 0)
	s.End(res(), bg, spend.OpSettle, 150)
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 200, Held: 100}) {
		t.Errorf("after a release, a keep and a settle at 150: %+v, want spent 200, held 100", f)
	}
}

// A gateway that dies leaves its reservations counted; one started on its
// state directory (the same owner) keeps each at its worst case for good,
// except those it makes again itself (a batch's hold), which it releases.
// Its ledger's spend seeds a budget once, however often it starts (what
// it kept counts as part of it: the ledger holds a dead process's
// attempts at their worst case).
func TestSharedSpendReconcileAndSeed(t *testing.T) {
	url := testredis.EmptyDB(t, 4)
	dead := process(t, url, nil).Spend("gw-a") // its reservations never end
	t.Cleanup(func() { dead.stop(); <-dead.done })
	bg := []spend.Budget{{Key: "k", Name: "k", Cap: 10_000}}
	for _, tag := range []string{"", "batch", ""} {
		if _, err := dead.Reserve(bg, 100, false, tag); err != nil {
			t.Fatal(err)
		}
	}
	again := spendOf(t, url, "gw-a")
	if f := figures(t, again, "k"); f != (SpendFigures{Reserved: 300}) {
		t.Errorf("while the gateway is dead: %+v, want its 300 reserved", f)
	}
	n, sum, err := again.Reconcile(func(tag string) bool { return tag == "batch" })
	if err != nil || n != 2 || sum != 200 {
		t.Errorf("reconcile: %d kept, %s, %v: want 2 kept at 200", n, sum, err)
	}
	if f := figures(t, again, "k"); f != (SpendFigures{Held: 200}) {
		t.Errorf("after the restart: %+v, want 200 held and nothing reserved", f)
	}
	if open, err := again.Open(); err != nil || open != 0 {
		t.Errorf("%d reservations still open (%v)", open, err)
	}
	for range 2 {
		if err := again.Seed("k", 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := spendOf(t, url, "gw-b").Seed("k", 7); err != nil {
		t.Fatal(err)
	}
	if f := figures(t, again, "k"); f != (SpendFigures{Spent: 807, Held: 200}) {
		t.Errorf("seeded twice by gw-a (a ledger of 1000, 200 of it kept) and once by gw-b (7): %+v, want spent 807, held 200", f)
	}
}

// With Redis out of reach a reservation under a cap is refused
// (ErrUnavailable), a forced one (a batch re-attached) and the ends wait,
// in order, and reach Redis when it answers again.
func TestSharedSpendRedisDown(t *testing.T) {
	rs := testredis.Start(t)
	s := spendOf(t, rs.URL(), "gw-a")
	bg := []spend.Budget{{Key: "k", Name: "k", Cap: 10_000}}
	rs.Stop()
	if _, err := s.Reserve(bg, 100, false, ""); !errors.Is(err, spend.ErrUnavailable) {
		t.Fatalf("reserve with Redis down: %v, want ErrUnavailable", err)
	}
	id, err := s.Reserve(bg, 100, true, "")
	if err != nil {
		t.Fatal(err)
	}
	s.End(id, bg, spend.OpKeep, 0)
	if n := s.Pending(); n != 2 {
		t.Errorf("%d waiting for Redis, want the hold and its keep", n)
	}
	rs.Restart()
	s.flush(context.Background())
	if n := s.Pending(); n != 0 {
		t.Errorf("%d still waiting once Redis answers", n)
	}
	if f := figures(t, s, "k"); f != (SpendFigures{Held: 100}) {
		t.Errorf("after Redis came back: %+v, want the kept 100 held", f)
	}
}

// Seeding again adds what the ledger gained beyond what the budget
// counted of that gateway (its reservations' charges, settles and keeps,
// and earlier seeds): spend made while it ran without --shared reaches
// Redis at its next shared start, and nothing is counted twice.
func TestSharedSpendSeedAddsWhatTheLedgerGained(t *testing.T) {
	url := testredis.EmptyDB(t, 4)
	s := spendOf(t, url, "gw-a")
	bg := []spend.Budget{{Key: "k", Name: "k", Cap: 10_000}}
	seed := func(ledger cost.Nanos) {
		t.Helper()
		if err := s.Seed("k", ledger); err != nil {
			t.Fatal(err)
		}
	}
	seed(1000)
	id, err := s.Reserve(bg, 300, false, "")
	if err != nil {
		t.Fatal(err)
	}
	s.End(id, bg, spend.OpCharge, 100)
	s.End(id, bg, spend.OpSettle, 250)
	id, err = s.Reserve(bg, 40, false, "")
	if err != nil {
		t.Fatal(err)
	}
	s.End(id, bg, spend.OpKeep, 0)
	// The ledger holds the 1000, the settled 250 and the kept 40; then
	// 500 more spent without --shared.
	seed(1290)
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 1250, Held: 40}) {
		t.Errorf("seeded again with nothing new: %+v, want spent 1250, held 40", f)
	}
	seed(1790)
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 1750, Held: 40}) {
		t.Errorf("seeded after 500 spent unshared: %+v, want spent 1750, held 40", f)
	}
	seed(1790)
	if err := spendOf(t, url, "gw-b").Seed("k", 5); err != nil {
		t.Fatal(err)
	}
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 1755, Held: 40}) {
		t.Errorf("seeded again, and by gw-b (5): %+v, want spent 1755, held 40", f)
	}
}

// A budget seeded before the counted fields existed (seeded:<owner>) is
// taken as holding that gateway's ledger, as it was then: upgrading
// counts nothing twice.
func TestSharedSpendSeedAfterTheOldMarker(t *testing.T) {
	url := testredis.EmptyDB(t, 4)
	s := spendOf(t, url, "gw-a")
	ctx := context.Background()
	if err := s.b.rdb.HSet(ctx, spendBudgetKey("k"), "spent", 900, "seeded:gw-a", 1).Err(); err != nil {
		t.Fatal(err)
	}
	for _, ledger := range []cost.Nanos{900, 950} {
		if err := s.Seed("k", ledger); err != nil {
			t.Fatal(err)
		}
	}
	if f := figures(t, s, "k"); f.Spent != 950 {
		t.Errorf("spent %s, want 950 (the old seed's 900, then the 50 the ledger gained)", f.Spent)
	}
}

// Redis restarted without its data: before it judges another
// reservation it is seeded again from the ledger and given this process's
// open reservations again (at what is left of them, their charges spent),
// and capped reservations are refused for a few heartbeats while the
// other gateways add theirs, so the cap holds; their ends then reach it; ends of reservations it
// never saw again do nothing. The heartbeat does the same for a process
// that reserves nothing.
func TestSharedSpendRedisRestartedEmpty(t *testing.T) {
	rs := testredis.Start(t)
	var mu sync.Mutex
	ledger := cost.Nanos(600)
	ledgerOf := func() map[string]cost.Nanos {
		mu.Lock()
		defer mu.Unlock()
		return map[string]cost.Nanos{"k": ledger}
	}
	s := process(t, rs.URL(), nil).Spend("gw-a")
	t.Cleanup(func() { s.Close() })
	if err := s.SeedFrom(ledgerOf); err != nil {
		t.Fatal(err)
	}
	// Its heartbeat stopped, its next reserve finds the loss, at a
	// known point (the idle gateways below show the heartbeat's part).
	s.stop()
	<-s.done
	bg := []spend.Budget{{Key: "k", Name: "k", Cap: 1000}}
	open, err := s.Reserve(bg, 200, false, "")
	if err != nil {
		t.Fatal(err)
	}
	s.End(open, bg, spend.OpCharge, 30)
	done, err := s.Reserve(bg, 100, false, "")
	if err != nil {
		t.Fatal(err)
	}
	rs.Stop()
	rs.Restart()
	// done ends while Redis has lost it: its cost reaches the ledger
	// (first, as a gateway records it), its end finds nothing in Redis.
	mu.Lock()
	ledger += 80
	mu.Unlock()
	s.End(done, bg, spend.OpSettle, 80)
	// The first reservation after the loss finds it, and is refused
	// while every running gateway adds its part back.
	if _, err := s.Reserve(bg, 1, false, ""); !errors.Is(err, spend.ErrUnavailable) {
		t.Fatalf("reserve right after Redis restarted empty: %v, want ErrUnavailable while it is rebuilt", err)
	}
	time.Sleep(rebuildFor*s.b.every + 50*time.Millisecond)
	// Committed: 680 of the ledger, 30 charged to open and its 170 left:
	// 880; 150 more would pass 1000.
	var ce *spend.CapError
	if _, err := s.Reserve(bg, 150, false, ""); !errors.As(err, &ce) {
		t.Fatalf("reserve of 150 after Redis restarted empty: %v, want a refusal (880 of 1000 committed); %+v", err, figures(t, s, "k"))
	}
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 710, Reserved: 170}) {
		t.Errorf("after Redis restarted empty: %+v, want spent 710 (ledger 680, 30 charged), 170 reserved", f)
	}
	s.End(open, bg, spend.OpSettle, 50)
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 730}) {
		t.Errorf("after the open one settled at 50: %+v, want spent 730", f)
	}

	// Processes that reserve nothing: their heartbeats seed Redis again.
	for owner, l := range map[string]cost.Nanos{"gw-b": 7, "gw-c": 680} {
		idle := process(t, rs.URL(), nil).Spend(owner)
		t.Cleanup(func() { idle.Close() })
		if err := idle.SeedFrom(func() map[string]cost.Nanos { return map[string]cost.Nanos{"k": l} }); err != nil {
			t.Fatal(err)
		}
	}
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 1417}) {
		t.Fatalf("seeded by gw-b (7) and gw-c (680): %+v, want spent 1417", f)
	}
	rs.Stop()
	rs.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for figures(t, s, "k").Spent != 687 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if f := figures(t, s, "k"); f != (SpendFigures{Spent: 687}) {
		t.Errorf("20 s after Redis restarted empty again: %+v, want the ledgers of gw-b (7) and gw-c (680) spent", f)
	}
}
