package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// The aggregate sums the orgs in rotation, takes the latest reset, replaces
// whatever rate-limit headers the answer carried, and drops an org the
// moment it leaves rotation (the aggregate is computed when headers
// arrive, so a stale one must be noticed when written).
func TestRateAggregateSumsOrgsInRotation(t *testing.T) {
	a := newRateAgg()
	ups := []*upstream{{}, {}, {}}
	reset := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for i, u := range ups {
		a.note("sonnet", u, anthropic.RateLimits{
			Requests: anthropic.Limit{Present: true, Limit: 100, Remaining: int64(10 * (i + 1)), Reset: reset.Add(time.Duration(i) * time.Second)},
			Input:    anthropic.Limit{Present: true, Limit: 1000, Remaining: 500},
		})
	}
	get := func() http.Header {
		h := http.Header{}
		h.Set(anthropic.HeaderRequestsLimit, "7") // one org's, passed on from upstream
		h.Set(anthropic.HeaderOutputLimit, "9")
		a.write(h, "sonnet")
		return h
	}
	h := get()
	for k, want := range map[string]string{
		anthropic.HeaderRequestsLimit: "300", anthropic.HeaderRequestsRemaining: "60",
		anthropic.HeaderRequestsReset: "2026-12-04T12:00:02Z", anthropic.HeaderInputLimit: "3000",
		anthropic.HeaderInputRemaining: "1500", anthropic.HeaderOutputLimit: "",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	reason := "revoked"
	ups[2].disabled.Store(&reason)
	h = get()
	if got := h.Get(anthropic.HeaderRequestsLimit); got != "200" {
		t.Errorf("after an org left rotation: requests limit %q, want 200", got)
	}
	if got := h.Get(anthropic.HeaderRequestsRemaining); got != "30" {
		t.Errorf("after an org left rotation: requests remaining %q, want 30", got)
	}
	if h := (http.Header{}); true {
		a.write(h, "haiku")
		if len(h) != 0 {
			t.Errorf("a pool with no headers yet: %v", h)
		}
	}
}
