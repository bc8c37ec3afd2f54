package sim

import (
	"bytes"
	"crypto/sha256"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/org"
)

func TestLedger(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	cfg := testConfig()
	cfg.LedgerPath = path
	cfg.Orgs[0].Keys = []string{soloKey, "sk-ant-sim-solo-two"}
	cfg.Orgs = append(cfg.Orgs, OrgConfig{Name: "haiku_org", Keys: []string{"sk-h"}, Limits: map[anthropic.Pool]Limits{anthropic.PoolHaiku45: {RPM: 100}}})
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := startServer(t, s)

	var bodies [][]byte
	for i := 0; i < 4; i++ {
		bodies = append(bodies, judgeBody(i, 256))
		if r := post(t, run, soloKey, bodies[i]); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	// The same body again through the other key: billed, and a duplicate.
	if r := post(t, run, "sk-ant-sim-solo-two", bodies[0]); r.status != 200 {
		t.Fatal(r.status)
	}
	haiku := []byte(`{"model":"claude-haiku-4-5","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`)
	if r := post(t, run, "sk-h", haiku); r.status != 200 {
		t.Fatal(r.status)
	}
	// Not billed: a 400 and a 529.
	post(t, run, soloKey, []byte(`{"model":"claude-sonnet-4-5"}`))
	run.Server.AddFault(Fault{Kind: FaultOverloaded, Org: "solo"})
	post(t, run, soloKey, judgeBody(99, 256))

	led := s.Ledger()
	if len(led) != 6 {
		t.Fatalf("%d ledger entries, want 6", len(led))
	}
	for i, e := range led {
		if e.Seq != int64(i+1) || e.RequestID[:4] != "req_" || e.MessageID[:4] != "msg_" || e.Status != 200 || e.Delivery != DeliveryOK {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	if led[0].KeyFingerprint != org.Fingerprint(soloKey) || led[4].KeyFingerprint != org.Fingerprint("sk-ant-sim-solo-two") {
		t.Errorf("fingerprints %q %q", led[0].KeyFingerprint, led[4].KeyFingerprint)
	}
	if led[0].BodySHA256 != sha256.Sum256(bodies[0]) || led[4].BodySHA256 != led[0].BodySHA256 {
		t.Error("body hashes")
	}
	if led[0].Duplicate || !led[4].Duplicate {
		t.Errorf("duplicate flags %v %v", led[0].Duplicate, led[4].Duplicate)
	}
	if led[0].InputTokens != led[4].InputTokens || led[0].OutputTokens != led[4].OutputTokens || led[0].CostNanos != led[4].CostNanos {
		t.Error("the same body cost differently")
	}
	// Exact cost: Sonnet $3/$15 per Mtok = 3,000/15,000 nano-USD a token.
	for _, e := range led[:5] {
		if want := e.InputTokens*3000 + e.OutputTokens*15000; e.CostNanos != want || e.CostUSD != float64(want)/1e9 {
			t.Errorf("cost %d (%v USD), want %d", e.CostNanos, e.CostUSD, want)
		}
	}
	if e := led[5]; e.Org != "haiku_org" || e.CostNanos != e.InputTokens*1000+e.OutputTokens*5000 {
		t.Errorf("haiku entry %+v", e)
	}

	tot := s.LedgerTotals()
	var sum int64
	for _, e := range led {
		sum += e.CostNanos
	}
	if tot.Requests != 6 || tot.CostNanos != sum || tot.Duplicates != 1 || tot.DuplicateBodies != 1 ||
		tot.ByOrg["solo"].Requests != 5 || tot.ByOrg["haiku_org"].Requests != 1 ||
		tot.ByKey[org.Fingerprint(soloKey)].Requests != 4 || tot.ByKey[org.Fingerprint("sk-ant-sim-solo-two")].Duplicates != 1 {
		t.Errorf("totals %+v", tot)
	}
	if math.Abs(tot.CostUSD-float64(sum)/1e9) > 1e-12 {
		t.Errorf("USD %v vs nanos %d", tot.CostUSD, sum)
	}
	// One phase only: since a mark.
	mark := led[3].Seq
	if ph := TotalsOf(s.LedgerSince(mark)); ph.Requests != 2 || ph.Duplicates != 0 {
		t.Errorf("totals since mark %+v", ph)
	}

	// GET /sim/ledger and the --ledger file hold the same entries, and never a key.
	r := do(t, "GET", run.URL+"/sim/ledger", "", nil)
	viaHTTP, err := ReadLedgerJSONL(bytes.NewReader(r.body))
	if err != nil || len(viaHTTP) != 6 || viaHTTP[4].RequestID != led[4].RequestID || viaHTTP[4].CostNanos != led[4].CostNanos {
		t.Fatalf("/sim/ledger: %v %d entries", err, len(viaHTTP))
	}
	if r := do(t, "GET", run.URL+"/sim/ledger?since="+strconv.FormatInt(mark, 10), "", nil); bytes.Count(r.body, []byte("\n")) != 2 {
		t.Errorf("?since: %s", r.body)
	}
	run.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{soloKey, "sk-ant-sim-solo-two", "sk-h"} {
		if bytes.Contains(b, []byte(k)) || bytes.Contains(r.body, []byte(k)) {
			t.Fatalf("ledger holds key %q", k)
		}
	}
	fromFile, err := ReadLedgerJSONL(bytes.NewReader(b))
	if err != nil || len(fromFile) != 6 {
		t.Fatalf("ledger file: %v, %d entries", err, len(fromFile))
	}
	for i := range fromFile {
		if !fromFile[i].Time.Equal(led[i].Time) {
			t.Errorf("entry %d time %v vs %v", i, fromFile[i].Time, led[i].Time)
		}
		fromFile[i].Time = led[i].Time
		if fromFile[i] != led[i] {
			t.Errorf("file entry %d\n%+v\nwant\n%+v", i, fromFile[i], led[i])
		}
	}
}

func startServer(t *testing.T, s *Server) *Running {
	t.Helper()
	run, err := serve(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

func TestLedgerRetainBoundsMemoryNotTotals(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.LedgerRetain = 3
	run := startSim(t, cfg)
	for i := 0; i < 10; i++ {
		post(t, run, soloKey, judgeBody(i, 64))
	}
	if n := len(run.Server.Ledger()); n < 3 || n > 6 {
		t.Errorf("kept %d entries, want between 3 and 6", n)
	}
	if tot := run.Server.LedgerTotals(); tot.Requests != 10 {
		t.Errorf("totals count %d, want 10", tot.Requests)
	}
}

func TestCostNanos(t *testing.T) {
	t.Parallel()
	cases := []struct {
		model string
		u     anthropic.Usage
		want  int64
	}{
		{"claude-sonnet-4-5", anthropic.Usage{InputTokens: 100000}, 3e8},
		{"claude-sonnet-4-6", anthropic.Usage{OutputTokens: 1000000}, 15e9},
		{"claude-haiku-4-5-20251001", anthropic.Usage{InputTokens: 1000000, OutputTokens: 1000000}, 6e9},
		{"claude-opus-4-5", anthropic.Usage{InputTokens: 1000000, OutputTokens: 1000000}, 30e9},
		{"claude-opus-4-8", anthropic.Usage{CacheReadInputTokens: 1000000}, 0.5e9},
		// cache write 5m ×1.25, 1h ×2
		{"claude-sonnet-4-5", anthropic.Usage{CacheCreationInputTokens: 100000}, 3.75e8},
		{"claude-sonnet-4-6", anthropic.Usage{CacheCreationInputTokens: 2000000, CacheCreation: &anthropic.CacheCreation{Ephemeral5mInputTokens: 1000000, Ephemeral1hInputTokens: 1000000}}, 9.75e9},
		// Sonnet 4.5 above 200k total input: long-context rates for the whole request.
		{"claude-sonnet-4-5", anthropic.Usage{InputTokens: 300000, OutputTokens: 1000}, 300000*6000 + 1000*22500},
		{"claude-sonnet-4-6", anthropic.Usage{InputTokens: 300000}, 300000 * 3000},
		{"claude-sonnet-4-5", anthropic.Usage{InputTokens: 1}, 3000},
	}
	for _, c := range cases {
		got, ok := CostNanos(c.model, c.u)
		if !ok || got != c.want {
			t.Errorf("%s %+v: %d, want %d", c.model, c.u, got, c.want)
		}
	}
	if _, ok := CostNanos("gpt-4", anthropic.Usage{}); ok {
		t.Error("unknown model priced")
	}
}

// Prompt caching (when on): the first request writes the prefix, the next
// reads it; reads do not count against ITPM.
func TestPromptCaching(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.PromptCaching = true
	run := startSim(t, cfg)
	long := bytes.Repeat([]byte("rubric "), 8000) // ~15,556 tokens
	body := func(i int) []byte {
		return []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"system":[{"type":"text","text":"` + string(long) +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"item ` + strconv.Itoa(i) + `"}]}`)
	}
	start := time.Now()
	m1 := post(t, run, soloKey, body(1)).message(t)
	r2 := post(t, run, soloKey, body(2))
	elapsed := time.Since(start)
	m2 := r2.message(t)
	if m1.Usage.CacheCreationInputTokens < 1024 || m1.Usage.CacheReadInputTokens != 0 || m1.Usage.CacheCreation.Ephemeral5mInputTokens != m1.Usage.CacheCreationInputTokens {
		t.Errorf("first usage %+v: want a 5m cache write", m1.Usage)
	}
	if m2.Usage.CacheReadInputTokens != m1.Usage.CacheCreationInputTokens || m2.Usage.CacheCreationInputTokens != 0 {
		t.Errorf("second usage %+v: want a cache read", m2.Usage)
	}
	// ITPM charged: first request input+write; second only its input.
	led := run.Server.Ledger()
	rem, _ := strconv.ParseInt(r2.header.Get("anthropic-ratelimit-input-tokens-remaining"), 10, 64)
	// The bucket refills 1,000 tokens a second (60,000 a minute at speed
	// 1) while the test runs, and remaining is rounded to the nearest
	// thousand; a charged cache read would take 15,556 more.
	used := led[0].InputTokens + led[0].CacheWrite5m + led[1].InputTokens
	lo, hi := 60000-used-500, min(60000, 60000-used+int64(1000*elapsed.Seconds())+500)
	if rem < lo || rem > hi {
		t.Errorf("input remaining %d, want %d to %d (cache reads are free; %d used, %v elapsed)", rem, lo, hi, used, elapsed)
	}
	if led[1].CostNanos != led[1].InputTokens*3000+led[1].CacheRead*300+led[1].OutputTokens*15000 {
		t.Errorf("cache read priced wrong: %+v", led[1])
	}
}

// Concurrent billing from many goroutines keeps the totals exact.
func TestLedgerConcurrent(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Unlimited = true
	run := startSim(t, cfg)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				post(t, run, soloKey, judgeBody(g*1000+i, 64))
			}
		}()
	}
	wg.Wait()
	tot := run.Server.LedgerTotals()
	led := run.Server.Ledger()
	if tot.Requests != 200 || len(led) != 200 || TotalsOf(led).CostNanos != tot.CostNanos {
		t.Errorf("totals %+v, %d entries", tot.Totals, len(led))
	}
}
