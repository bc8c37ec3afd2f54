package dispatch_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/internal/testredis"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/shared"
	"github.com/apidispatch/apidispatch/sim"
)

// politeCase is one of issue 22's cases: three orgs whose buckets bind, a
// colleague drawing a share of one org's refill, and our run.
type politeCase struct {
	name      string
	limits    sim.Limits // every org's, in API units per minute
	colleague float64    // share of the first org's refill the colleague draws
	bursts    bool       // the colleague draws in random bursts
	items     string     // "judge", "long-prompt" (~3k tokens), "long-output" (max_tokens 2,048, asked "at length")
	share     int        // run 1/share of the items (0: all)
	// procs > 1 runs the items as that many processes on the same keys
	// with --shared (each a third of the items, its own run directory and
	// its own shared.Budget on one Redis), in this process.
	procs int
	// stagger starts each process after the first this much later (API
	// time), as processes started a moment apart are.
	stagger time.Duration
}

// politeCases are the bucket-bound cases of issue 22 (60 requests, or their
// tokens, per API minute per org).
var politeCases = []politeCase{
	{name: "rpm-continuous", limits: sim.Limits{RPM: 60, ITPM: 10_000_000, OTPM: 10_000_000}, colleague: 0.4, items: "judge"},
	{name: "rpm-bursts", limits: sim.Limits{RPM: 60, ITPM: 10_000_000, OTPM: 10_000_000}, colleague: 0.4, bursts: true, items: "judge"},
	{name: "itpm", limits: sim.Limits{RPM: 10_000, ITPM: 180_000, OTPM: 10_000_000}, colleague: 0.4, items: "long-prompt"},
	// Long outputs (1,200–2,400 tokens asked, cut at max_tokens 2,048;
	// about 1,750 on average): 60,000 output tokens a minute is about 34
	// requests, so the case runs a quarter of the items in about the time
	// of the others.
	{name: "otpm", limits: sim.Limits{RPM: 10_000, ITPM: 10_000_000, OTPM: 60_000}, colleague: 0.4, items: "long-output", share: 4},
	// rpm-continuous run by three --shared processes on the same keys:
	// together they must be no ruder than one.
	{name: "rpm-shared3", limits: sim.Limits{RPM: 60, ITPM: 10_000_000, OTPM: 10_000_000}, colleague: 0.4, items: "judge", procs: 3},
	// The same, each process started 3 API seconds after the one before
	// (150 ms at K=20): each joins others already drawing on the keys.
	{name: "rpm-shared3-staggered", limits: sim.Limits{RPM: 60, ITPM: 10_000_000, OTPM: 10_000_000}, colleague: 0.4, items: "judge", procs: 3, stagger: 3 * time.Second},
}

// politeResult is what one case measured.
type politeResult struct {
	throughput float64            // steady completions ÷ what the buckets leave
	rate429    map[string]float64 // per org: 429s ÷ attempts (the simulator's count)
	attempts   map[string]int64
	worst429   float64
	refused    float64 // the colleague's refused draws ÷ its draws (worst bucket)
	lost       int64   // items without exactly one outcome
}

func (r politeResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "throughput %.3f of what the buckets leave; colleague refused %.2f%% of its draws; lost %d; 429s:", r.throughput, r.refused*100, r.lost)
	for _, o := range []string{"one", "two", "three"} {
		fmt.Fprintf(&b, " %s %.2f%% of %d", o, r.rate429[o]*100, r.attempts[o])
	}
	return b.String()
}

