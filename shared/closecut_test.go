package shared

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
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
