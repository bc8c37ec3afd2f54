package campaign

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Issue 30's draws: OpenAI orgs and request files of OpenAI lines or of
// both providers' lines. They come from a random stream of their own, so a
// seed that draws no OpenAI part runs the scenario it always did.

// Request files a scenario's processes read (Scenario.Mix).
const (
	mixAnthropic = ""       // Claude judge lines only (every seed without OpenAI orgs)
	mixOpenAI    = "openai" // GPT judge lines only, in the OpenAI batch-input format
	mixBoth      = "mixed"  // both, interleaved
)

// oaOrgNames are the OpenAI orgs a scenario may add to the simulator.
var oaOrgNames = []string{"gpt_a", "gpt_b", "gpt_c"}

// OpenAIPart is what a seed draws of issue 30: the OpenAI orgs, the
// request file's providers, the GPT model and the OpenAI faults.
type OpenAIPart struct {
	Orgs int // OpenAI orgs in the simulator and the run's environment (0: none)
	// Only: the run gets the OpenAI orgs' keys alone (no Anthropic org);
	// its file is then all OpenAI lines.
	Only  bool
	Mix   string  // mixAnthropic, mixOpenAI or mixBoth
	Share float64 // of a mixed file's items, the GPT items
	Model string  // the GPT items' model
	// RPM and TPM of every OpenAI org for every model (per API minute),
	// and its enqueued-token limit per model (0: the simulator's default).
	RPM, TPM, QueueTokens int64
}

// oaModels are the GPT models the campaign's judge items ask (the judge
// asks for temperature 0, which the reasoning models refuse), with about
// what one item costs by sync.
var oaModels = []struct {
	id  string
	usd float64
}{{"gpt-4.1-mini", 0.00062}, {"gpt-4.1", 0.0031}}

// drawOpenAI adds issue 30's options to s: a third of the seeds run with
// one to three OpenAI orgs beside the Anthropic ones (a file of both
// providers' lines, or of GPT lines only) or instead of them (GPT lines
// only, and the run knows no Anthropic org); their limits are drawn from
// roomy to binding, and the OpenAI faults strike them: rate_limit_exceeded
// storms, insufficient_quota on one org (when another is left to take its
// items), 500s, 503s, resets and truncated bodies, and the batch faults.
// A --max-cost is redrawn as a fraction of what the file costs by sync.
func drawOpenAI(seed int64, s *Scenario) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x0bea_1a30_0030))
	if r.IntN(3) != 0 {
		return
	}
	o := &s.OpenAI
	o.Orgs = 1 + r.IntN(3)
	m := oaModels[0]
	if r.IntN(4) == 0 {
		m = oaModels[1]
	}
	o.Model = m.id
	switch x := r.IntN(6); {
	case x < 2:
		o.Only, o.Mix = true, mixOpenAI
	case x < 3:
		o.Mix = mixOpenAI
	default:
		o.Mix = mixBoth
		o.Share = 0.2 + 0.6*r.Float64()
	}
	switch r.IntN(3) {
	case 0: // roomy: the --cap binds
		o.RPM, o.TPM = 10_000, 10_000_000
	case 1: // the RPM binds at a few requests a second
		o.RPM = int64(120 + r.IntN(400))
		o.TPM = o.RPM * 4000
	default: // the TPM binds
		o.RPM = 5000
		o.TPM = int64(150_000 + r.IntN(450_000))
	}
	if s.Route != "sync" && r.IntN(3) == 0 {
		// About two batches' prompt tokens a model: batches fail with
		// token_limit_exceeded until the queue drains.
		o.QueueTokens = int64(2 * max(s.Batch, 20) * 700)
	}
	costShare := 0.0 // of the file's cost by sync, the --max-cost (0: none)
	if s.MaxCost > 0 {
		costShare = 0.15 + 0.6*r.Float64()
	}
	// run refuses --pilot for a file with OpenAI lines (the pilot
	// re-projects Anthropic models only), with a message that says so.
	s.Pilot = 0

	// OpenAI faults, in API time, on one OpenAI org or on all of them.
	orgOf := func() string {
		if r.IntN(2) == 0 {
			return ""
		}
		return oaOrgNames[r.IntN(o.Orgs)]
	}
	at := func() time.Duration { return time.Duration(r.IntN(60)) * time.Second }
	dur := func() time.Duration { return time.Duration(10+r.IntN(60)) * time.Second }
	for range r.IntN(4) {
		f := sim.Fault{Start: at(), Duration: dur(), Org: orgOf()}
		switch r.IntN(10) {
		case 0, 1, 2:
			// rate_limit_exceeded: retryable, retry-after 0–2 s.
			f.Kind, f.Probability = sim.FaultRateLimitStorm, 0.3+0.7*r.Float64()
			f.RetryAfter = time.Duration(r.IntN(3)) * time.Second
		case 3:
			f.Kind, f.Probability = sim.FaultServerError, 0.05+0.2*r.Float64()
		case 4:
			f.Kind, f.Probability = sim.FaultOverloaded, 0.05+0.3*r.Float64() // a 503 on the OpenAI surface
		case 5:
			f.Kind, f.Probability = sim.FaultConnectionReset, 0.02+0.15*r.Float64()
		case 6:
			f.Kind, f.Probability = sim.FaultTruncatedBody, 0.02+0.15*r.Float64()
		case 7:
			f.Kind, f.Probability = sim.FaultServerErrorHTML, 0.05+0.2*r.Float64()
		case 8:
			f.Kind, f.Probability = sim.FaultBatchCreateLost500, 0.2+0.5*r.Float64()
		case 9:
			f.Kind, f.Probability = sim.FaultBatchResultsCut, 0.3+0.5*r.Float64()
		}
		s.Faults = append(s.Faults, f)
	}
	if o.Orgs > 1 && r.IntN(3) == 0 {
		// insufficient_quota on one org, from a moment of the run to its
		// end: that org stops, the others take its items.
		s.Faults = append(s.Faults, sim.Fault{Kind: sim.FaultSpendCap, Org: oaOrgNames[r.IntN(o.Orgs)],
			Start: time.Duration(r.IntN(40)) * time.Second}) // Duration 0: to the end
	}
	s.fitOpenAI()
	if costShare > 0 {
		s.MaxCost = s.fileUSD(m.usd) * costShare
	}
}

