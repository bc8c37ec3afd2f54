package campaign

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/sim"
)

// Gateway disturbance kinds: what happens to one 'apidispatch serve'
// process while the clients use it. A gateway that exits is started again
// on the same state directory and port, as a supervisor would.
const (
	gTerm      = "sigterm"       // SIGTERM: drain, exit, restart
	gTwice     = "sigterm_twice" // SIGTERM, then SIGINT after For: exit at once, restart
	gKill      = "kill9"         // SIGKILL, restart
	gStop      = "sigstop"       // SIGSTOP, SIGCONT after For
	gPartition = "partition"     // its Redis connections blackholed for For (--shared)
)

// Hostile client kinds.
const (
	// hUnread opens streams of long answers and never reads them. With the
	// simulator's answers (tens of KB a stream) and loopback's socket
	// buffers (about 1.6 MB accepted before a write blocks, measured on
	// the 2-core machine), an unread stream cannot hold a lane: it checks
	// that a stream whose client hangs up is billed once and counted, not
	// the slow-reader delay of issue 28.
	hUnread  = "unread_streams"
	hBeta    = "forbidden_beta" // names a beta the orgs may not use (the API answers 403)
	hDribble = "dribbler"       // sends its request body a byte at a time, never finishing
)

// forbiddenBeta is the anthropic-beta the simulator refuses in scenarios
// with a forbidden_beta client (sim.FaultBetaForbidden).
const forbiddenBeta = "research-preview-2026-01-01"

// gwDisturbance is one disturbance of gateway Gateway, at a real time
// after the clients started.
type gwDisturbance struct {
	Kind    string
	Gateway int
	At      time.Duration
	For     time.Duration // a stop's or a partition's length; the gap between the two signals
}

// gwClient is one client of the clients file: a team member's script, or
// a hostile one.
type gwClient struct {
	Name    string
	MaxCost float64 // max_cost in USD (0: none)
	// Gateway is the gateway it sends to; -1: each request to the next
	// gateway in turn (behind a load balancer), all of one request's
	// retries to the same one.
	Gateway  int
	Requests int // Messages requests (sync and streaming)
	Conc     int // requests at once, at most
	// Span spreads the requests' first sends over this real time from the
	// clients' start (request k not before k/Requests of it), so that the
	// disturbances strike while they run.
	Span   time.Duration
	Stream float64 // the share of streaming requests
	// Geo: every request is claude-sonnet-4-6 with inference_geo "us"
	// (billed ×1.1).
	Geo       bool
	MaxToks   int
	Batches   int    // Message Batches it creates (one after the other)
	BatchSize int    // requests per batch
	Route     string // x-apidispatch-route of its batches: batch, sync or auto
	Hostile   string // "" or one of the h* kinds
	// Count: a forbidden_beta client sends count_tokens, not messages.
	Count bool
}

// gwScenario is one gateway draw of the campaign.
type gwScenario struct {
	Seed     int64
	Speed    float64
	Gateways int
	Shared   bool    // --shared on a private Redis (every gateway)
	Cap      int     // --cap of every family, every gateway
	MaxCost  float64 // each gateway's --max-cost (0: none)
	// BillAbandoned: the simulator bills requests whose client went away.
	BillAbandoned bool
	Clients       []gwClient
	Faults        []sim.Fault
	Disturb       []gwDisturbance
	// LowTier: every org has a tier-1 org's limits with buckets of Burst
	// of a minute (issue 29; see drawGatewayLowTier).
	LowTier bool
	Burst   float64
}

// gwPerRequestUSD is about what one request of the gateway scenarios costs
// (claude-sonnet-4-5, ~30 input tokens, 30-300 output tokens capped by
// max_tokens).
func gwPerRequestUSD(maxToks int) float64 {
	return 30*3e-6 + float64(min(165, maxToks))*15e-6
}

