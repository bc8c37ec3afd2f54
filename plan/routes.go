package plan

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/org"
)

// Routes an item can take (docs/design.md §12 --route).
const (
	RouteSync  = "sync"  // the Messages API, by the lanes
	RouteBatch = "batch" // the Message Batches API, at its batch rates
	RouteAuto  = "auto"  // the cheapest split of the two that meets --deadline
)

// Binding limits of the batch route.
const (
	BindBatchThroughput = "batch throughput" // the orgs' processing rate (BatchModel.PerMinute)
	BindQueueCap        = "queue cap"        // an org's share is over its processing-queue cap: batches go in as it drains
)

// MaxBatchRequests is the most requests one batch may hold (docs/design.md §19).
const MaxBatchRequests = 100_000

// BatchExpiryS is the batch route's bound in API seconds: a batch's results
// are available within 24 h of its create; requests unfinished by then expire.
const BatchExpiryS = 24 * 3600

// autoMargin is the fraction of the deadline auto plans to end by.
const autoMargin = 0.85

// minBatchItems is the smallest batch share auto sends: fewer items go by
// sync (a queue wait for a few cents is not worth it).
const minBatchItems = 100

// BatchModel is the Message Batches processing model a projection assumes,
// per org, in API time. It is plain data; a zero field means its default
// (WithDefaults), so the zero value is DefaultBatchModel. The defaults are
// the simulator's (sim.DefaultBatch*), never measured against the API
// (docs/design.md §24). The JSON names are those of a limits file's "batch".
type BatchModel struct {
	QueueWaitS float64 `json:"queue_wait_s,omitempty"` // API seconds from create until processing starts (default 240)
	PerMinute  float64 `json:"per_minute,omitempty"`   // requests one org processes per API minute (default 2000)
	Queue      int64   `json:"queue,omitempty"`        // per-org processing-queue cap, requests (default 200_000)
	MaxBatch   int64   `json:"max_batch,omitempty"`    // requests per batch (default 100_000; the API's maximum)
	PollS      float64 `json:"poll_s,omitempty"`       // API seconds a poll may lag the end of a batch (default 60)
	// RPM is one org's requests per API minute over every batch endpoint
	// together; the batch route paces its calls under it (0: the lowest
	// tier's, batch.DefaultRPM). The projection does not use it.
	RPM float64 `json:"rpm,omitempty"`
	// QueueTokens is one OpenAI org's enqueued-token limit per model (the
	// prompt tokens its unfinished batches of a model may hold); the batch
	// route keeps its OpenAI batches under it (0: batch.DefaultQueueTokens).
	// The projection does not use it.
	QueueTokens int64 `json:"queue_tokens,omitempty"`
}

// DefaultBatchModel is the simulator's batch model: a 4-minute queue wait,
// 2,000 requests per API minute per org, a 200,000-request queue, batches
// of 100,000 and a poll every minute.
func DefaultBatchModel() BatchModel {
	return BatchModel{QueueWaitS: 240, PerMinute: 2000, Queue: 200_000, MaxBatch: MaxBatchRequests, PollS: 60}
}

// WithDefaults returns m with every zero field set to its default.
func (m BatchModel) WithDefaults() BatchModel {
	d := DefaultBatchModel()
	if m.QueueWaitS == 0 {
		m.QueueWaitS = d.QueueWaitS
	}
	if m.PerMinute == 0 {
		m.PerMinute = d.PerMinute
	}
	if m.Queue == 0 {
		m.Queue = d.Queue
	}
	if m.MaxBatch == 0 {
		m.MaxBatch = d.MaxBatch
	}
	if m.PollS == 0 {
		m.PollS = d.PollS
	}
	return m
}

// ErrBatchModel is wrapped by the errors about a BatchModel's figures.
var ErrBatchModel = errors.New("plan: invalid batch model")

// check refuses negative, infinite or NaN figures and batches over the
// API's maximum.
func (m BatchModel) check() error {
	for _, f := range []float64{m.QueueWaitS, m.PerMinute, m.PollS} {
		if !(f >= 0) || math.IsInf(f, 0) {
			return fmt.Errorf("%w: queue_wait_s, per_minute and poll_s must be finite and not negative", ErrBatchModel)
		}
	}
	if m.Queue < 0 || m.MaxBatch < 0 || m.MaxBatch > MaxBatchRequests {
		return fmt.Errorf("%w: queue must not be negative and max_batch must be 0 to %s", ErrBatchModel, numfmt.Commas(MaxBatchRequests))
	}
	return nil
}

