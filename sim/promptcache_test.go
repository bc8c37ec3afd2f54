package sim

import (
	"bytes"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// cachedBody is a request whose ~1,556-token system prompt is marked for
// caching (ttl "" is the default 5 minutes), for model, with item i as
// its user message.
func cachedBody(model, ttl string, i int) []byte {
	long := bytes.Repeat([]byte("rubric "), 800)
	cc := `{"type":"ephemeral"}`
	if ttl != "" {
		cc = `{"type":"ephemeral","ttl":"` + ttl + `"}`
	}
	return []byte(`{"model":"` + model + `","max_tokens":16,"system":[{"type":"text","text":"` + string(long) +
		`","cache_control":` + cc + `}],"messages":[{"role":"user","content":"item ` + strconv.Itoa(i) + `"}]}`)
}

// A request the API refuses (a 429) was never processed, so it wrote no
// prompt cache: the same prefix sent again once admitted is a write, not
// a read of what the refused request never stored.
func TestPromptCacheNotWrittenByRefusedRequest(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.PromptCaching = true
	cfg.Speed = 600 // one request a minute refills in 0.1 s
	cfg.Orgs[0].Limits = map[anthropic.Pool]Limits{anthropic.PoolSonnet4: {RPM: 1, ITPM: 1_000_000, OTPM: 1_000_000}}
	run := startSim(t, cfg)
	post(t, run, soloKey, proseBody(1, 16)).message(t) // the bucket's one request
	if r := post(t, run, soloKey, cachedBody("claude-sonnet-4-5", "1h", 1)); r.status != 429 {
		t.Fatalf("status %d, want 429 (the request bucket is empty): %s", r.status, r.body)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		r := post(t, run, soloKey, cachedBody("claude-sonnet-4-5", "1h", 2))
		if r.status == 429 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		u := r.message(t).Usage
		if u.CacheReadInputTokens != 0 || u.CacheCreation.Ephemeral1hInputTokens < 1024 {
			t.Fatalf("usage %+v: want a 1h cache write (the refused request cached nothing)", u)
		}
		return
	}
}

// A cache entry becomes readable only once the response that writes it has
// begun: a second request sent while the first is still before its first
// token writes the prefix again, and one sent after both reads it.
func TestPromptCacheReadableOnlyAfterFirstToken(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.PromptCaching = true
	cfg.Speed = 10
	cfg.Latency = LatencyConfig{TTFT: 4 * time.Second} // 0.4 s real before the first token
	run := startSim(t, cfg)
	var wg sync.WaitGroup
	got := make([]anthropic.Usage, 2)
	for i := range 2 {
		wg.Go(func() {
			if i == 1 {
				time.Sleep(50 * time.Millisecond) // well before the first one's first token
			}
			got[i] = post(t, run, soloKey, cachedBody("claude-sonnet-4-5", "", i)).message(t).Usage
		})
	}
	wg.Wait()
	for i, u := range got {
		if u.CacheCreationInputTokens < 1024 || u.CacheReadInputTokens != 0 {
			t.Errorf("request %d usage %+v: want a cache write (no response had begun)", i, u)
		}
	}
	u := post(t, run, soloKey, cachedBody("claude-sonnet-4-5", "", 3)).message(t).Usage
	if u.CacheReadInputTokens < 1024 || u.CacheCreationInputTokens != 0 {
		t.Errorf("third usage %+v: want a cache read", u)
	}
}

// A prompt cache belongs to one model: the same prefix sent to another
// model of the same pool is written again. A dated id and its alias are
// one model and share it.
func TestPromptCachePerModel(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.PromptCaching = true
	run := startSim(t, cfg)
	steps := []struct {
		model string
		read  bool
	}{
		{"claude-sonnet-4-5", false},
		{"claude-sonnet-4-5-20250929", true},
		{"claude-sonnet-4-6", false},
		{"claude-sonnet-4-6", true},
		{"claude-sonnet-4-5", true},
	}
	for i, s := range steps {
		u := post(t, run, soloKey, cachedBody(s.model, "", i)).message(t).Usage
		if read := u.CacheReadInputTokens > 0; read != s.read || u.CacheReadInputTokens+u.CacheCreationInputTokens < 1024 {
			t.Errorf("step %d (%s): usage %+v, want read=%v", i, s.model, u, s.read)
		}
	}
}

// Expired entries do not pile up: an org's prompt cache holds what is
// live, however many prefixes were ever written.
func TestPromptCacheForgetsExpired(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.PromptCaching = true
	cfg.Speed = 6000 // 5 API-minutes in 50 ms
	cfg.Orgs[0].Limits = map[anthropic.Pool]Limits{anthropic.PoolSonnet4: {RPM: 1_000_000, ITPM: 1_000_000_000, OTPM: 1_000_000_000}}
	run := startSim(t, cfg)
	for i := range 3 * promptCacheSweepEvery {
		body := bytes.Replace(cachedBody("claude-sonnet-4-5", "", 0), []byte("rubric"), []byte("rubric"+strconv.Itoa(i)), 1)
		post(t, run, soloKey, body).message(t)
		if i%promptCacheSweepEvery == 0 {
			time.Sleep(60 * time.Millisecond) // what came before has expired
		}
	}
	o := run.Server.byName["solo"]
	o.mu.Lock()
	n := len(o.cache)
	o.mu.Unlock()
	if n > 2*promptCacheSweepEvery {
		t.Errorf("%d entries held after writing %d prefixes, most long expired", n, 3*promptCacheSweepEvery)
	}
}
