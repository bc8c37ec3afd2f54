package shared

import (
	"context"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/netproxy"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
)

var ok200 = gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}}

// openIdle opens a budget whose renewal loop is not started: the test
// renews by hand, and a process that stops renewing is one that is paused
// or cut off from Redis.
func openIdle(t *testing.T, url string, orgs []org.Org) *Budget {
	t.Helper()
	b, err := Open(context.Background(), Config{URL: url, Orgs: orgs, TTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Issue 20, case 1: a process paused past its lease comes back and must
// not admit on its old grant before it renews (another process may have
// the whole cap by then).
func TestSharedPausedProcessAdmitsNothingPastItsLease(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	a := openIdle(t, url, []org.Org{o})
	ga := a.NewGate(lane(100))
	a.renewAll(context.Background())
	ps := fill(ga)
	if len(ps) != 100 {
		t.Fatalf("admitted %d, want 100", len(ps))
	}
	for _, p := range ps {
		ga.Done(time.Now(), p, ok200)
	}
	// Paused: no renewal for longer than the lease.
	time.Sleep(a.ttl)
	if n := len(fill(ga)); n != 0 {
		t.Fatalf("admitted %d on a lease that ended %v ago", n, a.margin)
	}
	a.renewAll(context.Background())
	if n := len(fill(ga)); n != 100 {
		t.Fatalf("after renewing: admitted %d, want 100", n)
	}
}

// Issue 20, case 2: a process cut off from Redis (but not from the API)
// stops admitting at its lease's end, and the other process takes its
// slots only a grace after that: at no moment do the two have more than
// the cap in flight, counting the cut-off process's requests that were
// already in flight (which end within their latency, here a quarter of
// the lease).
func TestSharedCutOffProcessNeverAddsToReclaimedSlots(t *testing.T) {
	srv := testredis.URL(t)
	o := freshOrg("a")
	px := netproxy.Start(t, srv[len("redis://"):len(srv)-len("/0")])
	a := process(t, "redis://"+px.Addr+"/0", []org.Org{o})
	b := process(t, srv, []org.Org{o})
	ga, gb := a.NewGate(lane(100)), b.NewGate(lane(100))
	var pa, pb []gate.Permit
	// Each takes at most 40 here: a process whose first renewal came
	// before the other's was granted the whole cap, and had it filled it
	// (these permits are not done until the cut) the other could never
	// hold a share (a CI run waited 20 s for it).
	eventually(t, "both hold a share", func() bool {
		pa = append(pa, fillUpTo(ga, 40-len(pa))...)
		pb = append(pb, fillUpTo(gb, 40-len(pb))...)
		return len(pa) > 20 && len(pb) > 20
	}, a, b)
	px.BlackHole(true)
	cut := time.Now()
	latency := a.ttl / 4
	newA, maxSum := 0, 0
	for time.Since(cut) < a.ttl+a.grace+time.Second {
		if time.Since(cut) > latency && len(pa) > 0 {
			for _, p := range pa {
				ga.Done(time.Now(), p, ok200)
			}
			pa = nil
		}
		got := fill(ga)
		if time.Since(cut) > a.ttl {
			newA += len(got)
		}
		pa = append(pa, got...)
		pb = append(pb, fill(gb)...)
		maxSum = max(maxSum, len(pa)+len(pb))
		if len(pa)+len(pb) > 100 {
			t.Fatalf("%v after the cut: %d + %d in flight, cap 100", time.Since(cut).Round(time.Millisecond), len(pa), len(pb))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if newA != 0 {
		t.Fatalf("the cut-off process admitted %d after its lease", newA)
	}
	if len(pb) != 100 {
		t.Fatalf("the connected process has %d in flight after the grace, want the whole cap", len(pb))
	}
	px.BlackHole(false)
	t.Logf("max in flight of both %d (cap 100)", maxSum)
}

// Issue 20: the cap of a key is the smallest any live process asked for;
// a process with a larger --cap does not raise it for the others.
func TestSharedCapIsTheSmallestAnyProcessAsked(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	big, small := process(t, url, []org.Org{o}), process(t, url, []org.Org{o})
	gb := big.NewGate(lane(100))
	big.renewAll(context.Background())
	gs := small.NewGate(lane(40))
	var ps, pb []gate.Permit
	for range 50 {
		small.renewAll(context.Background())
		big.renewAll(context.Background())
		time.Sleep(10 * time.Millisecond)
		ps = append(ps, fill(gs)...)
		pb = append(pb, fill(gb)...)
		if n := len(ps) + len(pb); n > 40 {
			t.Fatalf("%d in flight on a key whose smallest cap is 40 (%d + %d)", n, len(ps), len(pb))
		}
		for _, p := range ps[:len(ps)/2] {
			gs.Done(time.Now(), p, ok200)
		}
		ps = ps[len(ps)/2:]
	}
	if l := gb.Snapshot(time.Now()).Limit; l > 40 {
		t.Fatalf("the larger-cap process sees a limit of %v, want at most 40", l)
	}
}

// Issue 20: the remainder slots of a split rotate instead of always going
// to the processes whose names sort first.
func TestSharedRemainderSlotsRotate(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	var bs []*Budget
	var gs []gate.Gate
	for range 3 {
		b := openIdle(t, url, []org.Org{o})
		bs = append(bs, b)
		gs = append(gs, b.NewGate(lane(100)))
	}
	extra := map[int]bool{}
	deadline := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for i, b := range bs {
			b.renewAll(context.Background())
			ps := fill(gs[i])
			if len(ps) == 34 {
				extra[i] = true
			}
			for _, p := range ps {
				gs[i].Done(time.Now(), p, ok200)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(extra) < 2 {
		t.Fatalf("the 100th slot of a 34/33/33 split went only to process(es) %v in 3.5 s", extra)
	}
}

// Issue 20: renewals of many lanes run concurrently, so that on a slow
// Redis the last lane's renewal is not a dozen round trips late.
func TestSharedRenewalsOfManyLanesRunConcurrently(t *testing.T) {
	srv := testredis.URL(t)
	px := netproxy.Start(t, srv[len("redis://"):len(srv)-len("/0")])
	var orgs []org.Org
	for i := range 12 {
		orgs = append(orgs, freshOrg(string(rune('a'+i))))
	}
	b := openIdle(t, "redis://"+px.Addr+"/0", orgs)
	for _, o := range orgs {
		lc := lane(10)
		lc.Org = o.Name
		b.NewGate(lc)
	}
	b.renewAll(context.Background()) // scripts loaded, connections open
	// One after another the renewals take at least 12 round trips (1.8 s);
	// concurrently those of one (4-6 round trips on a loaded machine under
	// -race; 6 of 40 ms failed a run beside a CI run at 358 ms).
	const delay = 150 * time.Millisecond
	px.SetDelay(delay)
	t0 := time.Now()
	b.renewAll(context.Background())
	took := time.Since(t0)
	if took >= 12*delay {
		t.Fatalf("renewing 12 lanes with %v per round trip took %v: one after another", delay, took)
	}
	t.Logf("12 renewals, %v per round trip: %v", delay, took)
}

// A campaign seed (auto with --shared) saw 6 in flight on a cap of 4: each
// sync engine of a run made its own gate of the same lane, and the two
// renewed under one process name, each reporting only its own requests in
// flight, so Redis gave the others slots this process still used. A
// process has one gate per (key, pool): a later engine's gate is the same,
// and what the first holds counts against the second.
func TestSharedLaterEngineOfOneRunReusesItsLane(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	a := openIdle(t, url, []org.Org{o})
	b := openIdle(t, url, []org.Org{o})
	first := a.NewGate(lane(4))
	a.renewAll(context.Background())
	held := fill(first)
	if len(held) != 4 {
		t.Fatalf("first engine admitted %d, want 4", len(held))
	}
	// The run's next engine, while the first's requests are still out.
	second := a.NewGate(lane(4))
	if second != first {
		t.Fatal("a later engine of the same process got a second gate of the same lane")
	}
	a.renewAll(context.Background())
	b.NewGate(lane(4))
	b.renewAll(context.Background())
	a.renewAll(context.Background())
	gb := b.NewGate(lane(4))
	if n := len(fill(second)) + len(fill(gb)); n != 0 {
		t.Fatalf("%d more admitted while 4 of a cap of 4 are in flight", n)
	}
}

// Campaign seeds 63 and 66 (auto, --shared, --pilot): one process runs
// several engines one after another (the pilot, auto's sync share, what
// comes back from the batches), each making its lanes' gates. Every gate of
// a process renews under the process's name, so a finished engine's idle
// gate, renewing last, told Redis the process held nothing while the live
// engine's gate had the cap in flight: another process was granted the
// same slots (4 on a cap of 3, 5 on 4). A process has one gate per lane.
func TestSharedEngineAfterThePilotKeepsTheCap(t *testing.T) {
	url := testredis.URL(t)
	o := freshOrg("a")
	ctx := context.Background()
	a := openIdle(t, url, []org.Org{o})
	pilot := a.NewGate(lane(4))
	a.renewAll(ctx)
	for _, p := range fill(pilot) {
		pilot.Done(time.Now(), p, ok200)
	}
	a.renewAll(ctx)
	// The pilot's engine is over; its gate no longer wants slots.
	time.Sleep(4*a.every + 50*time.Millisecond)
	main := a.NewGate(lane(4))
	a.renewAll(ctx)
	pm := fill(main)
	if len(pm) != 4 {
		t.Fatalf("the run's engine admitted %d, want the whole cap of 4", len(pm))
	}
	// The pilot's gate renews again (its renewal may land after any other).
	if err := pilot.(*Gate).renew(ctx); err != nil {
		t.Fatal(err)
	}
	b := openIdle(t, url, []org.Org{o})
	gb := b.NewGate(lane(4))
	b.renewAll(ctx)
	if pb := fill(gb); len(pm)+len(pb) > 4 {
		t.Fatalf("%d in flight on a cap of 4: %d by the process with two engines, %d by the other", len(pm)+len(pb), len(pm), len(pb))
	}
}

// Issue 20, case 1 (found by CI under load): the grace Redis keeps a
// process's slots for after its lease covers the longest request it has
// seen lately, so a paused process's requests already on the server have
// ended before another process takes their slots. With the fixed grace
// (the TTL), requests longer than it overlapped the other's whole cap.
func TestSharedGraceCoversTheLongestRequest(t *testing.T) {
	url := testredis.URL(t)
	a := openIdle(t, url, []org.Org{freshOrg("a")})
	ga := a.NewGate(lane(100))
	// expiry renews and returns how long after the renewal Redis keeps
	// the slots, at least and at most: the renewal ran between two reads
	// of Redis's clock (after it alone, a loaded machine's round trip
	// could take the 100 ms allowed below).
	expiry := func() (lo, hi time.Duration) {
		t.Helper()
		return keptAfterRenewal(t, a, ga.(*Gate), func() { a.renewAll(context.Background()) })
	}
	if d, _ := expiry(); d > a.ttl+a.grace+100*time.Millisecond {
		t.Fatalf("no request yet: slots kept %v after the renewal, want the TTL %v and the grace %v", d, a.ttl, a.grace)
	}
	p, _, ok := ga.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("not admitted")
	}
	// A request that took 4 s from admission to answer.
	ga.Done(p.At.Add(4*time.Second), p, ok200)
	if lo, hi := expiry(); hi < a.ttl+5*time.Second-100*time.Millisecond || lo > a.ttl+5*time.Second+100*time.Millisecond {
		t.Fatalf("after a 4 s request: slots kept %v to %v after the renewal, want %v (TTL and 1.25 × the longest request)", lo, hi, a.ttl+5*time.Second)
	}
}

// keptAfterRenewal runs renew between two reads of Redis's clock and
// returns how long after the renewal Redis keeps g's slots: at least lo
// (were the renewal at the second read) and at most hi (at the first).
func keptAfterRenewal(t *testing.T, b *Budget, g *Gate, renew func()) (lo, hi time.Duration) {
	t.Helper()
	ctx := context.Background()
	before, err := b.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	renew()
	after, err := b.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	score, err := b.rdb.ZScore(ctx, g.keys[4], b.proc).Result()
	if err != nil {
		t.Fatal(err)
	}
	end := time.UnixMilli(int64(score))
	return end.Sub(after), end.Sub(before)
}

// The permit of a shared gate carries its lease's end: the engine does not
// send a request admitted on a lease that ended before it went out.
func TestSharedPermitEndsWithTheLease(t *testing.T) {
	url := testredis.URL(t)
	a := openIdle(t, url, []org.Org{freshOrg("a")})
	ga := a.NewGate(lane(100))
	// The lease runs from when its renewal was sent, between these two
	// moments (a loaded machine's round trip to Redis took longer than
	// the 200 ms once allowed after it).
	sent := time.Now()
	a.renewAll(context.Background())
	p, _, ok := ga.TryAdmit(time.Now(), one)
	if !ok {
		t.Fatal("not admitted")
	}
	now := time.Now()
	if p.Until.IsZero() || p.Until.After(now.Add(a.ttl-a.margin)) || p.Until.Before(sent.Add(a.ttl-a.margin)) {
		t.Fatalf("permit until %v from now (the renewal sent %v ago), want the lease's end, %v less the margin %v", p.Until.Sub(now), now.Sub(sent), a.ttl, a.margin)
	}
}

// The grace also covers the oldest request still running: a process paused
// with requests in flight longer than any it has seen end keeps their slots
// at least a quarter longer than their age (found by attack2: two 'serve
// --shared' paused before their first answers, 16 in flight on a cap of 8).
func TestSharedGraceCoversTheOldestRequestInFlight(t *testing.T) {
	url := testredis.URL(t)
	a := openIdle(t, url, []org.Org{freshOrg("a")})
	ga := a.NewGate(lane(100))
	a.renewAll(context.Background())
	p, _, ok := ga.TryAdmit(time.Now().Add(-4*time.Second), one)
	if !ok {
		t.Fatal("not admitted")
	}
	_, hi := keptAfterRenewal(t, a, ga.(*Gate), func() { a.renewAll(context.Background()) })
	if want := a.ttl + 5*time.Second; hi < want-100*time.Millisecond {
		t.Fatalf("a request 4 s in flight: slots kept at most %v after the renewal, want at least %v", hi, want)
	}
	ga.Done(time.Now(), p, ok200)
}

// fillUpTo admits until the gate refuses or n are admitted.
func fillUpTo(g gate.Gate, n int) []gate.Permit {
	var ps []gate.Permit
	for len(ps) < n {
		p, _, ok := g.TryAdmit(time.Now(), one)
		if !ok {
			break
		}
		ps = append(ps, p)
	}
	return ps
}
