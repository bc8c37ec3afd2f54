package campaign

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

// Disturbance kinds: what happens to a process, or to Redis, while it runs.
const (
	dStop      = "sigstop"       // SIGSTOP, then SIGCONT after For
	dKill      = "kill9"         // SIGKILL; the process is resumed by the next pass
	dRedis     = "redis_restart" // Redis killed and restarted empty after For
	dPartition = "partition"     // the process's Redis connection blackholed for For
	dDiskFull  = "disk_full"     // RLIMIT_FSIZE just above its largest file
)

// Disturbance is one process disturbance, at a real time after the first
// pass of the processes started.
type Disturbance struct {
	Kind string
	Proc int           // the process it strikes (ignored by redis_restart)
	At   time.Duration // real time after the start of the first pass
	For  time.Duration // how long a stop, a partition or a Redis outage lasts
}

// Scenario is one draw of the campaign: everything a seed decides.
type Scenario struct {
	Seed     int64
	Speed    float64
	Route    string        // sync, batch or auto
	Deadline time.Duration // --deadline (auto only; 0 none)
	Batch    int           // --batch-size (batch and auto)
	MaxCost  float64       // --max-cost in USD per run directory (0 none)
	Procs    int           // processes on the same keys, each its own items and run directory
	Shared   bool          // --shared through Redis
	Fallback bool          // --shared-fallback local
	Cache    bool          // --cache: a second pass of process 0 into a new run directory reads it
	Pilot    int           // --pilot N (0 none)
	Cap      int           // --cap for every family (process 0; the smallest of all)
	// CapStep raises the --cap of every other process by this much: the
	// key's cap stays the smallest any process asked for.
	CapStep int
	// SameIDs: every process's items have the same custom_ids (as every
	// 'apidispatch gen' file does), their bodies still distinct.
	SameIDs bool
	Items   int // items per process
	MaxToks int // max_tokens of every item
	// BillAbandoned: the simulator bills requests whose client went away.
	BillAbandoned bool
	Faults        []sim.Fault
	Disturb       []Disturbance
	// LowTier: every org has a tier-1 org's limits with buckets of Burst
	// of a minute (issue 29; see drawLowTier).
	LowTier bool
	Burst   float64
	// OpenAI is issue 30's part: OpenAI orgs and GPT lines (see drawOpenAI).
	OpenAI OpenAIPart
}

// draw derives the scenario of seed. It depends on the seed alone.
func draw(seed int64) Scenario {
	r := rand.New(rand.NewPCG(uint64(seed), 0x5eed_ca4a_9a16))
	s := Scenario{Seed: seed, Speed: 10, MaxToks: 128}
	if r.IntN(2) == 0 {
		s.Speed = 20
	}
	switch x := r.IntN(10); {
	case x < 5:
		s.Route = "sync"
	case x < 7:
		s.Route = "batch"
	default:
		s.Route = "auto"
		if r.IntN(3) > 0 {
			// In API time: short enough that the router sends a share by
			// sync, both routes running at once.
			s.Deadline = time.Duration(60+r.IntN(400)) * time.Second
		}
	}
	if s.Route != "sync" {
		s.Batch = 20 + r.IntN(130)
	}
	s.Procs = 1
	if r.IntN(2) == 0 {
		s.Procs = 2 + r.IntN(3)
	}
	s.Shared = s.Procs > 1 || r.IntN(3) == 0
	s.Fallback = s.Shared && r.IntN(4) == 0
	s.Cap = 2 + r.IntN(7)
	if s.Procs > 1 && r.IntN(4) == 0 {
		s.CapStep = 1 + r.IntN(4)
	}
	s.SameIDs = s.Procs > 1 && r.IntN(2) == 0
	s.Items = 80 + r.IntN(320)
	if s.Procs > 1 {
		// Enough that the others still fill the cap when a stopped or
		// partitioned process comes back.
		s.Items = 150 + r.IntN(300)
	}
	// --cache serves the sync route only (it refuses the others).
	s.Cache = r.IntN(4) == 0 && s.Route == "sync"
	if r.IntN(5) == 0 {
		s.Pilot = 5 + r.IntN(30)
	}
	if r.IntN(3) == 0 || (s.Route == "auto" && r.IntN(2) == 0) {
		// A fraction of what the items cost by sync (perItemUSD each).
		s.MaxCost = float64(s.Items) * perItemUSD * (0.15 + 0.6*r.Float64())
	}
	s.BillAbandoned = r.IntN(2) == 0

	// Faults, in API time (a run lasts one to a few API minutes).
	at := func() time.Duration { return time.Duration(r.IntN(60)) * time.Second }
	dur := func() time.Duration { return time.Duration(10+r.IntN(60)) * time.Second }
	for range r.IntN(4) {
		f := sim.Fault{Start: at(), Duration: dur()}
		switch r.IntN(16) {
		case 0, 1:
			f.Kind, f.Probability = sim.FaultRateLimitStorm, 0.3+0.7*r.Float64()
			f.RetryAfter = time.Duration(r.IntN(3)) * time.Second
		case 2:
			f.Kind, f.Probability = sim.FaultOverloaded, 0.05+0.3*r.Float64()
		case 3:
			f.Kind, f.Probability = sim.FaultServerError, 0.05+0.2*r.Float64()
		case 4:
			f.Kind, f.Probability = sim.FaultServerErrorHTML, 0.05+0.2*r.Float64()
		case 5:
			f.Kind, f.Probability = sim.FaultConnectionReset, 0.02+0.15*r.Float64()
		case 6:
			f.Kind, f.Probability = sim.FaultTruncatedBody, 0.02+0.15*r.Float64()
		case 7:
			f.Kind, f.Fraction = sim.FaultColleague, 0.2+0.6*r.Float64()
			f.Org = orgNames[r.IntN(len(orgNames))]
		case 8, 9:
			f.Kind, f.Probability = sim.FaultBatchCreateLost500, 0.2+0.5*r.Float64()
		case 10:
			f.Kind, f.Probability = sim.FaultBatchCreateLostReset, 0.2+0.5*r.Float64()
		case 11:
			f.Kind, f.Probability = sim.FaultBatchErroredAPI, 0.05+0.3*r.Float64()
		case 12:
			f.Kind, f.Probability = sim.FaultBatchErroredOverloaded, 0.05+0.3*r.Float64()
		case 13:
			f.Kind, f.Probability = sim.FaultBatchResultsCut, 0.3+0.5*r.Float64()
		case 14:
			f.Kind, f.Probability = sim.FaultBatchPoll404, 0.2+0.5*r.Float64()
		case 15:
			f.Kind, f.Probability = sim.FaultBatchNotFound, 0
			f.Window = time.Duration(5+r.IntN(30)) * time.Second
		}
		s.Faults = append(s.Faults, f)
	}

	// Process disturbances, in real time after the first pass started.
	kinds := []string{dStop, dKill, dDiskFull}
	if s.Shared {
		kinds = append(kinds, dRedis, dPartition, dPartition)
	}
	for range r.IntN(3) {
		d := Disturbance{
			Kind: kinds[r.IntN(len(kinds))],
			Proc: r.IntN(s.Procs),
			At:   time.Duration(300+r.IntN(1700)) * time.Millisecond,
			For:  time.Duration(3000+r.IntN(3000)) * time.Millisecond,
		}
		s.Disturb = append(s.Disturb, d)
	}
	drawLowTier(seed, &s)
	drawOpenAI(seed, &s)
	return s
}

