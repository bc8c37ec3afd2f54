package shared

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
)

// Gateway campaign seed 379 (issue 28): a gateway cut off from Redis had
// told Redis, at its last renewal, to keep its slots for a grace of 1.25 ×
// the age of its oldest request then (1.6 s); that request went on running
// while it was cut off, and the gateway still admitted one more on its
// lease, near the lease's end. The new request ran 4 s, past the grace:
// Redis had meanwhile given the other gateway the whole cap, and the API
// saw 5 in flight on a cap of 4. A request lasting what the grace the
// process would ask for now assumes must end before Redis gives its slots
// away, or it is not admitted until a renewal has told Redis the longer
// grace.
//
// The lane's clock is a synctest bubble's (Redis' own clock, which only
// decides when the others reclaim, is not needed here): a request admitted
// at t0, a renewal at t0+10 s (grace 12.5 s: Redis keeps the slots until
// t0+27.5 s), then the process is cut off and the request is still running
// at t0+13 s, within the lease (4.5 s from the renewal). A request admitted
// then and lasting 1.25 × 13 s would end at t0+29.25 s, after Redis gave
// its slot away.
func TestSharedAdmitsOnlyWhatTheGraceInRedisCovers(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, err := Open(ctx, Config{URL: url, Orgs: []org.Org{o}, TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		g := b.NewGate(lane(4)).(*Gate)
		if err := g.renew(ctx); err != nil {
			t.Fatal(err)
		}
		// The whole cap at t0, all but one answered at once: the lane
		// wants the cap at the next renewal.
		t0 := time.Now()
		ps := fill(g)
		if len(ps) != 4 {
			t.Fatalf("admitted %d at the start, want the cap 4", len(ps))
		}
		old := ps[0]
		for _, p := range ps[1:] {
			g.Done(t0, p, ok200)
		}
		time.Sleep(10 * time.Second)
		if err := g.renew(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := g.graceFor(time.Now()), 12500*time.Millisecond; got != want {
			t.Fatalf("grace sent %v, want %v", got, want)
		}
		if g.grant != 4 {
			t.Fatalf("granted %d, want the cap 4", g.grant)
		}
		// Cut off from Redis: no renewal from here.
		time.Sleep(3 * time.Second)
		if _, _, ok := g.TryAdmit(time.Now(), one); ok {
			t.Fatalf("admitted at t0+13s on a lease Redis keeps until t0+27.5s, while the grace assumes a request lasts %v", g.graceFor(time.Now()))
		}
		g.Done(time.Now(), old, ok200) // it lasted 13 s
		if _, _, ok := g.TryAdmit(time.Now(), one); ok {
			t.Fatal("admitted after an answer of 13 s on a grace of 12.5 s")
		}
		// A renewal tells Redis the longer grace: admitted again, on a
		// permit not sent past what Redis keeps for it.
		if err := g.renew(ctx); err != nil {
			t.Fatal(err)
		}
		p, _, ok := g.TryAdmit(time.Now(), one)
		if !ok {
			t.Fatal("not admitted after a renewal that sent the longer grace")
		}
		if p.Until.IsZero() || p.Until.After(g.leaseMono) {
			t.Fatalf("permit until %v, past the lease's end %v", p.Until, g.leaseMono)
		}
		g.Done(time.Now(), p, ok200)
	})
}

// Gateway campaign seed 379 (issue 28), the other half: a request admitted
// while the process is cut off from Redis is one Redis never hears of, and
// the grace Redis keeps its slots for was sized from requests that had
// started before the last renewal; one admitted near the lease's end has
// only a little more than that grace to end in, and the API's latency
// varies by more than the quarter the grace adds (the cut-off gateway's
// requests lasted 2 to 4.7 s). So once a renewal has failed the process
// admits nothing more, even within its lease, until a renewal answers.
func TestSharedAdmitsNothingOnceARenewalFailed(t *testing.T) {
	srv := testredis.URL(t)
	px := netproxy.Start(t, srv[len("redis://"):len(srv)-len("/0")])
	o := freshOrg("a")
	ctx := context.Background()
	// A renewal times out after a quarter of the TTL; the lease lasts
	// nine tenths of it: the lease is still current when the renewal has
	// failed.
	b, err := Open(ctx, Config{URL: "redis://" + px.Addr + "/0", Orgs: []org.Org{o}, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	g := b.NewGate(lane(4)).(*Gate)
	b.renewAll(ctx)
	p, _, ok := g.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("not admitted on a fresh lease")
	}
	px.BlackHole(true)
	b.renewAll(ctx)
	if !b.outOfReach() {
		t.Fatal("a renewal through the black hole did not fail")
	}
	g.mu.Lock()
	current := g.leaseCurrent(time.Now())
	g.mu.Unlock()
	if !current {
		t.Fatal("the lease ended before the check: the test cannot tell")
	}
	if q, _, ok := g.TryAdmit(time.Now(), one); ok {
		g.Done(time.Now(), q, ok200)
		t.Fatal("admitted within the lease after a renewal failed")
	}
	g.Done(time.Now(), p, ok200)
	px.BlackHole(false)
	b.renewAll(ctx)
	if q, _, ok := g.TryAdmit(time.Now(), one); !ok {
		t.Fatal("not admitted after a renewal answered again")
	} else {
		g.Done(time.Now(), q, ok200)
	}
}

// Gateway campaign seed 379 (issue 28), the rest: a request already in
// flight when its process was cut off from Redis (mallory's long streams,
// 1.9-5.1 s where the requests answered before had taken about 1 s) ran
// past the grace the last renewal sent, 1.25 × the longest request seen,
// and Redis gave its slot to the other gateway meanwhile: 5 in flight on a
// cap of 4. The grace covers every request in flight until its bound (twice
// the API's own bound for its max_tokens), not only the requests seen.
//
// On the wall clock (Redis' clock decides when the other process reclaims):
// process A, speed 40, admits one request of max_tokens 4,096 (its bound,
// 2 × 115.2 API s, is 5.76 s here), renews, and goes silent; process B on
// the same key and cap 1 is not granted the slot before A's request's bound
// has passed, and is granted it soon after.
//
// The same for an OpenAI request, whose demand charges its
// max_completion_tokens × n to the one tokens bucket as input and says
// what it may generate in Generates (before, its bound was the shortest
// request's).
func TestSharedGraceCoversEachRequestUntilItsBound(t *testing.T) {
	url := testredis.URL(t)
	for name, long := range map[string]gate.Demand{
		"anthropic": {EstInput: 100, MaxTokens: 4096},
		"openai":    {EstInput: 100 + 4096, Generates: 4096},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			graceCoversRequest(t, url, long)
		})
	}
}

