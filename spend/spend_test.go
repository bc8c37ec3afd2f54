package spend_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/spend"
)

func TestGateReserveSettleRelease(t *testing.T) {
	g := spend.New("--max-cost", 100, 10)
	a, err := g.Reserve(50)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(41); !errors.Is(err, spend.ErrCapReached) {
		t.Fatalf("10 spent + 50 reserved + 41 > 100: got %v, want ErrCapReached", err)
	}
	var ce *spend.CapError
	_, err = g.Reserve(41)
	if !errors.As(err, &ce) || ce.Cap != 100 || ce.Spent != 10 || ce.Reserved != 50 || ce.Want != 41 || ce.Name != "--max-cost" {
		t.Fatalf("CapError %+v", ce)
	}
	b, err := g.Reserve(40) // exactly at the cap
	if err != nil {
		t.Fatal(err)
	}
	a.Settle(20)
	if g.Spent() != 30 || g.Reserved() != 40 || g.Open() != 1 {
		t.Fatalf("after settle: spent %s reserved %s open %d", g.Spent(), g.Reserved(), g.Open())
	}
	a.Settle(20) // ended: nothing
	a.Release()
	b.Release()
	if g.Spent() != 30 || g.Reserved() != 0 || g.Open() != 0 {
		t.Fatalf("after release: spent %s reserved %s", g.Spent(), g.Reserved())
	}
	var nilRes *spend.Reservation
	nilRes.Settle(5)
	nilRes.Keep()
}

func TestGateChargeThenSettle(t *testing.T) {
	g := spend.New("", 100, 0)
	r, _ := g.Reserve(60)
	r.Charge(25)
	if g.Spent() != 25 || g.Reserved() != 35 {
		t.Fatalf("charge: spent %s reserved %s", g.Spent(), g.Reserved())
	}
	r.Charge(50) // past the worst case: spent all the same, nothing left reserved
	if g.Spent() != 75 || g.Reserved() != 0 {
		t.Fatalf("charge past worst: spent %s reserved %s", g.Spent(), g.Reserved())
	}
	r.Settle(75) // what was charged: nothing more
	if g.Spent() != 75 || g.Open() != 0 {
		t.Fatalf("settle: spent %s", g.Spent())
	}
}

func TestGateKeepHoldsForGood(t *testing.T) {
	g := spend.New("", 100, 0)
	r, _ := g.Reserve(60)
	r.Charge(10)
	r.Keep()
	if g.Held() != 50 || g.Reserved() != 0 || g.Spent() != 10 || g.Committed() != 60 {
		t.Fatalf("keep: held %s reserved %s spent %s", g.Held(), g.Reserved(), g.Spent())
	}
	if _, err := g.Reserve(41); !errors.Is(err, spend.ErrCapReached) {
		t.Fatalf("a kept worst case was given back: %v", err)
	}
	r.Release() // ended: still held
	if g.Held() != 50 {
		t.Fatalf("release after keep freed the hold")
	}
}

func TestGateHoldIgnoresCap(t *testing.T) {
	g := spend.New("", 100, 90)
	r := g.Hold(50)
	if g.Committed() != 140 {
		t.Fatalf("committed %s", g.Committed())
	}
	if _, err := g.Reserve(1); !errors.Is(err, spend.ErrCapReached) {
		t.Fatalf("over the cap by a hold, a reservation passed: %v", err)
	}
	r.Settle(5)
	if _, err := g.Reserve(5); err != nil {
		t.Fatalf("room again: %v", err)
	}
}

