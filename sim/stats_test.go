package sim

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

func TestStats(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Speed = 100
	cfg.Latency = LatencyConfig{TTFT: 5 * time.Second}                                // 50 ms real, no jitter
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 20, ITPM: 1e6, OTPM: 1e6} // 2,000 per real minute at K=100
	run := startSim(t, cfg)

	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(t, run, soloKey, judgeBody(i, 64))
		}()
	}
	wg.Wait()
	post(t, run, soloKey, []byte(`{}`)) // a 400
	st := run.Server.Stats()
	o := st.Org("solo")
	if o.Requests != 21 || o.ByStatus["200"] != 20 || o.ByStatus["400"] != 1 || o.Completions != 20 || o.InFlight != 0 {
		t.Errorf("counts: %+v", o)
	}
	if o.MaxInFlight < 2 || o.MaxInFlight > 20 {
		t.Errorf("max in flight %d: 20 concurrent 50 ms requests should overlap", o.MaxInFlight)
	}
	if o.CostNanos != st.Billed.CostNanos || o.CostUSD != float64(o.CostNanos)/1e9 {
		t.Errorf("cost %d vs billed %d", o.CostNanos, st.Billed.CostNanos)
	}
	var completions, admitted, maxIF int64
	for _, p := range o.Series {
		completions += p.Completions
		admitted += p.Admitted
		maxIF = max(maxIF, p.InFlightMax)
		if math.Abs(p.APIT-float64(p.T)*100) > 1e-9 {
			t.Errorf("series point %d: api_t %v", p.T, p.APIT)
		}
	}
	if completions != 20 || admitted != 20 || maxIF != o.MaxInFlight {
		t.Errorf("series sums: %d completions, %d admitted, max in flight %d", completions, admitted, maxIF)
	}
	if math.Abs(st.APIElapsedS-100*st.ElapsedS) > 0.5 {
		t.Errorf("elapsed %v real, %v API: want ×100", st.ElapsedS, st.APIElapsedS)
	}
	if len(o.Pools) != 1 || o.Pools[0].Pool != "sonnet-4" || o.Pools[0].Limit[0] != 2000 || o.Pools[0].MinRemaining[0] >= 1999 {
		t.Errorf("pools %+v", o.Pools)
	}
	// The same over HTTP, with and without the series.
	r := do(t, "GET", run.URL+"/sim/stats", "", nil)
	var viaHTTP Stats
	if err := json.Unmarshal(r.body, &viaHTTP); err != nil || viaHTTP.Org("solo").Completions != 20 || len(viaHTTP.Org("solo").Series) == 0 {
		t.Fatalf("/sim/stats: %v %s", err, r.body)
	}
	if r := do(t, "GET", run.URL+"/sim/stats?series=0", "", nil); strings.Contains(string(r.body), `"series"`) {
		t.Error("?series=0 still has the series")
	}
}

// A 429 is counted in stats and in the series.
func TestStatsCount429(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 2, ITPM: 1e6, OTPM: 1e6}
	run := startSim(t, cfg)
	for i := 0; i < 5; i++ {
		post(t, run, soloKey, judgeBody(i, 64))
	}
	o := run.Server.Stats().Org("solo")
	var limited int64
	for _, p := range o.Series {
		limited += p.RateLimited
	}
	if o.RateLimited429 != 3 || limited != 3 || o.ByStatus["200"] != 2 {
		t.Errorf("429s %d (series %d), 200s %d; want 3, 3, 2", o.RateLimited429, limited, o.ByStatus["200"])
	}
}