func graceCoversRequest(t *testing.T, url string, long gate.Demand) {
	o := freshOrg("a")
	ctx := context.Background()
	lc := lane(1)
	lc.Speed = 40
	a, err := Open(ctx, Config{URL: url, Orgs: []org.Org{o}, TTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ga := a.NewGate(lc).(*Gate)
	bound := ga.requestBound(long.Output())
	if want := time.Duration(float64(2*gate.AttemptBound(4096)) / 40); bound != want {
		t.Fatalf("bound %v, want %v", bound, want)
	}
	var p gate.Permit
	for tries := 0; ; tries++ {
		if err := ga.renew(ctx); err != nil {
			t.Fatal(err)
		}
		var ok bool
		if p, _, ok = ga.TryAdmit(time.Now(), long); ok {
			break
		}
		if tries == 3 {
			t.Fatal("A never admitted its request")
		}
	}
	admitted := time.Now()
	if err := ga.renew(ctx); err != nil {
		t.Fatal(err)
	}
	// A is silent from here, its request still running.
	b := process(t, url, []org.Org{o})
	gb := b.NewGate(lc)
	var granted time.Duration
	for {
		if q, _, ok := gb.TryAdmit(time.Now(), one); ok {
			granted = time.Since(admitted)
			gb.Done(time.Now(), q, ok200)
			break
		}
		if time.Since(admitted) > bound+5*time.Second {
			t.Fatalf("B not granted A's slot %v after A's request began, its bound %v", time.Since(admitted), bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if granted < bound-100*time.Millisecond {
		t.Errorf("B was granted A's slot %v after A's request began, while it may run %v: two in flight on a cap of 1", granted.Round(time.Millisecond), bound)
	}
	t.Logf("B granted A's slot %v after A's request began (its bound %v)", granted.Round(time.Millisecond), bound)
	ga.Done(time.Now(), p, ok200)
}