// gptBudget is the most real time the GPT requests of a scenario may need
// on its OpenAI orgs at their full throughput (gptReal): a third of
// passTimeout, leaving the rest for a share of the cap lost between
// processes, the disturbances and the faults. Every Anthropic scenario
// spreads its items over three orgs; the GPT items of a file have only the
// OpenAI orgs, as few as one key.
const gptBudget = passTimeout / 3

// gptFewest is the fewest items per process fitOpenAI leaves.
const gptFewest = 40

// fitOpenAI shrinks the items of s until its GPT requests fit gptBudget
// (seed 144: 4 processes × 403 GPT items on one OpenAI key of --cap 3,
// shared, needed about 120 s at the cap, and every first pass ran past
// passTimeout while the runs were sending as fast as the cap let them).
func (s *Scenario) fitOpenAI() {
	for s.Items > gptFewest {
		need := s.gptReal()
		if need <= gptBudget {
			return
		}
		s.Items = max(gptFewest, int(float64(s.Items)*float64(gptBudget)/float64(need)))
	}
}

// gptReal is about the least real time the GPT requests of s take on the
// sync route (0 on the batch route, which no --cap or RPM paces): every
// process sends each of its GPT items, on the OpenAI orgs that keep
// answering (one stops at insufficient_quota when drawn), each org serving
// at most its slots (the --cap of the key, shared between the processes
// with --shared; each process's own without) over the mean latency of a
// judge answer, its RPM, or its TPM over a request's tokens.
func (s Scenario) gptReal() time.Duration {
	o := s.OpenAI
	if o.Orgs == 0 || s.Route == "batch" {
		return 0
	}
	reqs := float64(s.Procs * s.gptItems())
	orgs := o.Orgs
	for _, f := range s.Faults {
		if f.Kind == sim.FaultSpendCap {
			orgs = max(1, orgs-1)
		}
	}
	slots := float64(s.Cap)
	if !s.Shared {
		slots *= float64(s.Procs)
	}
	lat := sim.DefaultLatency()
	out := float64(s.MaxToks + s.Procs)
	mean := (lat.TTFT.Seconds()+out*lat.PerToken.Seconds())*math.Exp(lat.Sigma*lat.Sigma/2) +
		lat.TailProb*lat.TailMean.Seconds()
	perOrg := min(slots/mean, float64(o.RPM)/60, float64(o.TPM)/60/(gptPromptTokens+out)) // requests per API second
	return time.Duration(reqs / (perOrg * float64(orgs)) / s.Speed * float64(time.Second))
}