// drawGateway derives the gateway scenario of seed. It depends on the seed
// alone, from a stream of its own (draw's scenario of the same seed is not
// changed by it).
func drawGateway(seed int64) gwScenario {
	r := rand.New(rand.NewPCG(uint64(seed), 0x9a7e_3a75_ca4a))
	s := gwScenario{Seed: seed, Speed: 10}
	if r.IntN(2) == 0 {
		s.Speed = 20
	}
	switch x := r.IntN(20); {
	case x < 10:
		s.Gateways = 1
	case x < 17:
		s.Gateways = 2
	default:
		s.Gateways = 3
	}
	s.Shared = r.IntN(3) == 0 || (s.Gateways > 1 && r.IntN(2) == 0)
	s.Cap = 2 + r.IntN(4)
	s.BillAbandoned = r.IntN(2) == 0

	names := []string{"alice", "bob", "carol", "dave"}
	good := 1 + r.IntN(4)
	total := 0.0
	for i := range good {
		c := gwClient{Name: names[i], Gateway: i % s.Gateways}
		if s.Gateways > 1 && r.IntN(3) == 0 {
			c.Gateway = -1
		}
		c.Requests = 15 + r.IntN(46)
		c.Conc = 1 + r.IntN(10)
		c.Span = time.Duration(2000+r.IntN(4000)) * time.Millisecond
		c.Stream = []float64{0, 0, 0.3, 0.7, 1}[r.IntN(5)]
		c.Geo = r.IntN(4) == 0
		c.MaxToks = []int{64, 128, 256, 512}[r.IntN(4)]
		if r.IntN(3) == 0 {
			c.Batches = 1 + r.IntN(2)
			c.BatchSize = 5 + r.IntN(40)
			c.Route = []string{"batch", "batch", "batch", "sync", "auto"}[r.IntN(5)]
		}
		work := float64(c.Requests)*gwPerRequestUSD(c.MaxToks) + float64(c.Batches*c.BatchSize)*gwPerRequestUSD(c.MaxToks)/2
		total += work
		if r.IntN(2) == 0 {
			// From a fifth of its work (stops early) to a bit more than
			// it (the worst cases still bind near the end).
			c.MaxCost = work * (0.2 + 0.9*r.Float64())
		}
		s.Clients = append(s.Clients, c)
	}
	if r.IntN(6) == 0 {
		s.MaxCost = total * (0.3 + 0.6*r.Float64()) / float64(s.Gateways)
	}

	// Hostile clients, each kind one time in four.
	if r.IntN(4) == 0 {
		// Up to every slot of the Sonnet pool the gateways have.
		slots := 3 * s.Cap
		if !s.Shared {
			slots *= s.Gateways
		}
		s.Clients = append(s.Clients, gwClient{Name: "mallory", Hostile: hUnread, Gateway: r.IntN(s.Gateways),
			Requests: 1 + r.IntN(slots+1), MaxToks: 4096})
	}
	if r.IntN(4) == 0 {
		c := gwClient{Name: "trudy", Hostile: hBeta, Gateway: r.IntN(s.Gateways), Requests: 2 + r.IntN(6), Conc: 1, MaxToks: 64, Count: r.IntN(3) == 0}
		s.Clients = append(s.Clients, c)
		f := sim.Fault{Kind: sim.FaultBetaForbidden, Beta: forbiddenBeta}
		if r.IntN(3) == 0 {
			f.Org = orgNames[r.IntN(len(orgNames))] // one org only: another may serve it
		}
		s.Faults = append(s.Faults, f)
	}
	if r.IntN(4) == 0 {
		s.Clients = append(s.Clients, gwClient{Name: "oscar", Hostile: hDribble, Gateway: r.IntN(s.Gateways), Requests: 1 + r.IntN(3)})
	}

	batches := false
	for _, c := range s.Clients {
		batches = batches || c.Batches > 0
	}
	// Faults, in API time (a scenario lasts about one to three API minutes).
	at := func() time.Duration { return time.Duration(r.IntN(60)) * time.Second }
	dur := func() time.Duration { return time.Duration(10+r.IntN(50)) * time.Second }
	for range r.IntN(4) {
		f := sim.Fault{Start: at(), Duration: dur()}
		switch r.IntN(13) {
		case 0, 1:
			f.Kind, f.Probability = sim.FaultRateLimitStorm, 0.3+0.6*r.Float64()
			f.RetryAfter = time.Duration(r.IntN(3)) * time.Second
		case 2:
			f.Kind, f.Probability = sim.FaultOverloaded, 0.05+0.3*r.Float64()
		case 3:
			f.Kind, f.Probability = sim.FaultServerError, 0.05+0.2*r.Float64()
		case 4:
			f.Kind, f.Probability = sim.FaultServerErrorHTML, 0.05+0.2*r.Float64()
		case 5, 6:
			f.Kind, f.Probability = sim.FaultConnectionReset, 0.05+0.3*r.Float64()
		case 7, 8:
			f.Kind, f.Probability = sim.FaultTruncatedBody, 0.05+0.3*r.Float64()
		case 9:
			f.Kind, f.Probability = sim.FaultStreamOverloaded, 0.1+0.3*r.Float64()
		case 10:
			f.Kind, f.Fraction = sim.FaultColleague, 0.2+0.6*r.Float64()
			f.Org = orgNames[r.IntN(len(orgNames))]
		case 12:
			// Upstream requests slower than a gateway's drain: a SIGTERM
			// then cuts requests still in flight.
			// 25-40 s of real time (long answers), over the first API
			// minute or so, when the disturbances strike.
			f.Kind, f.Probability = sim.FaultSlow, 0.2+0.4*r.Float64()
			f.ExtraLatency = time.Duration(float64(time.Duration(25+r.IntN(16))*time.Second) * s.Speed)
			f.Start = time.Duration(r.IntN(20)) * time.Second
			f.Duration = time.Duration(30+r.IntN(50)) * time.Second
		case 11:
			if !batches {
				f.Kind, f.Probability = sim.FaultOverloaded, 0.05+0.3*r.Float64()
				break
			}
			f.Kind, f.Probability = []sim.FaultKind{sim.FaultBatchErroredAPI, sim.FaultBatchResultsCut,
				sim.FaultBatchCreateLost500, sim.FaultBatchPoll404}[r.IntN(4)], 0.2+0.5*r.Float64()
		}
		s.Faults = append(s.Faults, f)
	}

	// Disturbances, in real time after the clients started.
	kinds := []string{gTerm, gTwice, gKill, gKill, gStop}
	if s.Shared {
		kinds = append(kinds, gPartition, gPartition)
	}
	for range r.IntN(4) {
		d := gwDisturbance{Kind: kinds[r.IntN(len(kinds))], Gateway: r.IntN(s.Gateways),
			At: time.Duration(200+r.IntN(3800)) * time.Millisecond}
		switch d.Kind {
		case gStop, gPartition:
			d.For = time.Duration(2500+r.IntN(3500)) * time.Millisecond
		case gTwice:
			d.For = time.Duration(300+r.IntN(2700)) * time.Millisecond
		}
		s.Disturb = append(s.Disturb, d)
	}
	drawGatewayLowTier(seed, &s)
	return s
}