// writeItems writes n requests of the case's kind to dir/req.jsonl.
func writeItems(t testing.TB, dir, kind string, n int) string {
	t.Helper()
	if kind == "judge" {
		return simtest.Judge(t, dir, n, 1)
	}
	path := filepath.Join(dir, "req.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	// About 3,000 tokens: 12,000 characters of prose.
	para := strings.Repeat("The committee met again to weigh the evidence on the river crossing. ", 176)
	for i := range n {
		switch kind {
		case "long-prompt":
			fmt.Fprintf(w, `{"custom_id":"p%06d","params":{"model":"claude-sonnet-4-5-20250929","max_tokens":64,"messages":[{"role":"user","content":"%s Summarise item %d."}]}}`+"\n", i, para, i)
		case "long-output":
			fmt.Fprintf(w, `{"custom_id":"o%06d","params":{"model":"claude-sonnet-4-5-20250929","max_tokens":2048,"messages":[{"role":"user","content":"Write at length about the river crossing, part %d."}]}}`+"\n", i, i)
		default:
			t.Fatalf("unknown item kind %q", kind)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// politeSim is three orgs ("one" with the colleague, "two", "three") of
// limits l at speed k.
func politeSim(c politeCase) func(*sim.Config) {
	return func(cfg *sim.Config) {
		cfg.Orgs = []sim.OrgConfig{
			{Name: "one", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: c.limits}, ServiceCapacity: 120},
			{Name: "two", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: c.limits}, ServiceCapacity: 120},
			{Name: "three", Limits: map[anthropic.Pool]sim.Limits{sim.AnyPool: c.limits}, ServiceCapacity: 120},
		}
		cfg.PromptCaching = false
		if c.colleague > 0 {
			cfg.Faults = []sim.Fault{{ID: "colleague", Kind: sim.FaultColleague, Org: "one", Fraction: c.colleague, Bursts: c.bursts}}
		}
	}
}

// runPolite runs case c with n items at speed k and measures it.
func runPolite(t testing.TB, c politeCase, n int, k float64) politeResult {
	t.Helper()
	if c.share > 1 {
		n /= c.share
	}
	r, _ := simtest.Start(t, sim.PresetBuild3Org, k, politeSim(c))
	dir := t.TempDir()
	h := &harness{t: t, sim: r, input: writeItems(t, dir, c.items, n), dir: filepath.Join(dir, "run"), orgs: r.Server.Orgs(), speed: k}
	// Past the first third the one-minute buckets have been drained. The
	// steady rate is read from the simulator's completions (the engine's
	// progress is not safe to read before Run has begun).
	var t35, t95 time.Time
	var c35, c95 int64
	done := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tk.C:
				var c int64
				for _, o := range r.Server.Stats().Orgs {
					c += o.Completions
				}
				if t35.IsZero() && float64(c) >= 0.35*float64(n) {
					t35, c35 = now, c
				}
				if t95.IsZero() && float64(c) >= 0.95*float64(n) {
					t95, c95 = now, c
				}
			}
		}
	}()
	var s rundir.Summary
	if c.procs > 1 {
		s = runSharedProcs(t, h, c.procs, c.stagger)
		close(done)
		<-polled
	} else {
		res0, err := h.run(context.Background(), nil)
		close(done)
		<-polled
		if err != nil {
			t.Fatal(err)
		}
		s = *res0.Summary
	}
	var rate float64
	if !t95.IsZero() && t95.After(t35) {
		rate = float64(c95-c35) / t95.Sub(t35).Seconds()
	}
	res := politeResult{rate429: map[string]float64{}, attempts: map[string]int64{}}
	res.lost = s.DataLoss.Missing + s.DataLoss.Duplicates + s.DataLoss.Unfinished
	if !s.DataLoss.Passed {
		res.lost = max(res.lost, 1)
	}
	// What the buckets leave us per API minute, in requests: each org's
	// binding limit (in requests, from the run's tokens per request) less
	// the colleague's share.
	in := float64(s.Tokens.Input+s.Tokens.CacheWrite) / float64(s.Succeeded)
	out := float64(s.Tokens.Output) / float64(s.Succeeded)
	per := min(float64(c.limits.RPM), float64(c.limits.ITPM)/in, float64(c.limits.OTPM)/out)
	ceiling := per * (3 - c.colleague)
	res.throughput = rate * 60 / k / ceiling
	for _, l := range s.Lanes {
		t.Logf("lane %s (%s): pace %v of %v per API-min, others seen %d, cuts %d, limit %v", l.Org, l.Pool, l.Pace, l.BucketLim, l.OthersSeen, l.Cuts, l.Limit)
	}
	stats := r.Server.Stats()
	if os.Getenv("APIDISPATCH_POLITE_SERIES") != "" {
		// When the 429s came (API seconds), per org.
		for _, o := range stats.Orgs {
			for _, p := range o.Series {
				if p.RateLimited > 0 {
					t.Logf("%s t=%d admitted %d 429 %d", o.Name, p.T, p.Admitted, p.RateLimited)
				}
			}
		}
	}
	for _, o := range stats.Orgs {
		res.attempts[o.Name] = o.Requests
		if o.Requests > 0 {
			res.rate429[o.Name] = float64(o.RateLimited429) / float64(o.Requests)
		}
		res.worst429 = max(res.worst429, res.rate429[o.Name])
		for _, p := range o.Pools {
			for i := range 3 {
				if p.ColleagueWanted[i] > 0 {
					res.refused = max(res.refused, float64(p.ColleagueRefused[i])/float64(p.ColleagueWanted[i]))
				}
			}
		}
	}
	return res
}

// BenchmarkPolite prints issue 22's figures: for each bucket-bound case,
// throughput as a fraction of what the buckets leave, 429s as a fraction
// of attempts on every org, and the colleague's refused draws as a
// fraction of its draws. APIDISPATCH_POLITE_N items (default 2,400) at
// K=20.
func BenchmarkPolite(b *testing.B) {
	n := 2400
	if v := os.Getenv("APIDISPATCH_POLITE_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	for _, c := range politeCases {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				r := runPolite(b, c, n, 20)
				b.ReportMetric(r.throughput, "throughput")
				b.ReportMetric(r.worst429*100, "%429-worst-org")
				b.ReportMetric(r.refused*100, "%colleague-refused")
				b.Logf("%s: %v", c.name, r)
			}
		})
	}
}

