package shared_test

import (
	"context"
	"fmt"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/shared"
)

// One process's share of a key's budget kept in Redis: open the budget,
// make the gate of one lane (a run passes Budget.NewGate as
// dispatch.Config.NewGate, and every engine gets its lanes' gates from
// it), start the lease renewals, and admit a request once Redis has
// granted slots. Every process that opens a budget on the same Redis with
// the same key shares the lane's slots, limit and holds.
//
// It needs a Redis server on localhost:6379, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	o := org.Org{Name: "research", Key: org.NewKey("sk-ant-…")} // only its fingerprint reaches Redis
	b, err := shared.Open(ctx, shared.Config{URL: "redis://localhost:6379/0", Orgs: []org.Org{o}})
	if err != nil {
		panic(err) // wraps shared.ErrUnreachable when Redis does not answer
	}
	defer b.Close() // hands this process's slots back at once

	g := b.NewGate(gate.LaneConfig{Org: o.Name, Pool: anthropic.PoolSonnet4, Cap: 50})
	b.Start(ctx)

	// The gate admits nothing it was not granted: wait for the first
	// renewal (an engine waits for the gate's wake instead of polling).
	d := gate.Demand{EstInput: 1200, MaxTokens: 256}
	for {
		p, wait, ok := g.TryAdmit(time.Now(), d)
		if ok {
			// … send the request, then say how it went:
			g.Done(time.Now(), p, gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}})
			break
		}
		time.Sleep(min(max(wait, 10*time.Millisecond), 100*time.Millisecond))
	}
	s := g.Snapshot(time.Now())
	fmt.Printf("%s/%s: limit %v of a cap of %d, %d in flight\n", s.Org, s.Pool, s.Limit, s.Cap, s.InFlight)
	fmt.Printf("processes seen on %s: %d\n", b.Host(), b.Stats().ProcessesSeen)
}
