package soak

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

func TestScheduleIsSeededAndBounded(t *testing.T) {
	t.Parallel()
	orgs := []string{"a", "b", "c"}
	const span = 30 * time.Minute
	m := DefaultMix()
	p1, err := m.Schedule(7, orgs, span)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := m.Schedule(7, orgs, span)
	if !reflect.DeepEqual(p1, p2) {
		t.Fatal("the same seed drew two plans")
	}
	if p3, _ := m.Schedule(8, orgs, span); reflect.DeepEqual(p1, p3) {
		t.Fatal("two seeds drew the same plan")
	}
	// 30 minutes with a storm every 90 s on average: 18 expected in 27 min.
	if len(p1.Storms) < 6 || len(p1.Storms) > 40 {
		t.Errorf("%d storms in %v", len(p1.Storms), span)
	}
	for _, f := range p1.Storms {
		if f.Kind != sim.FaultRateLimitStorm || !f.FromNow || f.Start < 0 || f.Start >= span*9/10 ||
			f.Duration < m.StormMin || f.Duration > m.StormMax || !strings.Contains("abc", f.Org) || f.Org == "" {
			t.Errorf("storm %+v out of bounds", f)
		}
	}
	kinds := map[sim.FaultKind]int{}
	for _, f := range p1.Faults {
		kinds[f.Kind]++
	}
	for _, k := range []sim.FaultKind{sim.FaultOverloaded, sim.FaultServerError, sim.FaultServerErrorHTML, sim.FaultConnectionReset, sim.FaultTruncatedBody} {
		if kinds[k] != 1 {
			t.Errorf("%d faults of kind %s, want 1", kinds[k], k)
		}
	}
	if p1.CapAfter != 0.95 || p1.CapOrg == "" || p1.CapFault().Org != p1.CapOrg || p1.CapFault().Kind != sim.FaultSpendCap {
		t.Errorf("cap of %q after %v: %+v", p1.CapOrg, p1.CapAfter, p1.CapFault())
	}
	// The simulator accepts every fault drawn.
	cfg, err := sim.Preset(sim.PresetBuild3Org)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(cfg.Orgs))
	for i, o := range cfg.Orgs {
		names[i] = o.Name
	}
	p, err := m.Schedule(1, names, span)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Faults = append(append(p.Faults, p.Storms...), p.CapFault())
	if _, err := sim.New(cfg); err != nil {
		t.Fatalf("the simulator refuses the plan: %v", err)
	}
}

func TestScheduleErrors(t *testing.T) {
	t.Parallel()
	m := DefaultMix()
	if _, err := m.Schedule(1, nil, time.Minute); err == nil {
		t.Error("no orgs accepted")
	}
	bad := m
	bad.StormMax = time.Second
	if _, err := bad.Schedule(1, []string{"a"}, time.Minute); err == nil {
		t.Error("a storm range max < min accepted")
	}
	if p, err := (Mix{}).Schedule(1, []string{"a"}, time.Hour); err != nil || len(p.Faults)+len(p.Storms) != 0 || p.CapOrg != "" {
		t.Errorf("the zero mix: %v %+v", err, p)
	}
}

func TestCheckResults(t *testing.T) {
	t.Parallel()
	ok := func(id string) string { return `{"custom_id":"` + id + `","result":{"type":"succeeded","message":{}}}` }
	bad := func(id, typ string) string {
		return `{"custom_id":"` + id + `","result":{"type":"errored","error":{"type":"error","error":{"type":"` + typ + `","message":"x"}}}}`
	}
	input := strings.Join([]string{`{"custom_id":"a","params":{}}`, `{"custom_id":"b","params":{}}`, "", `{"custom_id":"c","params":{}}`}, "\r\n")
	tests := []struct {
		name    string
		results []string
		want    Check
		lost    bool
	}{
		{"every id once", []string{ok("b"), ok("a"), bad("c", "invalid_request_error")},
			Check{Inputs: 3, Lines: 3, Succeeded: 2, Errored: 1, ErroredByType: map[string]int64{"invalid_request_error": 1}}, false},
		{"one missing", []string{ok("a"), ok("c")},
			Check{Inputs: 3, Lines: 2, Succeeded: 2, Missing: 1, ErroredByType: map[string]int64{}, Examples: []string{"b"}}, true},
		{"one twice", []string{ok("a"), ok("b"), ok("a"), ok("c"), ok("a")},
			Check{Inputs: 3, Lines: 5, Succeeded: 5, Repeated: 1, ErroredByType: map[string]int64{}, Examples: []string{"a"}}, true},
		{"one unknown", []string{ok("a"), ok("b"), ok("c"), ok("z")},
			Check{Inputs: 3, Lines: 4, Succeeded: 4, Unknown: 1, ErroredByType: map[string]int64{}, Examples: []string{"z"}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			in, res := filepath.Join(dir, "in.jsonl"), filepath.Join(dir, "res.jsonl")
			if err := os.WriteFile(in, []byte(input), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(res, []byte(strings.Join(tc.results, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := CheckResults(in, res)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) || got.Lost() != tc.lost {
				t.Errorf("got %+v (lost %v), want %+v (lost %v)", got, got.Lost(), tc.want, tc.lost)
			}
		})
	}
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.jsonl")
	os.WriteFile(broken, []byte("{\"custom_id\":\"a\"}\nnot json\n"), 0o600)
	if _, err := CheckResults(broken, broken); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("a broken line: %v", err)
	}
}

func TestAddWhenBilled(t *testing.T) {
	t.Parallel()
	cfg, err := sim.Preset(sim.PresetOrigin3Org)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Latency = sim.LatencyConfig{Zero: true}
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := s.Keys()["batch"][0]
	send := func() int {
		req := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(
			`{"model":"claude-sonnet-4-5-20250929","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}`))
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code
	}
	plan := Plan{CapOrg: "batch", CapAfter: 0.5}
	type result struct {
		added bool
		err   error
	}
	done := make(chan result, 1)
	go func() {
		added, err := AddWhenBilled(context.Background(), s, 3, time.Millisecond, plan.CapFault())
		done <- result{added, err}
	}()
	for i := 0; i < 3; i++ {
		if code := send(); code != 200 {
			t.Fatalf("request %d: status %d", i+1, code)
		}
	}
	if r := <-done; !r.added || r.err != nil {
		t.Fatalf("AddWhenBilled = %v, %v", r.added, r.err)
	}
	if code := send(); code != 429 {
		t.Errorf("after the cap: status %d, want 429", code)
	}

	// Never reached: gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if added, err := AddWhenBilled(ctx, s, 1000, time.Millisecond, plan.CapFault()); added || err != nil {
		t.Errorf("AddWhenBilled past its context = %v, %v", added, err)
	}
}