// orgNames are the orgs of the origin-3org preset the campaign runs on.
var orgNames = []string{"high_prio", "batch", "low_prio"}

// perItemUSD is about what one judge item of the campaign costs by sync.
const perItemUSD = 0.0045

func (s Scenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: route %s", s.Seed, s.Route)
	if s.Deadline > 0 {
		fmt.Fprintf(&b, " --deadline %s(API)", s.Deadline)
	}
	if s.Batch > 0 {
		fmt.Fprintf(&b, " --batch-size %d", s.Batch)
	}
	fmt.Fprintf(&b, ", %d process(es) × %d items, --cap %d, speed %g", s.Procs, s.Items, s.Cap, s.Speed)
	b.WriteString(s.OpenAI.String())
	if s.CapStep > 0 {
		fmt.Fprintf(&b, " (+%d for every other process)", s.CapStep)
	}
	if s.SameIDs {
		b.WriteString(", the same custom_ids in every process")
	}
	if s.Shared {
		b.WriteString(", --shared")
	}
	if s.Fallback {
		b.WriteString(" --shared-fallback local")
	}
	if s.MaxCost > 0 {
		fmt.Fprintf(&b, ", --max-cost %.4f", s.MaxCost)
	}
	if s.Cache {
		b.WriteString(", --cache (second pass of process 0)")
	}
	if s.Pilot > 0 {
		fmt.Fprintf(&b, ", --pilot %d", s.Pilot)
	}
	if s.BillAbandoned {
		b.WriteString(", abandoned requests billed")
	}
	if s.LowTier {
		fmt.Fprintf(&b, ", tier-1 orgs (RPM %d, ITPM %d, OTPM %d) with buckets of %.2f of a minute", tier1.RPM, tier1.ITPM, tier1.OTPM, s.Burst)
	}
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "\n  fault %s", f.Kind)
		if f.Org != "" {
			fmt.Fprintf(&b, " org %s", f.Org)
		}
		fmt.Fprintf(&b, " from %s for %s", f.Start, f.Duration)
		if f.Probability > 0 {
			fmt.Fprintf(&b, " p=%.2f", f.Probability)
		}
		if f.Fraction > 0 {
			fmt.Fprintf(&b, " fraction=%.2f", f.Fraction)
		}
		if f.Window > 0 {
			fmt.Fprintf(&b, " window=%s", f.Window)
		}
		if f.RetryAfter > 0 {
			fmt.Fprintf(&b, " retry-after=%s", f.RetryAfter)
		}
		if f.ExtraLatency > 0 {
			fmt.Fprintf(&b, " extra-latency=%s", f.ExtraLatency)
		}
	}
	for _, d := range s.Disturb {
		fmt.Fprintf(&b, "\n  %s", d.Kind)
		if d.Kind != dRedis {
			fmt.Fprintf(&b, " process %d", d.Proc)
		}
		fmt.Fprintf(&b, " at %s", d.At)
		if d.Kind != dKill && d.Kind != dDiskFull {
			fmt.Fprintf(&b, " for %s", d.For)
		}
	}
	return b.String()
}
