package upstream

import (
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
)

// learner is a lane gate that keeps its key's organisation (as a shared
// gate does): what it was told.
type learner struct {
	gate.Gate
	told []string
}

func (l *learner) LearnOrganisation(id string) { l.told = append(l.told, id) }

// A key's organisation, once known, reaches every lane of the key that
// keeps its own record of it (a shared gate, whose budget is the
// organisation's once it knows): the lanes of another pool, whether they
// were made before the answer that showed it (their first requests still
// out) or after. Before, only the lane that got the answer learnt it, and
// a later pool's lane never did: two --shared processes on two keys of one
// organisation held a cap each in that pool (8 in flight on a cap of 4,
// gateway's TestAttackALaterPoolOfAKnownOrganisationSharesItsCap).
func TestAttackEveryLaneOfAKeyLearnsItsOrganisation(t *testing.T) {
	o := NewOrgs(threeOrgs(), nil)
	lane := func(pool anthropic.Pool) (*learner, gate.Gate) {
		lc := gate.LaneConfig{Org: "a", Pool: pool, Cap: 5, StartFraction: 1}
		l := &learner{Gate: gate.NewLane(lc)}
		return l, o.Wrap(l, lc)
	}
	haiku, h := lane(anthropic.PoolHaiku45)
	sonnet, s := lane(anthropic.PoolSonnet4)
	now := time.Now()
	hp := admitAll(h, now)
	if sp := admitAll(s, now); len(hp) != 1 || len(sp) != 1 {
		t.Fatalf("before the organisation is known: %d and %d admitted, want 1 each", len(hp), len(sp))
	}
	h.Done(now, hp[0], answer("org-x", 200))
	if len(sonnet.told) != 1 || sonnet.told[0] != "org-x" {
		t.Errorf("the Sonnet lane (its first request out) was told %q of the organisation a Haiku answer showed, want [org-x]", sonnet.told)
	}
	opus, _ := lane(anthropic.PoolOpus4)
	if len(opus.told) != 1 || opus.told[0] != "org-x" {
		t.Errorf("an Opus lane made once the organisation was known was told %q, want [org-x]", opus.told)
	}
	_ = haiku
}
