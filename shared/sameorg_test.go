package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