// BatchWallS is the expected API seconds until n items sent by batch over
// orgs orgs are all harvested: the items spread evenly over the orgs
// (ceil(n/orgs) per org), each org processing its batches one after
// another, so QueueWaitS + ceil(n/orgs) / PerMinute × 60 + PollS. It is 0
// for n ≤ 0 and +Inf when no org can carry them (orgs < 1). Zero fields of
// m take their defaults.
func (m BatchModel) BatchWallS(n int64, orgs int) float64 {
	if n <= 0 {
		return 0
	}
	if orgs < 1 {
		return math.Inf(1)
	}
	m = m.WithDefaults()
	return m.QueueWaitS + float64(perOrg(n, orgs))/m.PerMinute*60 + m.PollS
}

func perOrg(n int64, orgs int) int64 { return (n + int64(orgs) - 1) / int64(orgs) }

// SyncWallS is the projection's sync wall-clock (API seconds) scaled to n
// of the N − Done items it projects: linear in n (the warm-up and the last
// wave are scaled too, so a small share is slightly understated), 0 for
// n ≤ 0.
func (p *Projection) SyncWallS(n int64) float64 {
	rem := p.N - p.Done
	if n <= 0 || rem <= 0 {
		return 0
	}
	return p.WallS * float64(n) / float64(rem)
}

// RouteProjection is one route's share of a projection (one arm). It is
// plain data.
type RouteProjection struct {
	Route                 string // RouteSync, RouteBatch or RouteAuto
	Items                 int64  // items this route carries (N − Done; cached items are outside N)
	BatchItems, SyncItems int64
	// ExpectedCost and WorstCase are at the route's prices (auto: the batch
	// share at batch rates, the rest at sync rates), a pilot's spend included.
	ExpectedCost cost.Nanos
	WorstCase    cost.Nanos
	WallS        float64 // expected API seconds
	WallAtSpeedS float64 // WallS / Speed
	// BoundS is the route's upper bound in API seconds: BatchExpiryS for a
	// route that sends batches (the end of each batch, not of a run whose
	// batches wait in a queue), WallS for sync.
	BoundS float64
	// Binding is, for sync, the binding limits of the lanes ("cap", "rpm",
	// ...); for batch, BindBatchThroughput or BindQueueCap; for auto, that
	// of each part it uses.
	Binding string
	Meets   bool   // auto only: the split ends by the deadline (with the margin)
	Explain string // the arithmetic in words and numbers
}

// Routes are the projections of the routes side by side. It is plain data.
type Routes struct {
	Sync, Batch RouteProjection
	Auto        *RouteProjection // nil without a deadline
	DeadlineS   float64          // API seconds, 0 = none

	model BatchModel // with defaults
	orgs  int        // orgs the batch route spreads over
	// shares are the items of each provider and the orgs its batches
	// spread over (an Anthropic item goes to the Anthropic orgs' Message
	// Batches, an OpenAI item to the OpenAI orgs' Batch API); a batch
	// share b of the items is split between them pro rata.
	shares []providerShare
	items  int64
}

// providerShare is one provider's items and orgs.
type providerShare struct {
	openAI bool
	n      int64
	orgs   int
}

// of is the part of a batch share b that is this provider's: b × n / items,
// rounded up for the first provider and the rest to the other, as
// SplitOpenAI splits the sync share.
func (r *Routes) of(i int, b int64) int64 {
	if len(r.shares) == 1 || r.items <= 0 {
		return b
	}
	first := (b*r.shares[0].n + r.items - 1) / r.items
	if i == 0 {
		return first
	}
	return b - first
}

// batchWallS is when a batch share of b items ends: each provider's part
// over its own orgs, the slower of the two.
func (r *Routes) batchWallS(b int64) float64 {
	var w float64
	for i, sh := range r.shares {
		w = math.Max(w, r.model.BatchWallS(r.of(i, b), sh.orgs))
	}
	return w
}

