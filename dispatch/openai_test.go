package dispatch_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/workload"
)

// oaOrgs adds three OpenAI orgs to a simulator's configuration: gpt_a,
// gpt_b, gpt_c, each with rpm RPM and tpm TPM on every model.
func oaOrgs(rpm, tpm int64) func(*sim.Config) {
	return func(c *sim.Config) {
		for _, n := range []string{"gpt_a", "gpt_b", "gpt_c"} {
			c.Orgs = append(c.Orgs, sim.OrgConfig{Name: n, Provider: sim.ProviderOpenAI, ServiceCapacity: 120,
				ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: rpm, TPM: tpm}}})
		}
	}
}

// oaHarness is a harness over a simulator with the preset's Anthropic orgs
// and three OpenAI orgs, whose input holds nGPT OpenAI judge items and
// (mixed) nClaude Claude judge items, interleaved.
func oaHarness(t testing.TB, speed float64, nGPT, nClaude int, mutate func(*sim.Config)) *harness {
	t.Helper()
	r, _ := simtest.Start(t, sim.PresetBuild3Org, speed, func(c *sim.Config) {
		oaOrgs(3000, 1_000_000)(c)
		if mutate != nil {
			mutate(c)
		}
	})
	dir := t.TempDir()
	var gpt, claude strings.Builder
	if err := workload.GenerateOpenAIJudge(&gpt, nGPT, 1, workload.GenOptions{MaxTokens: 256}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateJudge(&claude, nClaude, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	g, c := strings.Split(strings.TrimSpace(gpt.String()), "\n"), strings.Split(strings.TrimSpace(claude.String()), "\n")
	if nClaude == 0 {
		c = nil
	}
	var lines []string
	for i := 0; i < max(len(g), len(c)); i++ {
		if i < len(c) {
			lines = append(lines, c[i])
		}
		if i < len(g) {
			lines = append(lines, g[i])
		}
	}
	input := filepath.Join(dir, "req.jsonl")
	if err := os.WriteFile(input, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, sim: r, input: input, dir: filepath.Join(dir, "run"), orgs: r.Server.AllOrgs(), speed: speed}
}

// oaLine is what a test reads of a results line of either provider.
type oaLine struct {
	CustomID string `json:"custom_id"`
	ID       string `json:"id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Result *struct {
		Type string `json:"type"`
	} `json:"result"`
	Dispatch struct {
		Org string `json:"org"`
	} `json:"dispatch"`
}

func (h *harness) lines() []oaLine {
	h.t.Helper()
	f, err := os.Open(filepath.Join(h.dir, rundir.ResultsFile))
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	var out []oaLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l oaLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			h.t.Fatalf("results line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

func isGPT(id string) bool { return strings.HasPrefix(id, "gpt_judge_") }

// checkProviders fails unless each line is its provider's: a GPT item's
// line is the OpenAI batch output line with a chat completion, served by
// an OpenAI org; a Claude item's is unchanged, served by an Anthropic org.
func (h *harness) checkProviders(ls []oaLine) {
	h.t.Helper()
	prov := map[string]string{}
	for _, o := range h.orgs {
		prov[o.Name] = o.ProviderName()
	}
	for _, l := range ls {
		if isGPT(l.CustomID) {
			if l.Response == nil || l.Response.StatusCode != 200 || !strings.HasPrefix(l.ID, "batch_req_") || l.Result != nil ||
				!strings.Contains(string(l.Response.Body), `"object":"chat.completion"`) || l.Response.RequestID == "" {
				h.t.Fatalf("GPT item %s: line %+v", l.CustomID, l)
			}
			if prov[l.Dispatch.Org] != org.OpenAI {
				h.t.Fatalf("GPT item %s served by %q", l.CustomID, l.Dispatch.Org)
			}
			continue
		}
		if l.Result == nil || l.Result.Type != "succeeded" || l.Response != nil || prov[l.Dispatch.Org] != org.Anthropic {
			h.t.Fatalf("Claude item %s: line %+v (org %q)", l.CustomID, l, l.Dispatch.Org)
		}
	}
}

// A GPT judge job over three OpenAI orgs by the sync engine: every item
// once, each to an OpenAI org, in the OpenAI output format, and the run's
// cost equal to the simulator's ledger to the nano-dollar.
func TestOpenAIJudgeOverThreeOrgs(t *testing.T) {
	t.Parallel()
	const n = 300
	h := oaHarness(t, 50, n, 0, nil)
	res, err := h.run(t.Context(), nil)
	if err != nil || !res.Complete {
		t.Fatalf("run: %v", err)
	}
	h.requireEachOnce(n)
	ls := h.lines()
	h.checkProviders(ls)
	led := h.sim.Server.LedgerTotals()
	if led.Requests != n || led.Duplicates != 0 {
		t.Fatalf("ledger: %d requests, %d duplicates; want %d, 0", led.Requests, led.Duplicates, n)
	}
	if got := res.Summary.Cost.TotalNanos; got != led.CostNanos || got == 0 {
		t.Fatalf("summary cost %d n$, ledger %d n$", got, led.CostNanos)
	}
	served := map[string]int{}
	for _, l := range ls {
		served[l.Dispatch.Org]++
	}
	if len(served) != 3 {
		t.Fatalf("served by %v: want the three OpenAI orgs", served)
	}
}

// A mixed file (Claude and GPT items) in one run: each item to its
// provider's orgs, one spend gate across both, and --max-cost never
// passed (the ledger of both APIs stays within it).
func TestMixedFileOneSpendGate(t *testing.T) {
	t.Parallel()
	const n = 150
	for _, capped := range []bool{false, true} {
		name := "uncapped"
		if capped {
			name = "capped"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := oaHarness(t, 50, n, n, nil)
			var maxCost cost.Nanos
			if capped {
				// About a third of what the whole file costs.
				maxCost = 150 * cost.NanosPerUSD / 1000
			}
			res, err := h.run(t.Context(), func(c *dispatch.Config) { c.MaxCost = maxCost })
			led := h.sim.Server.LedgerTotals()
			if res.Summary.Cost.TotalNanos != led.CostNanos {
				t.Fatalf("summary cost %d n$, ledger %d n$", res.Summary.Cost.TotalNanos, led.CostNanos)
			}
			ls := h.lines()
			h.checkProviders(ls)
			if !capped {
				if err != nil || !res.Complete {
					t.Fatalf("run: %v", err)
				}
				h.requireEachOnce(2 * n)
				t.Logf("the whole mixed file cost %d n$", led.CostNanos)
				return
			}
			if !errors.Is(err, spend.ErrCapReached) || res.Complete {
				t.Fatalf("a capped run ended %v (complete %v); want the cap reached", err, res.Complete)
			}
			if led.CostNanos > int64(maxCost) {
				t.Fatalf("--max-cost passed: the APIs billed %d n$ > %d n$", led.CostNanos, maxCost)
			}
			gpt, claude := 0, 0
			for _, l := range ls {
				if isGPT(l.CustomID) {
					gpt++
				} else {
					claude++
				}
			}
			if gpt == 0 || claude == 0 {
				t.Fatalf("the cap let %d GPT and %d Claude items through: want both providers under one gate", gpt, claude)
			}
		})
	}
}

// insufficient_quota on one OpenAI org stops that org only, with a
// message naming it: its items go to the other OpenAI orgs, nothing is
// lost, and the Anthropic orgs are untouched.
func TestInsufficientQuotaStopsThatOrgOnly(t *testing.T) {
	t.Parallel()
	const n = 200
	h := oaHarness(t, 50, n, 20, nil)
	h.faults = []sim.Fault{{Kind: sim.FaultSpendCap, Org: "gpt_b"}}
	res, err := h.run(t.Context(), nil)
	if err != nil || !res.Complete {
		t.Fatalf("run: %v", err)
	}
	h.requireEachOnce(n + 20)
	ls := h.lines()
	h.checkProviders(ls)
	for _, l := range ls {
		if l.Dispatch.Org == "gpt_b" {
			t.Fatalf("item %s served by gpt_b, whose quota is used up", l.CustomID)
		}
	}
	if led := h.sim.Server.LedgerTotals(); led.ByOrg["gpt_b"].Requests != 0 || res.Summary.Cost.TotalNanos != led.CostNanos {
		t.Fatalf("ledger %+v, summary %d n$", led, res.Summary.Cost.TotalNanos)
	}
	var lane *struct{ disabled string }
	for _, l := range res.Summary.Lanes {
		if l.Org == "gpt_b" && strings.Contains(l.Disabled, "quota") {
			lane = &struct{ disabled string }{l.Disabled}
		}
		if l.Org != "gpt_b" && l.Disabled != "" {
			t.Fatalf("lane %s/%s stopped too: %s", l.Org, l.Pool, l.Disabled)
		}
	}
	if lane == nil {
		t.Fatalf("no lane of gpt_b stopped for its quota: %+v", res.Summary.Lanes)
	}
	if strings.Contains(lane.disabled, "sk-") {
		t.Fatalf("a key in the reason: %s", lane.disabled)
	}
}

// BenchmarkOpenAILimitBound is issue 30's figure for 'run': a GPT judge
// job over three OpenAI orgs whose limits bind before the caps (gpt_a by
// its RPM, gpt_b by its TPM, gpt_c by both about equally), steady
// throughput against the limit-bound ceiling Σ min(RPM, TPM ÷ (prompt +
// max_completion_tokens), cap ÷ latency) per API minute, the 429s, items
// lost, and the run's cost against the simulator's ledger.
func BenchmarkOpenAILimitBound(b *testing.B) {
	const k, n, maxOut = 10, 50_000, 256
	limits := map[string]sim.OpenAILimits{
		"gpt_a": {RPM: 1000, TPM: 10_000_000},
		"gpt_b": {RPM: 5000, TPM: 450_000},
		"gpt_c": {RPM: 800, TPM: 450_000},
	}
	for range b.N {
		h := oaHarness(b, k, n, 0, func(c *sim.Config) {
			for i := range c.Orgs {
				if l, ok := limits[c.Orgs[i].Name]; ok {
					c.Orgs[i].ModelLimits = map[string]sim.OpenAILimits{"*": l}
				}
			}
		})
		st := measureWindow(b, h, nil, 0.5, 0.95)
		s := st.res.Summary
		prompt := float64(s.Tokens.Input+s.Tokens.CacheRead) / float64(s.Succeeded)
		var ceiling float64
		for _, l := range limits {
			c := min(float64(l.RPM), float64(l.TPM)/(prompt+maxOut))
			if st.meanLatS > 0 {
				c = min(c, 120/(st.meanLatS*k)*60)
			}
			ceiling += c
		}
		led := h.sim.Server.LedgerTotals()
		lost := int64(n) - s.Succeeded - s.Errored
		b.ReportMetric(st.rate*60/k/ceiling, "of-ceiling")
		b.ReportMetric(st.rate*60/k, "api-rpm")
		b.ReportMetric(ceiling, "ceiling-rpm")
		b.ReportMetric(float64(s.RateLimited429)/float64(s.Attempts)*100, "%429")
		b.ReportMetric(float64(lost), "lost")
		b.ReportMetric(float64(s.Cost.TotalNanos-led.CostNanos), "summary-minus-ledger-n$")
		b.Logf("%d items: %d succeeded, %d errored, %d lost; %d attempts, %d 429s; prompt %.1f tokens; summary %d n$, ledger %d n$ (%d requests, %d duplicates); %.1f API RPM of a %.1f ceiling = %.4f",
			n, s.Succeeded, s.Errored, lost, s.Attempts, s.RateLimited429, prompt, s.Cost.TotalNanos, led.CostNanos, led.Requests, led.Duplicates,
			st.rate*60/k, ceiling, st.rate*60/k/ceiling)
		if lost != 0 || s.Cost.TotalNanos != led.CostNanos || led.Requests != int64(n) {
			b.Errorf("lost %d, summary %d n$ vs ledger %d n$, %d billed of %d", lost, s.Cost.TotalNanos, led.CostNanos, led.Requests, n)
		}
	}
}

// Two keys of one OpenAI organisation add no capacity: the engine learns
// the organisation of each (openai-organization), the later org's lanes
// stop and its work goes through the earlier's, and the two never hold
// more than one cap in flight.
func TestOpenAITwoKeysOfOneOrganisation(t *testing.T) {
	t.Parallel()
	const n = 120
	h := oaHarness(t, 50, n, 0, func(c *sim.Config) {
		for i := range c.Orgs {
			if c.Orgs[i].Name == "gpt_a" {
				c.Orgs[i].Keys = []string{"sk-proj-sim-gpt-a-one", "sk-proj-sim-gpt-a-two"}
			}
		}
	})
	var orgs []org.Org
	for _, o := range h.orgs {
		if o.ProviderName() == org.OpenAI {
			orgs = append(orgs, o)
		}
		if o.Name == "gpt_a" {
			orgs = append(orgs, org.Org{Name: "gpt_a_second", Key: org.NewKey("sk-proj-sim-gpt-a-two"), Provider: org.OpenAI})
		}
	}
	h.orgs = orgs
	const capN = 5
	res, err := h.run(t.Context(), func(c *dispatch.Config) { c.Caps = map[string]int{"gpt-mini": capN} })
	if err != nil || !res.Complete {
		t.Fatalf("run: %v", err)
	}
	h.requireEachOnce(n)
	// Until both keys' organisation is known the one known may send (the
	// rule's design); together they never pass the one cap.
	if st := h.sim.Server.Stats().Org("gpt_a"); st.MaxInFlight > capN || st.MaxInFlight == 0 {
		t.Fatalf("gpt_a's organisation had %d requests in flight over its two keys, above the cap of %d (0: not measured)", st.MaxInFlight, capN)
	}
	stopped := false
	for _, l := range res.Summary.Lanes {
		if l.Org == "gpt_a_second" && strings.Contains(l.Disabled, "same organisation") {
			stopped = true
		}
	}
	if !stopped {
		t.Fatalf("gpt_a_second's lanes did not stop: %+v", res.Summary.Lanes)
	}
}

// The result cache answers OpenAI items too: a second run of a GPT judge
// file sends nothing, and its lines are the OpenAI output lines of the
// first run's answers, marked cached.
func TestCacheAnswersOpenAIItems(t *testing.T) {
	t.Parallel()
	const n = 60
	h := oaHarness(t, 50, n, 0, nil)
	c := openCache(t, filepath.Join(t.TempDir(), "cache.db"))
	first := h.runInto(h.input, "one", c, nil)
	one := h.lines()
	sent := h.sim.Server.LedgerTotals().Requests
	second := h.runInto(h.input, "two", c, nil)
	two := h.lines()
	if d := h.sim.Server.LedgerTotals().Requests - sent; d != 0 || second.Cache == nil || second.Cache.Hits != n || second.Cost.TotalNanos != 0 {
		t.Fatalf("second run sent %d requests; cache %+v; cost %d n$ (first %d n$)", d, second.Cache, second.Cost.TotalNanos, first.Cost.TotalNanos)
	}
	h.checkProviders(two)
	body := map[string]string{}
	for _, l := range one {
		body[l.CustomID] = string(l.Response.Body)
	}
	for _, l := range two {
		if string(l.Response.Body) != body[l.CustomID] {
			t.Fatalf("%s: the cached answer differs from the first run's", l.CustomID)
		}
	}
}
