package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/org"
)

// Each fault kind, observed over real HTTP.
func TestFaultKinds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		fault Fault
		check func(t *testing.T, run *Running, r reply)
	}{
		{"storm with retry-after", Fault{Kind: FaultRateLimitStorm, RetryAfter: 3 * time.Second}, func(t *testing.T, run *Running, r reply) {
			e := r.envelope(t)
			if r.status != 429 || e.Error.Type != anthropic.ErrRateLimit || r.header.Get("retry-after") != "3" ||
				r.header.Get("x-should-retry") != "true" || r.header.Get("anthropic-ratelimit-requests-limit") != "600" {
				t.Errorf("status %d type %q headers %v", r.status, e.Error.Type, r.header)
			}
		}},
		{"storm without retry-after", Fault{Kind: FaultRateLimitStorm}, func(t *testing.T, run *Running, r reply) {
			if r.status != 429 || r.header.Get("retry-after") != "" {
				t.Errorf("status %d retry-after %q", r.status, r.header.Get("retry-after"))
			}
		}},
		{"overloaded 529", Fault{Kind: FaultOverloaded}, func(t *testing.T, run *Running, r reply) {
			e := r.envelope(t)
			if r.status != 529 || e.Error.Type != anthropic.ErrOverloaded || e.Error.Message != "Overloaded" ||
				string(e.Error.Details) != "null" || r.header.Get("retry-after") != "" {
				t.Errorf("status %d envelope %+v retry-after %q", r.status, e, r.header.Get("retry-after"))
			}
		}},
		{"500 JSON", Fault{Kind: FaultServerError}, func(t *testing.T, run *Running, r reply) {
			if e := r.envelope(t); r.status != 500 || e.Error.Type != anthropic.ErrAPI || e.RequestID != r.header.Get("request-id") {
				t.Errorf("status %d envelope %+v", r.status, e)
			}
		}},
		{"500 HTML", Fault{Kind: FaultServerErrorHTML}, func(t *testing.T, run *Running, r reply) {
			if r.status != 500 || !strings.HasPrefix(r.header.Get("content-type"), "text/html") || !bytes.Contains(r.body, []byte("<html>")) {
				t.Errorf("status %d type %q", r.status, r.header.Get("content-type"))
			}
		}},
		{"connection reset after billing", Fault{Kind: FaultConnectionReset}, func(t *testing.T, run *Running, r reply) {
			if r.err == nil {
				t.Fatalf("got status %d, want a connection error", r.status)
			}
			led := run.Server.Ledger()
			if len(led) != 1 || led[0].Delivery != DeliveryReset || led[0].Status != 200 {
				t.Errorf("ledger %+v: want one billed entry delivered as a reset", led)
			}
		}},
		{"truncated body", Fault{Kind: FaultTruncatedBody}, func(t *testing.T, run *Running, r reply) {
			if r.status != 200 || !errors.Is(r.err, io.ErrUnexpectedEOF) || json.Valid(r.body) {
				t.Errorf("status %d err %v body %q: want 200 then a cut body", r.status, r.err, r.body)
			}
			if led := run.Server.Ledger(); len(led) != 1 || led[0].Delivery != DeliveryTruncated {
				t.Errorf("ledger %+v", led)
			}
		}},
		{"key revoked", Fault{Kind: FaultKeyRevoked, Org: "solo"}, func(t *testing.T, run *Running, r reply) {
			if e := r.envelope(t); r.status != 401 || e.Error.Type != anthropic.ErrAuthentication {
				t.Errorf("status %d envelope %+v", r.status, e)
			}
		}},
		{"spend cap", Fault{Kind: FaultSpendCap}, func(t *testing.T, run *Running, r reply) {
			e := r.envelope(t)
			var d struct {
				ErrorCode string `json:"error_code"`
			}
			json.Unmarshal(e.Error.Details, &d)
			resume := nextMonth(time.Now()).Format(time.RFC3339)
			if r.status != 429 || d.ErrorCode != anthropic.SpendLimitErrorCode || r.header.Get("retry-after") != "" ||
				!strings.Contains(e.Error.Message, resume) {
				t.Errorf("status %d envelope %+v retry-after %q, want the spend-cap 429 naming %s", r.status, e, r.header.Get("retry-after"), resume)
			}
		}},
		{"colleague load visible in remaining", Fault{Kind: FaultColleague, Fraction: 0.4}, func(t *testing.T, run *Running, r reply) {
			// The colleague draws 6 every 1.5 s (40% of 600/min) from the
			// first request on: its draws are in the bucket's books.
			time.Sleep(2 * time.Second)
			used := int64(0)
			for _, p := range run.Server.Stats().Org("solo").Pools {
				used += p.ColleagueUsed[0]
			}
			if r.status != 200 || used < 6 {
				t.Errorf("status %d, colleague drew %d requests, want at least one draw of 6", r.status, used)
			}
		}},
		{"scheduled later: not yet", Fault{Kind: FaultOverloaded, Start: time.Hour}, func(t *testing.T, run *Running, r reply) {
			if r.status != 200 {
				t.Errorf("status %d before the fault's start", r.status)
			}
		}},
		{"other org: unaffected", Fault{Kind: FaultOverloaded, Org: "other"}, func(t *testing.T, run *Running, r reply) {
			if r.status != 200 {
				t.Errorf("status %d for an org the fault does not name", r.status)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.Orgs = append(cfg.Orgs, OrgConfig{Name: "other", Limits: map[anthropic.Pool]Limits{AnyPool: {RPM: 100}}})
			cfg.Faults = []Fault{tc.fault}
			run := startSim(t, cfg)
			tc.check(t, run, post(t, run, soloKey, judgeBody(1, 256)))
		})
	}
}