// perOrgMax is the most items of a batch share of b one org holds.
func (r *Routes) perOrgMax(b int64) int64 {
	var most int64
	for i, sh := range r.shares {
		if n := r.of(i, b); n > 0 && sh.orgs > 0 {
			most = max(most, perOrg(n, sh.orgs))
		}
	}
	return most
}

// ProjectRoutes projects both routes for the projection p (from
// Project(in)), one arm, and records them in p.Routes and their assumptions
// in p.Assumptions. With deadlineS > 0 (API seconds from the start) it also
// decides the auto split, the cheapest mix that ends before the deadline
// with a safety margin (target = 0.85 × deadline):
//
//   - all batch when BatchWallS(N) ≤ target;
//   - otherwise the largest number of batch items b with BatchWallS(b) ≤
//     target and SyncWallS(N − b) ≤ target (a binary search), the rest by
//     sync; b < 100 goes all sync;
//   - when even all sync misses the target: all sync, Meets false, and the
//     Explain says by how much.
//
// N here is p.N − p.Done. The batch route spreads over the orgs with a lane
// that can serve (not same_org, not unavailable). The auto cost is pro rata
// per model: b/N of each model's cost at batch rates, the rest at sync
// rates. It fails on a nil p, a bad model (ErrBatchModel) or a negative
// deadline.
func ProjectRoutes(p *Projection, in Input, m BatchModel, deadlineS float64) (*Routes, error) {
	if p == nil {
		return nil, errors.New("plan: no projection to route")
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	if !(deadlineS >= 0) || math.IsInf(deadlineS, 0) {
		return nil, fmt.Errorf("plan: deadline %v s: want a finite, non-negative number of API seconds", deadlineS)
	}
	given := m
	m = m.WithDefaults()
	speed := p.Speed
	if speed <= 0 {
		speed = 1
	}
	items := max(p.N-p.Done, 0)
	r := &Routes{DeadlineS: deadlineS, model: m, orgs: batchOrgs(p), items: items}
	r.shares = providerShares(p)

	var syncExp, syncWorst, batchExp, batchWorst cost.Nanos = p.PerArmExpected, p.PerArmWorst, p.Spent, p.Spent
	for _, mp := range p.Models {
		batchExp += mp.BatchExpected
		batchWorst += mp.BatchWorstCase
	}

	r.Sync = RouteProjection{
		Route: RouteSync, Items: items, SyncItems: items,
		ExpectedCost: syncExp, WorstCase: syncWorst,
		WallS: p.WallS, BoundS: p.WallS, Binding: syncBinding(p),
	}
	r.Sync.Explain = p.syncExplain(items)

	r.Batch = RouteProjection{
		Route: RouteBatch, Items: items, BatchItems: items,
		ExpectedCost: batchExp, WorstCase: batchWorst,
		WallS: r.batchWallS(items), BoundS: BatchExpiryS, Binding: r.batchBinding(items),
	}
	r.Batch.Explain = r.batchExplain(p, items)

	if deadlineS > 0 {
		a := r.auto(p, items, deadlineS)
		r.Auto = &a
	}
	for _, rp := range []*RouteProjection{&r.Sync, &r.Batch, r.Auto} {
		if rp != nil {
			rp.WallAtSpeedS = rp.WallS / speed
		}
	}

	src := "the defaults"
	if given.WithDefaults() != DefaultBatchModel() {
		d := DefaultBatchModel()
		src = fmt.Sprintf("overridden where they differ from the defaults of %s, %s a minute, %s, %s and %s",
			dur(d.QueueWaitS), numfmt.Commas(int64(d.PerMinute)), numfmt.Commas(d.Queue), numfmt.Commas(d.MaxBatch), dur(d.PollS))
		if in.Limits != nil && in.Limits.Batch != nil {
			src += ", by the limits file's \"batch\""
		}
	}
	p.addAssumption(fmt.Sprintf("batch route: per org a queue wait of %s from create until processing, then %s requests per API minute, the org's batches one after another (FIFO), a processing queue of %s requests, %s requests a batch, results harvested up to %s after a batch ends (%s); these are the simulator's model: no batch timing was ever measured (docs/design.md §24)",
		dur(m.QueueWaitS), numfmt.Commas(int64(math.Round(m.PerMinute))), numfmt.Commas(m.Queue), numfmt.Commas(m.MaxBatch), dur(m.PollS), src))
	p.addAssumption("batch cost: the sync projection's tokens per request at the price table's batch rates")
	if r.Auto != nil {
		p.addAssumption(fmt.Sprintf("auto: the cheapest split that ends by %.0f%% of the deadline, leaving time to send one org's batch again by sync should it run late; its cost is pro rata per model (the batch share of every model at batch rates, the rest at sync rates) and the sync share's wall-clock is the sync projection scaled linearly", autoMargin*100))
	}
	if p.Arms > 1 {
		p.addAssumption("routes: one dispatcher arm (the A/B sends both arms by sync)")
	}
	p.Routes = r
	return r, nil
}

// Model is the batch model the routes were projected with (defaults filled).
func (r *Routes) Model() BatchModel { return r.model }

// Split is the auto decision alone, for the run command: with a deadline,
// the split of Auto; without one, all batch (the cheapest route, nothing to
// meet), or all sync for fewer than 100 items.
func (r *Routes) Split() (batchItems, syncItems int64) {
	if r.Auto != nil {
		return r.Auto.BatchItems, r.Auto.SyncItems
	}
	n := r.Sync.Items
	if n < minBatchItems {
		return 0, n
	}
	return n, 0
}

// auto decides the split for a deadline.
func (r *Routes) auto(p *Projection, items int64, deadlineS float64) RouteProjection {
	target := autoMargin * deadlineS
	head := fmt.Sprintf("deadline %s × %.2f = target %s", dur(deadlineS), autoMargin, dur(target))
	// A batch share fits when it ends by the target with time left to
	// send one org's batch again by sync, should that batch run late and
	// be cancelled at its expected end (batches show no progress until
	// they end, so late is only known then).
	fits := func(b int64) (end, redo float64, ok bool) {
		end, redo = r.batchWallS(b), p.SyncWallS(r.perOrgMax(b))
		return end, redo, end+redo <= target
	}
	batchW := r.Batch.WallS
	if _, redo, ok := fits(items); ok {
		a := r.split(p, items, items)
		a.Meets = true
		a.Explain = fmt.Sprintf("%s; all %s items by batch take %s, and one org's batch again by sync %s: %s ≤ target → all batch, %s",
			head, numfmt.Commas(items), dur(batchW), dur(redo), dur(batchW+redo), usd(a.ExpectedCost))
		return a
	}
	// The largest b that fits: both terms are non-decreasing in b, and
	// b = 0 fits while b = items does not.
	lo, hi := int64(0), items
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if _, _, ok := fits(mid); ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	b := lo
	head += fmt.Sprintf("; all %s by batch take %s > target", numfmt.Commas(items), dur(batchW))
	if b >= minBatchItems {
		if sw := p.SyncWallS(items - b); sw <= target {
			a := r.split(p, items, b)
			a.Meets = true
			end, redo, _ := fits(b)
			a.Explain = fmt.Sprintf("%s; the largest batch share that ends in time is %s items (%s, and one org's %s again by sync %s: %s ≤ target), the other %s by sync take %s ≤ target → %s by batch + %s by sync, %s (pro rata per model: all sync %s, all batch %s)",
				head, numfmt.Commas(b), dur(end), numfmt.Commas(r.perOrgMax(b)), dur(redo), dur(end+redo), numfmt.Commas(items-b), dur(sw), numfmt.Commas(b), numfmt.Commas(items-b),
				usd(a.ExpectedCost), usd(r.Sync.ExpectedCost), usd(r.Batch.ExpectedCost))
			return a
		}
	}
	a := r.split(p, items, 0)
	sw := r.Sync.WallS
	a.Meets = sw <= target
	switch {
	case a.Meets:
		a.Explain = fmt.Sprintf("%s; a batch share ending in time would be %s items, fewer than %d → all sync: %s ≤ target, %s", head, numfmt.Commas(b), minBatchItems, dur(sw), usd(a.ExpectedCost))
	case b >= minBatchItems:
		a.Explain = fmt.Sprintf("%s; even the largest batch share that ends in time (%s items) leaves %s for sync, which take %s; all sync takes %s, %s over the target (%s) → all sync, deadline missed",
			head, numfmt.Commas(b), numfmt.Commas(items-b), dur(p.SyncWallS(items-b)), dur(sw), dur(sw-target), overBy(sw, deadlineS))
	default:
		a.Explain = fmt.Sprintf("%s; even all sync takes %s, %s over the target (%s) → all sync, deadline missed", head, dur(sw), dur(sw-target), overBy(sw, deadlineS))
	}
	if !a.Meets {
		// Both routes at once can be faster than sync alone: when no
		// split meets the target, the fastest one misses it by least.
		if fb := r.fastestSplit(p, items); fb >= minBatchItems {
			fw := math.Max(r.batchWallS(fb), p.SyncWallS(items-fb))
			if fw < sw {
				explain := strings.TrimSuffix(a.Explain, " → all sync, deadline missed")
				a = r.split(p, items, fb)
				a.Meets = false
				a.Explain = explain + fmt.Sprintf("; both routes at once are faster: the fastest split, %s by batch + %s by sync, takes %s (%s) → that split, deadline missed by least, %s",
					numfmt.Commas(fb), numfmt.Commas(items-fb), dur(fw), overBy(fw, deadlineS), usd(a.ExpectedCost))
			}
		}
	}
	return a
}

// fastestSplit is the batch share b that minimises max(BatchWallS(b),
// SyncWallS(items − b)): the first b at which the batch share takes at
// least as long as the sync rest (one rises with b, the other falls).
func (r *Routes) fastestSplit(p *Projection, items int64) int64 {
	lo, hi := int64(0), items
	for lo < hi {
		mid := lo + (hi-lo)/2
		if r.batchWallS(mid) >= p.SyncWallS(items-mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// overBy says how far s (over the target) passes the deadline.
func overBy(s, deadlineS float64) string {
	if s <= deadlineS {
		return "within the deadline itself"
	}
	return dur(s-deadlineS) + " over the deadline"
}

// split is the auto route with b of the items by batch.
func (r *Routes) split(p *Projection, items, b int64) RouteProjection {
	a := RouteProjection{Route: RouteAuto, Items: items, BatchItems: b, SyncItems: items - b, BoundS: p.SyncWallS(items - b)}
	switch b {
	case items:
		a.ExpectedCost, a.WorstCase, a.Binding = r.Batch.ExpectedCost, r.Batch.WorstCase, r.Batch.Binding
	case 0:
		a.ExpectedCost, a.WorstCase, a.Binding = r.Sync.ExpectedCost, r.Sync.WorstCase, r.Sync.Binding
	default:
		f := float64(b) / float64(items)
		var e, w float64
		for _, mp := range p.Models {
			e += f*float64(mp.BatchExpected) + (1-f)*float64(mp.Expected)
			w += f*float64(mp.BatchWorstCase) + (1-f)*float64(mp.WorstCase)
		}
		a.ExpectedCost, a.WorstCase = p.Spent+nanos(e), p.Spent+nanos(w)
		a.Binding = "batch: " + r.batchBinding(b) + "; sync: " + r.Sync.Binding
	}
	a.WallS = math.Max(r.batchWallS(b), p.SyncWallS(items-b))
	if b > 0 {
		a.BoundS = math.Max(a.BoundS, BatchExpiryS)
	}
	return a
}

// providerShares are the items of each provider the projection holds
// (Anthropic first) and the orgs with a lane that can serve them.
func providerShares(p *Projection) []providerShare {
	var out []providerShare
	for _, openAI := range []bool{false, true} {
		sh := providerShare{openAI: openAI}
		for _, mp := range p.Models {
			if (mp.Provider == org.OpenAI) == openAI {
				sh.n += mp.Remaining
			}
		}
		orgs := map[string]bool{}
		for _, l := range p.Lanes {
			if openAIPool(anthropic.Pool(l.Pool)) == openAI && l.BindingLimit != BindSameOrg && l.BindingLimit != BindUnavailable {
				orgs[l.Org] = true
			}
		}
		sh.orgs = len(orgs)
		if sh.n > 0 {
			out = append(out, sh)
		}
	}
	if len(out) == 0 {
		out = []providerShare{{orgs: batchOrgs(p)}}
	}
	return out
}

// SplitOpenAI is how many of a sync share of syncItems (Split's) are
// OpenAI items: the share is split between the providers pro rata, as
// the projection assumed.
func (r *Routes) SplitOpenAI(syncItems int64) int64 {
	for i, sh := range r.shares {
		if sh.openAI {
			return r.of(i, syncItems)
		}
	}
	return 0
}

// batchOrgs counts the orgs with a lane that can serve.
func batchOrgs(p *Projection) int {
	orgs := map[string]bool{}
	for _, l := range p.Lanes {
		if l.BindingLimit != BindSameOrg && l.BindingLimit != BindUnavailable {
			orgs[l.Org] = true
		}
	}
	return len(orgs)
}

// syncBinding lists the lanes' binding limits, sorted, without repeats.
func syncBinding(p *Projection) string {
	seen := map[string]bool{}
	var out []string
	for _, l := range p.Lanes {
		if !seen[l.BindingLimit] {
			seen[l.BindingLimit] = true
			out = append(out, l.BindingLimit)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func (r *Routes) batchBinding(n int64) string {
	if r.orgs > 0 && perOrg(n, r.orgs) > r.model.Queue {
		return BindQueueCap
	}
	return BindBatchThroughput
}

func (p *Projection) syncExplain(items int64) string {
	var parts []string
	for _, pp := range p.Pools {
		parts = append(parts, fmt.Sprintf("pool %s: %s", pp.Pool, pp.Arithmetic))
	}
	return fmt.Sprintf("%s items by the lanes at sync rates, %s; %s", numfmt.Commas(items), usd(p.PerArmExpected), strings.Join(parts, "; "))
}

func (r *Routes) batchExplain(p *Projection, items int64) string {
	m := r.model
	if items == 0 {
		return "nothing to send"
	}
	if r.orgs < 1 {
		return fmt.Sprintf("%s items but no org can serve them", numfmt.Commas(items))
	}
	per := perOrg(items, r.orgs)
	size := min(m.MaxBatch, m.Queue)
	batches := (per + size - 1) / size
	var b strings.Builder
	fmt.Fprintf(&b, "%s items over %s, %s per org in %s of up to %s: %s queue wait + %s ÷ %s/min = %s + %s poll = %s",
		numfmt.Commas(items), plural(int64(r.orgs), "org"), numfmt.Commas(per), plural(batches, "batch"), numfmt.Commas(size), dur(m.QueueWaitS), numfmt.Commas(per),
		numfmt.Commas(int64(math.Round(m.PerMinute))), dur(float64(per)/m.PerMinute*60), dur(m.PollS), dur(r.Batch.WallS))
	if per > m.Queue {
		fmt.Fprintf(&b, "; %s per org is over the queue cap of %s, so batches go in as the queue drains (throughput unchanged)", numfmt.Commas(per), numfmt.Commas(m.Queue))
	}
	if m.MaxBatch > m.Queue {
		fmt.Fprintf(&b, "; batches are cut to the queue cap of %s", numfmt.Commas(m.Queue))
	}
	if r.Batch.WallS > BatchExpiryS {
		fmt.Fprintf(&b, "; longer than a batch's 24 h, so batches must be submitted as the queue drains or their requests expire")
	}
	fmt.Fprintf(&b, "; cost at batch rates")
	for _, mp := range p.Models {
		fmt.Fprintf(&b, ", %s: %s × (%s input × %s/M + %s output × %s/M) = %s", mp.Model, numfmt.Commas(mp.Remaining),
			tok(round1(mp.InputPerReq)), perM(mp.BatchRates.Input), tok(round1(mp.OutputPerReq)), perM(mp.BatchRates.Output), usd(mp.BatchExpected))
	}
	if p.Spent > 0 {
		fmt.Fprintf(&b, ", plus %s already spent", usd(p.Spent))
	}
	return b.String()
}

// addAssumption appends a to p.Assumptions unless it is there already.
func (p *Projection) addAssumption(a string) {
	for _, s := range p.Assumptions {
		if s == a {
			return
		}
	}
	p.Assumptions = append(p.Assumptions, a)
}

// plural is "1 org", "3 orgs", "2 batches".
func plural(n int64, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if strings.HasSuffix(word, "ch") {
		return numfmt.Commas(n) + " " + word + "es"
	}
	return numfmt.Commas(n) + " " + word + "s"
}