func (s gwScenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gateway seed %d: %d gateway(s)", s.Seed, s.Gateways)
	if s.Shared {
		b.WriteString(" --shared")
	}
	fmt.Fprintf(&b, ", --cap %d, speed %g", s.Cap, s.Speed)
	if s.MaxCost > 0 {
		fmt.Fprintf(&b, ", --max-cost %.4f each", s.MaxCost)
	}
	if s.BillAbandoned {
		b.WriteString(", abandoned requests billed")
	}
	if s.LowTier {
		fmt.Fprintf(&b, ", tier-1 orgs (RPM %d, ITPM %d, OTPM %d) with buckets of %.2f of a minute", tier1.RPM, tier1.ITPM, tier1.OTPM, s.Burst)
	}
	for _, c := range s.Clients {
		fmt.Fprintf(&b, "\n  client %s", c.Name)
		if c.Gateway < 0 {
			b.WriteString(" on every gateway in turn")
		} else {
			fmt.Fprintf(&b, " on gateway %d", c.Gateway)
		}
		switch c.Hostile {
		case hUnread:
			fmt.Fprintf(&b, ": hostile, %d unread streams", c.Requests)
			continue
		case hBeta:
			what := "messages"
			if c.Count {
				what = "count_tokens"
			}
			fmt.Fprintf(&b, ": hostile, %d %s requests naming a forbidden beta", c.Requests, what)
			continue
		case hDribble:
			fmt.Fprintf(&b, ": hostile, %d body dribblers", c.Requests)
			continue
		}
		fmt.Fprintf(&b, ": %d requests over %s, %d at once, %.0f%% streamed, max_tokens %d", c.Requests, c.Span, c.Conc, 100*c.Stream, c.MaxToks)
		if c.Geo {
			b.WriteString(", inference_geo us")
		}
		if c.Batches > 0 {
			fmt.Fprintf(&b, ", %d batch(es) of %d by route %s", c.Batches, c.BatchSize, c.Route)
		}
		if c.MaxCost > 0 {
			fmt.Fprintf(&b, ", max_cost %.4f", c.MaxCost)
		}
	}
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "\n  fault %s", f.Kind)
		if f.Org != "" {
			fmt.Fprintf(&b, " org %s", f.Org)
		}
		if f.Beta != "" {
			fmt.Fprintf(&b, " beta %s", f.Beta)
		}
		if f.Duration > 0 {
			fmt.Fprintf(&b, " from %s for %s", f.Start, f.Duration)
		}
		if f.Probability > 0 {
			fmt.Fprintf(&b, " p=%.2f", f.Probability)
		}
		if f.ExtraLatency > 0 {
			fmt.Fprintf(&b, " +%s", f.ExtraLatency)
		}
		if f.Fraction > 0 {
			fmt.Fprintf(&b, " fraction=%.2f", f.Fraction)
		}
	}
	for _, d := range s.Disturb {
		fmt.Fprintf(&b, "\n  %s gateway %d at %s", d.Kind, d.Gateway, d.At)
		if d.For > 0 {
			fmt.Fprintf(&b, " for %s", d.For)
		}
	}
	return b.String()
}