func TestFaultSlowAddsLatency(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Speed = 100
	cfg.Faults = []Fault{{Kind: FaultSlow, ExtraLatency: 30 * time.Second}} // 0.3 s real
	run := startSim(t, cfg)
	start := time.Now()
	if r := post(t, run, soloKey, judgeBody(1, 256)); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("slow fault: answered in %v, want at least 300ms", d)
	}
}

// key_revoked from time T, for one key only.
func TestFaultKeyRevokedFromT(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Speed = 10
	cfg.Orgs[0].Keys = []string{soloKey, "sk-ant-sim-solo-second"}
	cfg.Faults = []Fault{{Kind: FaultKeyRevoked, Org: "solo", KeyFingerprint: org.Fingerprint(soloKey), Start: 10 * time.Second}}
	run := startSim(t, cfg)
	if _, api := run.Server.Elapsed(); api < 10*time.Second {
		if r := post(t, run, soloKey, judgeBody(1, 64)); r.status != 200 {
			t.Fatalf("before T: status %d", r.status)
		}
	}
	for _, api := run.Server.Elapsed(); api < 11*time.Second; _, api = run.Server.Elapsed() {
		time.Sleep(50 * time.Millisecond)
	}
	if r := post(t, run, soloKey, judgeBody(2, 64)); r.status != 401 {
		t.Errorf("after T: status %d, want 401", r.status)
	}
	if r := post(t, run, "sk-ant-sim-solo-second", judgeBody(3, 64)); r.status != 200 {
		t.Errorf("the other key: status %d, want 200", r.status)
	}
}

// spend_cap with a threshold fires once the org's billed cost reaches it.
func TestFaultSpendCapThreshold(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Faults = []Fault{{Kind: FaultSpendCap, SpendCapUSD: 0.004}}
	run := startSim(t, cfg)
	ok := 0
	for i := 0; i < 10; i++ {
		r := post(t, run, soloKey, judgeBody(i, 256))
		if r.status == 200 {
			ok++
			continue
		}
		if r.status != 429 || !bytes.Contains(r.body, []byte(anthropic.SpendLimitErrorCode)) {
			t.Fatalf("status %d %s", r.status, r.body)
		}
	}
	// A judge call costs about $0.0015: two or three fit under $0.004.
	if ok < 2 || ok > 3 {
		t.Errorf("%d requests passed before the $0.004 cap", ok)
	}
}