// Speed K: limit headers and refill are K times the API's while the bucket
// holds the API's own minute; retry-after is whole seconds (ceil, at least
// 1) with an exact retry-after-ms, and reset times are real (compressed)
// times with millisecond precision.
func TestSpeedScalesHeadersAndRetryAfter(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Speed = 10
	// 1 RPM at K=10: 10 a real minute, refilled at one every 6 real
	// seconds, in a bucket that holds the API's one request.
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 1, ITPM: 600000, OTPM: 600000}
	run := startSim(t, cfg)
	var last reply
	for i := 0; i < 2; i++ {
		last = post(t, run, soloKey, judgeBody(i, 64))
		if i < 1 && last.status != 200 {
			t.Fatalf("request %d: status %d", i, last.status)
		}
	}
	if last.status != 429 {
		t.Fatalf("2nd request: status %d, want 429", last.status)
	}
	h := last.header
	if h.Get("anthropic-ratelimit-requests-limit") != "10" || h.Get("anthropic-ratelimit-input-tokens-limit") != "6000000" {
		t.Errorf("limits %q %q, want 10 and 6000000", h.Get("anthropic-ratelimit-requests-limit"), h.Get("anthropic-ratelimit-input-tokens-limit"))
	}
	if h.Get("x-sim-speed-factor") != "10" {
		t.Errorf("x-sim-speed-factor %q", h.Get("x-sim-speed-factor"))
	}
	ms, err := strconv.Atoi(h.Get("retry-after-ms"))
	// One request short at one per 6 s: at most 6 s real, less the time
	// since the bucket emptied.
	if err != nil || ms < 1 || ms > 6000 {
		t.Fatalf("retry-after-ms %q, want (0, 6000]", h.Get("retry-after-ms"))
	}
	if ra := h.Get("retry-after"); ra != strconv.Itoa((ms+999)/1000) {
		t.Errorf("retry-after %q for retry-after-ms %d: want the ceiling in seconds", ra, ms)
	}
	e := last.envelope(t)
	if !strings.Contains(e.Error.Message, "rate limit of 10 requests per minute") || !strings.Contains(e.Error.Message, run.Server.Config().Orgs[0].ID) ||
		!strings.Contains(e.Error.Message, "claude-sonnet-4-5-20250929") {
		t.Errorf("message %q", e.Error.Message)
	}
	reset, err := time.Parse(time.RFC3339Nano, h.Get("anthropic-ratelimit-requests-reset"))
	if err != nil || !strings.Contains(h.Get("anthropic-ratelimit-requests-reset"), ".") {
		t.Fatalf("reset %q: want RFC 3339 with milliseconds", h.Get("anthropic-ratelimit-requests-reset"))
	}
	// Full again after one request at one per 6 s: 6 s real.
	if d := time.Until(reset); d < 3*time.Second || d > 7*time.Second {
		t.Errorf("reset in %v, want about 6s", d)
	}

	// At K = 1 there is no retry-after-ms, and retry-after is at least 1.
	cfg = testConfig()
	cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 1, ITPM: 1e6, OTPM: 1e6}
	run1 := startSim(t, cfg)
	post(t, run1, soloKey, judgeBody(1, 64))
	r := post(t, run1, soloKey, judgeBody(2, 64))
	if r.status != 429 || r.header.Get("retry-after-ms") != "" || r.header.Get("retry-after") != "60" {
		t.Errorf("K=1: status %d retry-after %q retry-after-ms %q; want 429, 60, none", r.status, r.header.Get("retry-after"), r.header.Get("retry-after-ms"))
	}
	if _, err := time.Parse(time.RFC3339, r.header.Get("anthropic-ratelimit-requests-reset")); err != nil || strings.Contains(r.header.Get("anthropic-ratelimit-requests-reset"), ".") {
		t.Errorf("K=1 reset %q: want whole seconds", r.header.Get("anthropic-ratelimit-requests-reset"))
	}
}

// Every response, errors included, carries request-id (matching the body)
// and, once the key is known, the org id.
func TestEveryResponseHasRequestIDAndOrg(t *testing.T) {
	t.Parallel()
	run := startSim(t, testConfig())
	orgID := run.Server.Config().Orgs[0].ID
	seen := map[string]bool{}
	for _, tc := range []struct {
		method, path, key string
		body              []byte
		status            int
		org               bool
	}{
		{"POST", "/v1/messages", soloKey, judgeBody(1, 64), 200, true},
		{"POST", "/v1/messages", soloKey, []byte(`{}`), 400, true},
		{"POST", "/v1/messages", "bad", judgeBody(1, 64), 401, false},
		{"GET", "/v1/models", soloKey, nil, 200, true},
		{"POST", "/v1/messages/count_tokens", soloKey, []byte(`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hello"}]}`), 200, true},
		{"GET", "/v1/nothing", soloKey, nil, 404, false},
		{"GET", "/v1/messages", soloKey, nil, 405, false},
	} {
		r := do(t, tc.method, run.URL+tc.path, tc.key, tc.body)
		rid := r.header.Get("request-id")
		if r.status != tc.status || !strings.HasPrefix(rid, "req_") || seen[rid] {
			t.Errorf("%s %s: status %d request-id %q", tc.method, tc.path, r.status, rid)
		}
		seen[rid] = true
		if tc.org != (r.header.Get("anthropic-organization-id") == orgID) {
			t.Errorf("%s %s: org header %q", tc.method, tc.path, r.header.Get("anthropic-organization-id"))
		}
		if r.status >= 400 {
			if e := r.envelope(t); e.Type != "error" || e.RequestID != rid {
				t.Errorf("%s %s: envelope %+v", tc.method, tc.path, e)
			}
		}
	}
	if r := do(t, "POST", run.URL+"/v1/messages", soloKey, judgeBody(1, 64), "anthropic-version", ""); r.status != 400 {
		t.Errorf("missing anthropic-version: status %d", r.status)
	}
	big := make([]byte, MaxBodyBytes+1)
	if r := do(t, "POST", run.URL+"/v1/messages", soloKey, big); r.status != 413 || r.envelope(t).Error.Type != anthropic.ErrRequestTooLarge {
		t.Errorf("33 MB body: status %d", r.status)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	json.Unmarshal(do(t, "GET", run.URL+"/v1/models", soloKey, nil).body, &models)
	if len(models.Data) != 3 { // solo serves the Sonnet 4.x pool only: 4.6, 4.5 and its dated id
		t.Errorf("/v1/models lists %d models, want solo's 3", len(models.Data))
	}
}