func TestGateChildPassesBoth(t *testing.T) {
	root := spend.New("gateway", 100, 0)
	a := root.Child("client a", 70, 0)
	b := root.Child("client b", 70, 0)
	ra, err := a.Reserve(60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(20); !errorsName(err, "client a") {
		t.Fatalf("a's own cap: %v", err)
	}
	if _, err := b.Reserve(50); !errorsName(err, "gateway") {
		t.Fatalf("the gateway's cap: %v", err)
	}
	if b.Reserved() != 0 || root.Reserved() != 60 {
		t.Fatalf("a refused reservation left b %s, root %s reserved", b.Reserved(), root.Reserved())
	}
	rb, err := b.Reserve(40)
	if err != nil {
		t.Fatal(err)
	}
	ra.Settle(10)
	rb.Settle(30)
	if root.Spent() != 40 || a.Spent() != 10 || b.Spent() != 30 || root.Reserved() != 0 {
		t.Fatalf("root %s, a %s, b %s", root.Spent(), a.Spent(), b.Spent())
	}
	if !a.Capped() || spend.New("", 0, 0).Capped() || !spend.New("", 5, 0).Child("", 0, 0).Capped() {
		t.Fatal("Capped")
	}
}

func errorsName(err error, name string) bool {
	var ce *spend.CapError
	return errors.As(err, &ce) && ce.Name == name
}

func TestGateChangedWakes(t *testing.T) {
	g := spend.New("", 10, 0)
	r, _ := g.Reserve(10)
	ch := g.Changed()
	select {
	case <-ch:
		t.Fatal("closed before any change")
	default:
	}
	r.Settle(3)
	select {
	case <-ch:
	default:
		t.Fatal("not woken by a settle")
	}
}

// TestGateNeverPassesCapConcurrently: many goroutines reserve, charge,
// settle, release and keep at once on a gate and its children; at no time
// does any gate's committed figure pass its cap, and the figures add up at
// the end. Run it with -race.
func TestGateNeverPassesCapConcurrently(t *testing.T) {
	const capRoot, capChild = 1_000_000, 400_000
	root := spend.New("root", capRoot, 0)
	kids := []*spend.Gate{root.Child("a", capChild, 0), root.Child("b", capChild, 0), root.Child("c", capChild, 0), root}
	var wg sync.WaitGroup
	var over atomic.Int64
	var spent [4]atomic.Int64
	var held [4]atomic.Int64
	check := func() {
		if c := root.Committed(); c > capRoot {
			over.Add(1)
		}
		for _, k := range kids[:3] {
			if c := k.Committed(); c > capChild {
				over.Add(1)
			}
		}
	}
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			k := w % 4
			g := kids[k]
			for range 3000 {
				worst := cost.Nanos(1 + rng.IntN(50_000))
				r, err := g.Reserve(worst)
				if err != nil {
					if !errors.Is(err, spend.ErrCapReached) {
						panic(err)
					}
					check()
					continue
				}
				check()
				switch rng.IntN(4) {
				case 0:
					r.Release()
				case 1:
					c := cost.Nanos(rng.Int64N(int64(worst) + 1))
					spent[k].Add(int64(c))
					r.Settle(c)
				case 2:
					c := cost.Nanos(rng.Int64N(int64(worst)/2 + 1))
					r.Charge(c)
					spent[k].Add(int64(c))
					r.Settle(c)
				default:
					if rng.IntN(50) == 0 { // rare, or the gates fill up for good
						held[k].Add(int64(worst))
						r.Keep()
					} else {
						r.Release()
					}
				}
				check()
			}
		})
	}
	wg.Wait()
	if n := over.Load(); n > 0 {
		t.Fatalf("a cap was passed %d times", n)
	}
	var totalSpent, totalHeld int64
	for k := range 4 {
		totalSpent += spent[k].Load()
		totalHeld += held[k].Load()
		if k < 3 && (int64(kids[k].Spent()) != spent[k].Load() || int64(kids[k].Held()) != held[k].Load()) {
			t.Fatalf("gate %d: spent %s held %s; want %d, %d", k, kids[k].Spent(), kids[k].Held(), spent[k].Load(), held[k].Load())
		}
	}
	if int64(root.Spent()) != totalSpent || int64(root.Held()) != totalHeld || root.Reserved() != 0 || root.Open() != 0 {
		t.Fatalf("root: spent %s held %s reserved %s open %d; want %d, %d, 0, 0", root.Spent(), root.Held(), root.Reserved(), root.Open(), totalSpent, totalHeld)
	}
	t.Logf("root spent %s, held %s", root.Spent(), root.Held())
}

func ExampleGate() {
	g := spend.New("--max-cost", 1_000_000, 0) // $0.001 cap
	r, err := g.Reserve(600_000)               // a request's worst case
	fmt.Println(err)
	_, err = g.Reserve(600_000)
	fmt.Println(errors.Is(err, spend.ErrCapReached))
	r.Settle(150_000) // its usage
	_, err = g.Reserve(600_000)
	fmt.Println(err, g.Spent())
	// Output:
	// <nil>
	// true
	// <nil> $0.000150
}

func TestGateCheckReservesNothing(t *testing.T) {
	g := spend.New("", 100, 0).Child("", 0, 0)
	if err := g.Check(100); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(101); !errors.Is(err, spend.ErrCapReached) {
		t.Fatalf("check past the parent's cap: %v", err)
	}
	if g.Reserved() != 0 || g.Open() != 0 {
		t.Fatal("Check reserved")
	}
}
