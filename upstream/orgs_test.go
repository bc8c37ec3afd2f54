package upstream

import (
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

func twoOrgs(t *testing.T, capN int) (*Orgs, gate.Gate, gate.Gate, *[]string) {
	t.Helper()
	var notes []string
	o := NewOrgs([]org.Org{{Name: "a", Key: org.NewKey("sk-ant-test-key-a-0001")}, {Name: "b", Key: org.NewKey("sk-ant-test-key-b-0002")}},
		func(drop, keep, id, reason string) { notes = append(notes, drop+" "+keep+" "+id+" "+reason) })
	mk := func(name string) gate.Gate {
		lc := gate.LaneConfig{Org: name, Pool: anthropic.PoolSonnet4, Cap: capN, StartFraction: 1}
		return o.Wrap(gate.NewLane(lc), lc)
	}
	return o, mk("a"), mk("b"), &notes
}

func answer(id string, status int) gate.Feedback {
	return gate.Feedback{Outcome: anthropic.Outcome{Status: status}, Limits: anthropic.RateLimits{OrganizationID: id}}
}

func admitAll(g gate.Gate, now time.Time) []gate.Permit {
	var ps []gate.Permit
	for {
		p, _, ok := g.TryAdmit(now, gate.Demand{})
		if !ok {
			return ps
		}
		ps = append(ps, p)
	}
}

// A key sends one request at a time until its organisation is known; a
// key found to reach an earlier org's organisation stops; and while a
// key is unknown its request counts against every organisation's cap.
func TestSameOrganisationHoldsOneCap(t *testing.T) {
	now := time.Now()
	o, a, b, notes := twoOrgs(t, 5)
	pa, pb := admitAll(a, now), admitAll(b, now)
	if len(pa) != 1 || len(pb) != 1 {
		t.Fatalf("before any answer a admitted %d, b %d; want one each", len(pa), len(pb))
	}
	// b answers first: its organisation is known, a's is not (its one
	// request in flight may reach the same), so b may have 4 in flight.
	b.Done(now, pb[0], answer("org-x", 200))
	if id, known := o.ID("b"); !known || id != "org-x" {
		t.Fatalf("b: id %q known %v", id, known)
	}
	pb = admitAll(b, now)
	if len(pb) != 4 {
		t.Fatalf("b admitted %d beside a's unknown request, want 4 (cap 5)", len(pb))
	}
	// a answers: the same organisation; b, listed later, stops.
	a.Done(now, pa[0], answer("org-x", 200))
	if r := b.Disabled(); !strings.Contains(r, "same organisation as org a") || strings.Contains(r, "sk-ant") {
		t.Fatalf("b disabled %q", r)
	}
	if s := b.Snapshot(now); s.Disabled == "" {
		t.Fatal("b's snapshot does not say it stopped")
	}
	if len(*notes) != 1 || !strings.HasPrefix((*notes)[0], "b a org-x") {
		t.Fatalf("notes %q", *notes)
	}
	if _, _, ok := b.TryAdmit(now, gate.Demand{}); ok {
		t.Fatal("b admitted after it was found to reach a's organisation")
	}
	// a shares the cap with b's 4 still in flight.
	if pa = admitAll(a, now); len(pa) != 1 {
		t.Fatalf("a admitted %d beside b's 4 in flight, want 1", len(pa))
	}
	for _, p := range pb {
		b.Done(now, p, answer("org-x", 200))
	}
	if pa = admitAll(a, now); len(pa) != 4 {
		t.Fatalf("a admitted %d once b's ended, want 4 more", len(pa))
	}
}

// A 2xx without an organisation id makes a key an organisation of its
// own (an API that does not send the header); any other answer without
// one, or no answer, leaves it unknown.
func TestOrganisationUnknownUntilTheAPIAnswers(t *testing.T) {
	now := time.Now()
	o, a, b, _ := twoOrgs(t, 5)
	pa := admitAll(a, now)
	a.Done(now, pa[0], answer("", 529))
	a.Done(now, admitAll(a, now)[0], answer("", 0))
	if _, known := o.ID("a"); known {
		t.Fatal("a known from a 529 and a transport error without an id")
	}
	if n := len(admitAll(a, now)); n != 1 {
		t.Fatalf("unknown a admitted %d, want 1", n)
	}
	pb := admitAll(b, now)
	b.Done(now, pb[0], answer("", 200))
	if id, known := o.ID("b"); !known || id != "" {
		t.Fatalf("b after a 2xx without an id: %q %v", id, known)
	}
	// b is its own organisation, a (unknown, one in flight) may share it.
	if n := len(admitAll(b, now)); n != 4 {
		t.Fatalf("b admitted %d, want 4", n)
	}
}
