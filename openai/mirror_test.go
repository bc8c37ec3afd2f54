package openai_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/ratelimit"
)

// The parsed limits feed the bucket mirror Anthropic's headers feed: the
// requests bucket as requests, the tokens bucket (charged at admission) as
// the input bucket.
func TestRateLimitsFeedTheMirror(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set(openai.HeaderRequestsLimit, "600")
	h.Set(openai.HeaderRequestsRemaining, "300")
	h.Set(openai.HeaderRequestsReset, "30s")
	h.Set(openai.HeaderTokensLimit, "60000")
	h.Set(openai.HeaderTokensRemaining, "60000")
	h.Set(openai.HeaderTokensReset, "0s")
	rl := openai.ParseRateLimits(h, now)
	m := ratelimit.NewMirror(ratelimit.MirrorConfig{})
	m.Sync(now, anthropic.RateLimits{Requests: anthropic.Limit(rl.Requests), Input: anthropic.Limit(rl.Tokens)}, 0)
	if m.Requests.Limit() != 600 || m.Input.Limit() != 60000 || m.Output.Known() {
		t.Fatalf("mirror limits %v %v %v", m.Requests.Limit(), m.Input.Limit(), m.Output.Known())
	}
	if lv := m.Requests.Level(now); lv < 299 || lv > 301 {
		t.Fatalf("requests level %v, want 300", lv)
	}
	// 400 requests do not fit in 300 remaining; 200 do at once.
	if w := m.Wait(now, ratelimit.Need{Requests: 400}); w <= 0 {
		t.Fatalf("400 requests fit in 300 remaining")
	}
	if w := m.Wait(now, ratelimit.Need{Requests: 200, Input: 1000}); w != 0 {
		t.Fatalf("200 requests wait %v", w)
	}
}
