package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/org"
)

// Two processes, each with its own key of one organisation: once an
// answer shows the organisation, the budget in Redis is the
// organisation's, so together they never hold more than its cap (each
// key's own budget gave them the cap each). A process started later on
// one of the keys knows the organisation from Redis before its first
// request: it starts on the organisation's budget, where the others
// hold every slot.
func TestSharedBudgetIsPerOrganisationOnceKnown(t *testing.T) {
	url := testredis.URL(t)
	var r [8]byte
	rand.Read(r[:])
	id := "org-test-" + hex.EncodeToString(r[:])
	oa, ob := freshOrg("a"), freshOrg("b")
	laneOf := func(name string) gate.LaneConfig {
		lc := lane(100)
		lc.Org, lc.ProbeFirst = name, true
		return lc
	}
	a, b := process(t, url, []org.Org{oa}), process(t, url, []org.Org{ob})
	ga, gb := a.NewGate(laneOf("a")), b.NewGate(laneOf("b"))
	a.renewAll(context.Background())
	b.renewAll(context.Background())
	// Answers as the API gives them: the organisation and the buckets
	// (plenty left), which a probing lane waits for.
	answer := gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Limits: anthropic.RateLimits{OrganizationID: id,
		Requests: anthropic.Limit{Present: true, Limit: 100_000, Remaining: 99_000, Reset: time.Now().Add(time.Second)}}}
	// Each key's probe, answered with the organisation.
	for _, g := range []gate.Gate{ga, gb} {
		ps := fill(g)
		if len(ps) != 1 {
			t.Fatalf("before its first answer a lane admitted %d, want its probe", len(ps))
		}
		g.Done(time.Now(), ps[0], answer)
	}
	var pa, pb []gate.Permit
	finish := func(g gate.Gate, ps []gate.Permit) []gate.Permit {
		for _, p := range ps[:len(ps)/2] {
			g.Done(time.Now(), p, answer)
		}
		return ps[len(ps)/2:]
	}
	eventually(t, "the organisation's cap filled between the two", func() bool {
		pa, pb = finish(ga, pa), finish(gb, pb)
		pa = append(pa, fill(ga)...)
		pb = append(pb, fill(gb)...)
		if n := len(pa) + len(pb); n > 100 {
			t.Fatalf("%d in flight between two keys of one organisation, cap 100", n)
		}
		return len(pa)+len(pb) == 100 && len(pa) > 0 && len(pb) > 0
	}, a, b)
	t.Logf("split %d / %d", len(pa), len(pb))
	c := process(t, url, []org.Org{ob})
	gc := c.NewGate(laneOf("b"))
	c.renewAll(context.Background())
	if ps := fill(gc); len(ps) != 0 {
		t.Fatalf("a later process on key b admitted %d while the organisation's cap was in flight", len(ps))
	}
}

// Campaign seed 19: processes on one key start on the key's own budget and
// move to the organisation's one by one, as each sees its first answer. A
// process still on the key's budget (its probe out, or paused before its
// first answer) held slots the organisation's budget did not see: the
// first to move filled the cap there beside the others' probe, and a
// process that came back from a pause found the key's budget empty and
// sent its probe beside the cap in flight (4 in flight on a cap of 3, in
// both cases). What the key's budget still holds counts on the
// organisation's until it is handed back or its lease and grace have run
// out, and a process on the key's budget learns there that it has moved.
func TestSharedKeyBudgetLeftBehindCountsOnTheOrganisation(t *testing.T) {
	url := testredis.URL(t)
	var r [8]byte
	rand.Read(r[:])
	id := "org-test-" + hex.EncodeToString(r[:])
	o := freshOrg("a")
	lc := lane(3)
	lc.ProbeFirst = true
	ctx := context.Background()
	answer := gate.Feedback{Outcome: anthropic.Outcome{Kind: anthropic.Success, Status: 200}, Limits: anthropic.RateLimits{OrganizationID: id,
		Requests: anthropic.Limit{Present: true, Limit: 100_000, Remaining: 99_000, Reset: time.Now().Add(time.Minute)}}}
	a, b, c := openIdle(t, url, []org.Org{o}), openIdle(t, url, []org.Org{o}), openIdle(t, url, []org.Org{o})
	ga, gb, gc := a.NewGate(lc), b.NewGate(lc), c.NewGate(lc)
	out := map[gate.Gate][]gate.Permit{}
	admit := func(g gate.Gate, when string) {
		out[g] = append(out[g], fill(g)...)
		if n := len(out[ga]) + len(out[gb]) + len(out[gc]); n > lc.Cap {
			t.Errorf("%s: %d in flight on a key capped at %d (A %d, B %d, C %d)", when, n, lc.Cap, len(out[ga]), len(out[gb]), len(out[gc]))
		}
	}
	answerAll := func(g gate.Gate) {
		for _, p := range out[g] {
			g.Done(time.Now(), p, answer)
		}
		out[g] = nil
	}
	// Three rounds: the first to renew had the cap, and hands it back
	// once it knows of the others.
	for range 3 {
		for _, x := range []*Budget{a, b, c} {
			x.renewAll(ctx)
		}
	}
	// A and B send their probes on the key's budget; C renewed and was
	// paused before its first request.
	admit(ga, "the probes")
	admit(gb, "the probes")
	if len(out[ga]) != 1 || len(out[gb]) != 1 {
		t.Fatalf("before their first answers A and B admitted %d and %d, want their probes", len(out[ga]), len(out[gb]))
	}
	// A's answer shows the organisation: A moves to its budget and
	// renews there, while B's probe, admitted on the key's, is out.
	answerAll(ga)
	for range 3 {
		a.renewAll(ctx)
		admit(ga, "A on the organisation's budget beside B's probe")
	}
	// B's answer: B moves too, and the two fill what they may.
	answerAll(gb)
	for range 3 {
		a.renewAll(ctx)
		b.renewAll(ctx)
		admit(ga, "A and B on the organisation's budget")
		admit(gb, "A and B on the organisation's budget")
	}
	// C's lease and grace on the key's budget run out; A and B take the
	// whole cap.
	time.Sleep(c.ttl + c.grace + 100*time.Millisecond)
	eventually(t, "A and B hold the cap between them", func() bool {
		admit(ga, "A and B on the organisation's budget")
		admit(gb, "A and B on the organisation's budget")
		return len(out[ga])+len(out[gb]) == lc.Cap
	}, a, b)
	// C comes back: its lease has ended, and the key's budget it renews
	// on is empty; whatever it learns there, it must not add to the cap
	// A and B have in flight.
	admit(gc, "C back from its pause, before renewing")
	for range 3 {
		c.renewAll(ctx)
		admit(gc, "C back from its pause")
	}
	if t.Failed() {
		return
	}
	// Once A and B hand their slots back, C, now on the organisation's
	// budget, has them.
	answerAll(ga)
	answerAll(gb)
	a.renewAll(ctx)
	b.renewAll(ctx)
	eventually(t, "C admits once A and B are idle", func() bool {
		admit(gc, "C alone")
		return len(out[gc]) > 0
	}, a, b, c)
	if org := gc.(*Gate).keysNow()[0]; !strings.Contains(org, id) {
		t.Errorf("C renews on %s, not on the organisation's budget", org)
	}
}