// gptPromptTokens is about the prompt tokens of one GPT judge item.
const gptPromptTokens = 700

// fileUSD is about what one process's file costs by sync, its GPT items
// at gptUSD each.
func (s Scenario) fileUSD(gptUSD float64) float64 {
	n := float64(s.Items)
	switch s.OpenAI.Mix {
	case mixOpenAI:
		return n * gptUSD
	case mixBoth:
		g := float64(s.gptItems())
		return (n-g)*perItemUSD + g*gptUSD
	}
	return n * perItemUSD
}

// gptItems is how many of a process's items are GPT items.
func (s Scenario) gptItems() int {
	switch s.OpenAI.Mix {
	case mixOpenAI:
		return s.Items
	case mixBoth:
		return max(1, min(s.Items-1, int(float64(s.Items)*s.OpenAI.Share)))
	}
	return 0
}

// oaOrgs are the simulator's OpenAI orgs of s.
func (o OpenAIPart) oaOrgs() []sim.OrgConfig {
	var out []sim.OrgConfig
	for _, name := range oaOrgNames[:o.Orgs] {
		out = append(out, sim.OrgConfig{Name: name, Provider: sim.ProviderOpenAI,
			ModelLimits: map[string]sim.OpenAILimits{"*": {RPM: o.RPM, TPM: o.TPM, BatchQueueTokens: o.QueueTokens}}})
	}
	return out
}

func (o OpenAIPart) String() string {
	if o.Orgs == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, ", %d OpenAI org(s) (RPM %d, TPM %d", o.Orgs, o.RPM, o.TPM)
	if o.QueueTokens > 0 {
		fmt.Fprintf(&b, ", enqueued tokens %d", o.QueueTokens)
	}
	b.WriteString(")")
	if o.Only {
		b.WriteString(" instead of the Anthropic ones")
	}
	switch o.Mix {
	case mixOpenAI:
		fmt.Fprintf(&b, ", a file of %s lines", o.Model)
	case mixBoth:
		fmt.Fprintf(&b, ", a mixed file (%.0f%% %s lines)", 100*o.Share, o.Model)
	}
	return b.String()
}

// writeItems writes process i's request file to w: Claude judge lines,
// GPT judge lines (ids prefix+"gpt_") or both interleaved in an order the
// seed picks. A max_tokens of the process's own makes every process's
// bodies distinct.
func writeItems(w io.Writer, sc Scenario, i int, prefix string) error {
	seed := sc.Seed*16 + int64(i)
	g := sc.gptItems()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, sc.Items-g, seed, workload.GenOptions{MaxTokens: sc.MaxToks + i, Prefix: prefix}); err != nil {
		return err
	}
	if g > 0 {
		opts := workload.GenOptions{MaxTokens: sc.MaxToks + i, Prefix: prefix + "gpt_", Model: sc.OpenAI.Model}
		if err := workload.GenerateOpenAIJudge(&gpt, g, seed, opts); err != nil {
			return err
		}
	}
	cl, gl := bytes.SplitAfter(claude.Bytes(), []byte("\n")), bytes.SplitAfter(gpt.Bytes(), []byte("\n"))
	cl, gl = cl[:len(cl)-1], gl[:max(0, len(gl)-1)] // the empty piece after the last newline
	r := rand.New(rand.NewPCG(uint64(seed), 0x30))
	var out bytes.Buffer
	for len(cl)+len(gl) > 0 {
		if len(gl) > 0 && (len(cl) == 0 || r.IntN(len(cl)+len(gl)) < len(gl)) {
			out.Write(gl[0])
			gl = gl[1:]
		} else {
			out.Write(cl[0])
			cl = cl[1:]
		}
	}
	_, err := w.Write(out.Bytes())
	return err
}