func TestFaultAcceleration(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Faults = []Fault{{Kind: FaultAcceleration, FloorRPM: 120, Factor: 3, Window: 5 * time.Second, Baseline: 60 * time.Second, RetryAfter: 2 * time.Second}}
	run := startSim(t, cfg)
	ok, refused := 0, 0
	for i := 0; i < 30; i++ {
		r := post(t, run, soloKey, judgeBody(i, 64))
		switch r.status {
		case 200:
			ok++
		case 429:
			refused++
			if e := r.envelope(t); !strings.Contains(e.Error.Message, "acceleration") || r.header.Get("retry-after") != "2" {
				t.Fatalf("429 %q retry-after %q", e.Error.Message, r.header.Get("retry-after"))
			}
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	// 120 RPM over a 5 s window is 10 requests; after 11 the rate is above
	// the floor and, with no baseline, a sudden ramp.
	if ok != 11 || refused != 19 {
		t.Errorf("%d admitted, %d refused; want 11 and 19", ok, refused)
	}
}

// A fault with a probability hits about that fraction of requests, and the
// seed makes it repeatable.
func TestFaultProbability(t *testing.T) {
	t.Parallel()
	count := func() int {
		cfg := testConfig()
		cfg.Orgs[0].Limits[anthropic.PoolSonnet4] = Limits{RPM: 100000, ITPM: 1e9, OTPM: 1e9}
		cfg.Faults = []Fault{{Kind: FaultOverloaded, Probability: 0.3}}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for i := 0; i < 400; i++ {
			rec := newRecorder()
			req, _ := http.NewRequest("POST", "/v1/messages", bytes.NewReader(judgeBody(i, 64)))
			req.Header.Set("x-api-key", soloKey)
			req.Header.Set("anthropic-version", "2023-06-01")
			s.ServeHTTP(rec, req)
			if rec.status == 529 {
				n++
			}
		}
		return n
	}
	a, b := count(), count()
	if a != b {
		t.Errorf("same seed, %d then %d faults", a, b)
	}
	within(t, "529 share of 400", float64(a), 120, 0.25)
}

// Faults change at run time through the Go API and the admin endpoint.
func TestFaultsRuntimeAndAdmin(t *testing.T) {
	t.Parallel()
	run := startSim(t, testConfig())
	added, err := run.Server.AddFault(Fault{Kind: FaultOverloaded})
	if err != nil || len(added) != 1 || added[0].ID == "" {
		t.Fatalf("AddFault: %v %+v", err, added)
	}
	if r := post(t, run, soloKey, judgeBody(1, 64)); r.status != 529 {
		t.Fatalf("status %d after AddFault", r.status)
	}
	run.Server.ClearFaults(added[0].ID)
	if r := post(t, run, soloKey, judgeBody(2, 64)); r.status != 200 {
		t.Fatalf("status %d after ClearFaults", r.status)
	}
	// Admin: add a storm starting now for a minute, list, then delete all.
	r := do(t, "POST", run.URL+"/sim/faults", "", []byte(`{"kind":"storm_429","from_now":true,"duration":"60s","retry_after":1}`))
	if r.status != 200 || !bytes.Contains(r.body, []byte(`"storm_429"`)) {
		t.Fatalf("POST /sim/faults: %d %s", r.status, r.body)
	}
	if r := post(t, run, soloKey, judgeBody(3, 64)); r.status != 429 || r.header.Get("retry-after") != "1" {
		t.Fatalf("status %d retry-after %q after the admin storm", r.status, r.header.Get("retry-after"))
	}
	if r := do(t, "POST", run.URL+"/sim/faults", "", []byte(`{"kind":"nope"}`)); r.status != 400 {
		t.Errorf("bad fault: status %d", r.status)
	}
	if r := do(t, "DELETE", run.URL+"/sim/faults", "", nil); r.status != 200 || bytes.Contains(r.body, []byte("storm")) {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	if r := post(t, run, soloKey, judgeBody(4, 64)); r.status != 200 {
		t.Errorf("status %d after DELETE", r.status)
	}
	if err := run.Server.SetFaults(Fault{Kind: FaultOverloaded, Org: "nobody"}); err == nil {
		t.Error("a fault naming an unknown org was accepted")
	}
}

// recorder is a minimal ResponseWriter for calling the handler directly.
type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{h: http.Header{}} }

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(s int)   { r.status = s }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.body.Write(b)
}