// TestPoliteWhenAColleagueSharesTheOrg is issue 22's regression test: a
// small version of the colleague cases that bind on requests (continuous
// and in bursts) and on input tokens (the output-token case is held by
// BenchmarkPolite: see docs/politeness.md). The bursty case failed (the colleague
// refused 25-30 % of its draws) while the lane scaled the mirror's window
// by the speed twice.
// Draining the bucket made the colleague's draws be refused and gave us
// 429s on every org (36 % on the colleague's org before the fix); now 429s
// stay rare, the colleague is almost never refused, and throughput holds.
// The margins are wide enough for a loaded 2-core machine under -race.
// raceBuild is set under -race (race_on_test.go).
var raceBuild bool

// politeTestSpeed is the one-process regression test's K: 20, or 10 under
// -race, whose slowdown at K=20 made the colleague's org see 3–7 % 429s in
// the first API seconds on a loaded machine (none at K=20 without it).
func politeTestSpeed() float64 {
	if raceBuild {
		return 10
	}
	return 20
}

// politeRedis is an empty Redis database for the shared cases: database 2
// of the test server, emptied first (the simulator's keys, hence the lanes'
// names in Redis, are the same in every run).
func politeRedis(t testing.TB) string {
	t.Helper()
	return testredis.EmptyDB(t, 2)
}

// runSharedProcs runs h's items as procs processes with --shared: the
// input is dealt out line by line, and each "process" has its own Job, run
// directory and shared.Budget (its own process id) on one Redis, as
// 'apidispatch run --shared' would; each starts stagger (API time) after
// the one before. It returns their summaries added up:
// items, outcomes and losses, tokens, and every process's lanes.
func runSharedProcs(t testing.TB, h *harness, procs int, stagger time.Duration) rundir.Summary {
	t.Helper()
	url := politeRedis(t)
	raw, err := os.ReadFile(h.input)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimRight(string(raw), "\n"), "\n")
	base := filepath.Dir(h.dir)
	type proc struct {
		eng *dispatch.Engine
		job *rundir.Job
		b   *shared.Budget
		res *dispatch.Result
		err error
	}
	ps := make([]*proc, procs)
	for i := range ps {
		var part strings.Builder
		for j := i; j < len(lines); j += procs {
			part.WriteString(strings.TrimRight(lines[j], "\n") + "\n")
		}
		in := filepath.Join(base, fmt.Sprintf("req%d.jsonl", i))
		if err := os.WriteFile(in, []byte(part.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		p := &proc{}
		p.job, err = rundir.OpenJob(context.Background(), rundir.JobConfig{InputPath: in, RunDir: filepath.Join(base, fmt.Sprintf("run%d", i)), Prices: cost.Default()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.job.Close() })
		p.b, err = shared.Open(context.Background(), shared.Config{URL: url, Orgs: h.orgs, Events: p.job.Events})
		if err != nil {
			t.Fatal(err)
		}
		cfg := dispatch.Config{Orgs: h.orgs, BaseURL: h.sim.URL, Speed: h.speed, Prices: cost.Default(), SampleEvery: -1, NewGate: p.b.NewGate}
		p.eng, err = dispatch.NewForJob(p.job, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	h.startFaults()
	var wg sync.WaitGroup
	for i, p := range ps {
		if i > 0 && stagger > 0 {
			time.Sleep(time.Duration(float64(stagger) / h.speed))
		}
		p.b.Start(context.Background())
		wg.Go(func() {
			p.res, p.err = p.eng.Run(context.Background())
			p.b.Close()
		})
	}
	wg.Wait()
	var s rundir.Summary
	s.DataLoss.Passed = true
	for i, p := range ps {
		if p.err != nil {
			t.Fatalf("process %d: %v", i, p.err)
		}
		ps := p.res.Summary
		s.Succeeded += ps.Succeeded
		s.Tokens.Input += ps.Tokens.Input
		s.Tokens.Output += ps.Tokens.Output
		s.Tokens.CacheWrite += ps.Tokens.CacheWrite
		s.Tokens.CacheRead += ps.Tokens.CacheRead
		d := ps.DataLoss
		s.DataLoss.Inputs += d.Inputs
		s.DataLoss.Outcomes += d.Outcomes
		s.DataLoss.Missing += d.Missing
		s.DataLoss.Duplicates += d.Duplicates
		s.DataLoss.Unfinished += d.Unfinished
		s.DataLoss.Passed = s.DataLoss.Passed && d.Passed && p.res.Complete
		for _, l := range ps.Lanes {
			l.Org = fmt.Sprintf("%s, process %d", l.Org, i)
			s.Lanes = append(s.Lanes, l)
		}
	}
	return s
}
