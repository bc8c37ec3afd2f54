package spend

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
)

// fakeBackend admits up to cap per key and records every end.
type fakeBackend struct {
	mu     sync.Mutex
	caps   map[string]cost.Nanos
	used   map[string]cost.Nanos
	down   bool
	n      int
	ends   []string
	tagsOf map[string]string
}

func (b *fakeBackend) Reserve(budgets []Budget, worst cost.Nanos, force bool, tag string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down && !force {
		return "", fmt.Errorf("%w: test", ErrUnavailable)
	}
	for _, bg := range budgets {
		if !force && bg.Cap > 0 && b.used[bg.Key]+worst > bg.Cap {
			return "", &CapError{Name: bg.Name, Cap: bg.Cap, Want: worst}
		}
	}
	for _, bg := range budgets {
		b.used[bg.Key] += worst
	}
	b.n++
	id := fmt.Sprint(b.n)
	b.tagsOf[id] = tag
	return id, nil
}

func (b *fakeBackend) End(id string, budgets []Budget, op Op, amount cost.Nanos) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ends = append(b.ends, fmt.Sprintf("%s %d %d %d", id, len(budgets), op, amount))
}

// A shared gate's cap is judged by its backend, once for every shared
// gate of the chain, with what every process holds there (here: more than
// this gate's own figures show); a local child's cap is still judged here;
// a refusal or an unreachable backend reserves nothing; ends reach the
// backend once each.
func TestSharedGateIsJudgedByItsBackend(t *testing.T) {
	b := &fakeBackend{used: map[string]cost.Nanos{"client": 900}, tagsOf: map[string]string{}}
	top := NewShared("gw", 0, 0, b, "gateway")
	alice := top.SharedChild("alice", 1000, 0, b, "client")
	batch := alice.Child("batch", 50, 0)
	if _, err := alice.Reserve(200); !errors.Is(err, ErrCapReached) {
		t.Errorf("200 more on alice's 1000 with 900 used by other processes: %v, want refused", err)
	}
	if alice.Reserved() != 0 || top.Open() != 0 {
		t.Errorf("a refusal left %s reserved, %d open", alice.Reserved(), top.Open())
	}
	if _, err := batch.Reserve(60); !errors.Is(err, ErrCapReached) {
		t.Errorf("60 on a local cap of 50: %v, want refused here", err)
	}
	r, err := batch.ReserveTagged(40, "batch")
	if err != nil {
		t.Fatal(err)
	}
	if b.used["client"] != 940 || b.used["gateway"] != 40 || b.tagsOf["1"] != "batch" {
		t.Errorf("backend after 40: %v, tags %v", b.used, b.tagsOf)
	}
	r.Charge(10)
	r.Settle(30)
	r.Release() // ended already: nothing
	if want := []string{"1 2 0 10", "1 2 1 30"}; fmt.Sprint(b.ends) != fmt.Sprint(want) {
		t.Errorf("ends %q, want %q", b.ends, want)
	}
	if alice.Spent() != 30 || alice.Reserved() != 0 || top.Open() != 0 {
		t.Errorf("alice's own figures: spent %s, reserved %s, %d open", alice.Spent(), alice.Reserved(), top.Open())
	}
	b.down = true
	if _, err := alice.Reserve(1); !errors.Is(err, ErrUnavailable) {
		t.Errorf("backend down: %v, want ErrUnavailable", err)
	}
	h := alice.Hold(5) // forced: never refused
	h.Keep()
	if alice.Held() != 5 || b.ends[len(b.ends)-1] != "2 2 3 0" {
		t.Errorf("hold kept: held %s, ends %q", alice.Held(), b.ends)
	}
	// Without a cap anywhere in the chain an unreachable backend refuses
	// nothing: the work is counted here alone.
	free := NewShared("free", 0, 0, b, "free")
	if _, err := free.Reserve(1e9); err != nil || free.Reserved() != 1e9 {
		t.Errorf("uncapped shared gate with its backend down: %v, %s reserved here", err, free.Reserved())
	}
}

// CountLocal (a resumed batch's spend, which the backend counted when its
// earlier process charged it) adds to this process's figures of the chain
// and reaches no backend: counted there twice it would refuse a client
// early.
func TestCountLocalReachesNoBackend(t *testing.T) {
	b := &fakeBackend{used: map[string]cost.Nanos{}, tagsOf: map[string]string{}}
	top := NewShared("gw", 0, 0, b, "gateway")
	alice := top.SharedChild("alice", 1000, 100, b, "client")
	alice.CountLocal(250)
	alice.CountLocal(-5) // nothing
	if alice.Spent() != 350 || top.Spent() != 250 {
		t.Errorf("spent: alice %s, gateway %s; want 350 and 250", alice.Spent(), top.Spent())
	}
	if b.n != 0 || len(b.ends) != 0 || len(b.used) != 0 {
		t.Errorf("the backend saw %d reservations, ends %q, used %v: want none", b.n, b.ends, b.used)
	}
}
