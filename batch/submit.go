package batch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/spend"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// itemOverhead bounds the bytes a request adds to a create body beyond its
// line: `{"custom_id":"…","params":…},` around the params, which are never
// longer than the line that holds them.
const itemOverhead = 32

// itemBytes bounds what item it adds to a create body.
func itemBytes(it store.Item) int64 { return it.Length + int64(len(it.CustomID)) + itemOverhead }

// CheckItems checks, before anything is sent, that every item can go in a
// batch of at most maxBytes (0: MaxBytes) of create body. It names the
// first offending line. (max_tokens 0, which the Message Batches API
// refuses, is refused for every route by validation.)
func CheckItems(ctx context.Context, st store.Store, maxBytes int64) error {
	if maxBytes <= 0 {
		maxBytes = MaxBytes
	}
	var bad error
	err := store.EachPending(ctx, st, func(it store.Item) bool {
		if b := itemBytes(it) + 16; b > maxBytes {
			bad = fmt.Errorf("line %d (custom_id %s): the request takes up to %d bytes of a create body, more than a batch may hold (%d); send it with --route sync", it.Line, it.CustomID, b, maxBytes)
		}
		return bad == nil
	})
	return cmp.Or(err, bad)
}

// worstCase is the most item it can cost at the batch price. Under a cap
// its params are read for the multipliers they bring (cache writes,
// inference_geo); an item whose params cannot be read is bounded at all of
// them. An OpenAI item is bounded by upstream.OpenAI's worst case, of its
// body under a cap (its image parts are billed as images, which its
// length does not bound).
func (r *Route) worstCase(it store.Item) cost.Nanos {
	if p := upstream.Named(it.Provider); p != upstream.Anthropic {
		if p == nil {
			return cost.Unpriceable
		}
		var body []byte
		if r.gate.Capped() {
			body, _ = r.cfg.Body(it)
		}
		n, err := p.WorstCase(r.cfg.Prices, upstream.Item{Model: it.Model, EstInput: it.EstInput, Length: it.Length,
			MaxTokens: it.MaxTokens, Choices: it.Choices}, body, true)
		if err != nil {
			return cost.Unpriceable
		}
		return n
	}
	// Tokens never outnumber bytes, so the line's length bounds the input.
	b := cost.Bound{Model: it.Model, Input: max(it.EstInput, it.Length), MaxTokens: it.MaxTokens, Batch: true}
	if r.gate.Capped() {
		if body, err := r.cfg.Body(it); err == nil {
			b = workload.BoundOf(it.Model, body, it.MaxTokens, true)
			b.Input = max(b.Input, it.EstInput)
		} else {
			b.CacheWrite, b.GeoUS = cost.CacheWrite1h, true
		}
	}
	n, err := r.cfg.Prices.WorstCase(b)
	if err != nil {
		return cost.Unpriceable
	}
	return n
}

// candidates returns the pending items the route would carry that no open
// batch holds, in input order.
func (r *Route) candidates(ctx context.Context) ([]store.Item, error) {
	var out []store.Item
	err := store.EachPending(ctx, r.cfg.Store, func(it store.Item) bool {
		if r.takes(it) {
			out = append(out, it)
		}
		return true
	})
	return out, err
}

// takes reports whether the route would carry it now: selected by Take,
// in no open batch, and of a provider one of whose orgs may still create
// batches.
func (r *Route) takes(it store.Item) bool {
	return !r.Holds(it.Seq) && (r.cfg.Take == nil || r.cfg.Take(it)) && r.serves(it)
}

// serves reports whether an org of it's provider may still create batches.
func (r *Route) serves(it store.Item) bool {
	for _, o := range r.orgs {
		if o.disabled == "" && o.serves(it) {
			return true
		}
	}
	return false
}

// serves reports whether o's provider is it's.
func (o *orgState) serves(it store.Item) bool {
	return o.openai == (it.Provider == org.OpenAI)
}

// usable returns the orgs that may take a batch of it's provider now.
func (r *Route) usable(now time.Time, it store.Item) []*orgState {
	var out []*orgState
	for _, o := range r.orgs {
		if o.disabled == "" && !o.holdUntil.After(now) && o.serves(it) {
			out = append(out, o)
		}
	}
	return out
}

// group is the candidates that may share a batch: one provider's (and for
// OpenAI, one model's), in input order.
type group struct {
	openai bool
	model  string
	items  []store.Item
}

// groupsOf cuts cands into groups, in the order of their first items.
func groupsOf(cands []store.Item) []*group {
	var out []*group
	idx := map[string]*group{}
	for _, it := range cands {
		k := ""
		if it.Provider == org.OpenAI {
			k = "openai\x00" + it.Model
		}
		g := idx[k]
		if g == nil {
			g = &group{openai: it.Provider == org.OpenAI}
			if g.openai {
				g.model = it.Model
			}
			idx[k] = g
			out = append(out, g)
		}
		g.items = append(g.items, it)
	}
	return out
}

// submit places the pending items on their provider's orgs, a group at a
// time (one provider's items, and an OpenAI batch holds one model).
func (r *Route) submit(ctx context.Context) error {
	cands, err := r.candidates(ctx)
	if err != nil {
		return fmt.Errorf("reading pending items: %w", err)
	}
	if len(cands) == 0 {
		if r.cfg.SubmitOnce {
			r.closeSubmit("")
		}
		return nil
	}
	if r.allDisabled() {
		r.closeSubmit("no org can create batches: " + r.disabledReasons())
		return nil
	}
	all := true
	for _, g := range groupsOf(cands) {
		left, wait, err := r.place(ctx, g)
		if err != nil || wait {
			return err
		}
		all = all && left == 0
	}
	if r.cfg.SubmitOnce && all {
		r.closeSubmit("")
	}
	return nil
}

// place places group g's items on the orgs of their provider: the batch
// size is the smaller of Config.Size, the API's and an even share over
// the usable orgs, so that every org processes in parallel; each batch
// goes to the org with the most queue headroom (requests; for OpenAI the
// model's enqueued tokens), and no org is given more than its headroom.
// It returns how many items it left unplaced, and wait when the spend gate
// has no room (then nothing more is placed this pass).
func (r *Route) place(ctx context.Context, g *group) (left int, wait bool, err error) {
	cands := g.items
	usable := r.usable(time.Now(), cands[0])
	if len(usable) == 0 {
		return len(cands), false, nil
	}
	per := min(r.cfg.Size, usable[0].cl.maxRequests(), (len(cands)+len(usable)-1)/len(usable))
	for len(cands) > 0 && ctx.Err() == nil {
		var best *orgState
		var room, tokRoom int64
		for _, o := range r.usable(time.Now(), cands[0]) {
			h, t := r.capOf(o)-r.queued(o), int64(math.MaxInt64)
			if o.openai {
				h, t = int64(o.cl.maxRequests()), r.tokCapOf(o, g.model)-r.queuedTokens(o, g.model)
			}
			if best == nil || (o.openai && t > tokRoom) || (!o.openai && h > room) {
				best, room, tokRoom = o, h, t
			}
		}
		if best == nil || room <= 0 || tokRoom <= 0 {
			break // every org's queue is full of ours: wait for one to drain
		}
		want := int64(min(per, len(cands)))
		n := min(want, room)
		maxBytes := min(r.cfg.MaxBytes, best.cl.maxBytes())
		// Cut by count, bytes, queued tokens and cost.
		var bytes int64 = 16
		var worst cost.Nanos
		var tokens int64
		k, least := 0, (int(n)+3)/4
		full := false
		for k < int(n) {
			it := cands[k]
			b := best.cl.itemBytes(it)
			if bytes+b > maxBytes {
				break
			}
			if g.openai && tokens+it.EstInput > tokRoom && (k > 0 || r.queuedTokens(best, g.model) > 0) {
				// (One item goes on an org that holds nothing of ours in
				// the queue, whatever the limit learnt: the API judges.)
				full = k == 0
				break
			}
			w := r.worstCase(it)
			if r.gate.Check(worst+w) != nil {
				// The spend gate's room ends here. While another route
				// holds room that comes free a request at a time (a sync
				// engine's requests in flight), a batch cut to less than a
				// quarter of its size waits for more rather than make
				// slivers that queue behind each other.
				if k < least && r.gate.Open() > r.openCount() {
					k = 0
				}
				break
			}
			bytes += b
			worst += w
			tokens += it.EstInput
			k++
		}
		if full {
			break // the model's queue has no room for the next item: wait for it to drain
		}
		var hold *spend.Reservation
		if k > 0 {
			if hold, err = r.gate.Reserve(worst); err != nil {
				k = 0 // another route took the room meanwhile
			}
		}
		if k == 0 {
			it := cands[0]
			if best.cl.itemBytes(it)+16 > maxBytes {
				return len(cands), false, fmt.Errorf("line %d (custom_id %s): the request is %d bytes, more than a batch may hold (%d)", it.Line, it.CustomID, it.Length, maxBytes)
			}
			m := 1
			if r.gate.Open() > r.openCount() {
				m = least
			}
			var need cost.Nanos
			for _, it := range cands[:min(m, len(cands))] {
				need += r.worstCase(it)
			}
			r.waitRoom(need, m)
			return len(cands), true, nil
		}
		cut := cands[:k]
		cands = cands[k:]
		if err := r.create(ctx, best, cut, bytes, worst, hold, g.model, tokens); err != nil {
			return len(cands), false, err
		}
	}
	return len(cands), false, nil
}

func (r *Route) allDisabled() bool {
	for _, o := range r.orgs {
		if o.disabled == "" {
			return false
		}
	}
	return true
}

func (r *Route) disabledReasons() string {
	s := ""
	for _, o := range r.orgs {
		if o.disabled != "" {
			if s != "" {
				s += "; "
			}
			s += o.Name + ": " + o.disabled
		}
	}
	return s
}

// create records a batch of items as submitting, then makes its create
// call on org o. hold is its worst case, reserved in the spend gate; model
// and tokens an OpenAI batch's model and its prompt tokens.
func (r *Route) create(ctx context.Context, o *orgState, items []store.Item, bytes int64, worst cost.Nanos, hold *spend.Reservation, model string, tokens int64) error {
	seqs := make([]int64, len(items))
	for i, it := range items {
		seqs[i] = it.Seq
	}
	b := &rec{BatchRecord: store.BatchRecord{Org: o.Name, Status: store.BatchSubmitting, N: int64(len(items)), Bytes: bytes,
		WorstNanos: int64(worst), CreatedAt: time.Now().UTC(), Prefix: newPrefix()}, org: o, hold: hold, model: model, tokens: tokens}
	local, err := r.cfg.Store.AddBatch(ctx, b.BatchRecord, seqs)
	if err != nil {
		hold.Release() // nothing was sent
		return fmt.Errorf("recording a batch before its create: %w", err)
	}
	b.Local = local
	r.mu.Lock()
	for _, q := range seqs {
		r.held[q] = local
	}
	r.mu.Unlock()
	r.recs = append(r.recs, b)
	queue := fmt.Sprintf("queue %d of %d ours", r.queued(o), r.capOf(o))
	if o.openai {
		queue = fmt.Sprintf("model %s, queue %d of %d tokens ours", model, r.queuedTokens(o, model), r.tokCapOf(o, model))
	}
	r.emit(fmt.Sprintf("batch %d: creating %d requests on org %s as custom_ids %s_<item> (%s; worst case %s)", local, len(items), o.Name, b.Prefix, queue, worst), map[string]any{
		"batch": local, "org": o.Name, "n": len(items), "bytes_max": bytes, "worst_usd": worst.USD(), "prefix": b.Prefix})

	// The upload honours a stop: cut short, its answer is lost and the
	// record is reconciled (now, or by the resume).
	cctx, cancel := context.WithTimeout(ctx, r.api(createTimeout)+time.Minute)
	defer cancel()
	ab, err := o.cl.create(cctx, b.Prefix, items, r.cfg.Body)
	now := time.Now()
	if err == nil {
		b.Status, b.ID, b.SubmittedAt = store.BatchSubmitted, ab.ID, now.UTC()
		b.next, b.wait = now.Add(r.api(pollMin)), r.api(pollMin)
		b.last = ab
		if ab.Ended {
			b.ended, b.next = true, now
		}
		r.known[ab.ID] = local
		if uerr := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); uerr != nil {
			// The batch exists and its id is only in memory: a crash now
			// leaves a submitting record, which reconciliation adopts.
			return fmt.Errorf("recording batch %d's id %s: %w", local, ab.ID, uerr)
		}
		r.res.Created++
		r.res.Requests += b.N
		r.count(ctx, map[string]int64{rundir.CounterBatches: 1, rundir.CounterBatchRequests: b.N})
		r.emit(fmt.Sprintf("batch %d created on org %s as %s (%d requests)", local, o.Name, ab.ID, b.N), recData(&b.BatchRecord))
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Stopped while the create waited for its turn: nothing was sent.
		b.hold.Release()
		return r.abandon(ctx, b, "stopped before its create was sent")
	}
	var ae *apiError
	if errors.As(err, &ae) && ae.upload != "" {
		if ae.certain() {
			// The create made no batch: nothing will read its input file.
			r.discard(ctx, b, ae.upload)
		} else {
			b.upload = ae.upload // it may prove the batch ours
		}
	}
	if errors.As(err, &ae) && ae.certain() {
		b.hold.Release() // no batch was made: nothing is billed
		switch {
		case ae.noEffect && (ae.status == 0 || ae.status >= 500 || ae.status == http.StatusRequestTimeout || ae.status == http.StatusConflict):
			// A call that makes no batch (an upload) went unanswered: the
			// org rests a moment and the items go again.
			o.holdUntil = now.Add(max(ae.retryAfter, r.api(pollMin)))
			return r.abandon(ctx, b, fmt.Sprintf("org %s: %s; nothing was created", o.Name, ae.Error()))
		case o.openai && ae.status == http.StatusTooManyRequests && ae.typ == openai.ErrInsufficientQuota:
			// Billing, not pace: waiting does not help.
			o.disabled = "the OpenAI organisation's quota is used up (billing: add credit or raise its limit): " + ae.Error()
			return r.abandon(ctx, b, fmt.Sprintf("org %s cannot create batches: %s", o.Name, o.disabled))
		case ae.status == http.StatusTooManyRequests:
			// The queue cap or the batch endpoints' rate: this org rests,
			// and takes no more than what it holds of ours now.
			o.holdUntil = now.Add(max(ae.retryAfter, r.api(orgHoldMin)))
			if q := r.queued(o) - b.N; q > 0 {
				o.capSeen = q
			}
			return r.abandon(ctx, b, fmt.Sprintf("org %s refused the create with 429 (%s); it rests until %s", o.Name, ae.msg, o.holdUntil.UTC().Format(time.TimeOnly)))
		case slices.Contains([]int{http.StatusUnauthorized, http.StatusForbidden, http.StatusPaymentRequired,
			http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect}, ae.status):
			o.disabled = ae.Error()
			return r.abandon(ctx, b, fmt.Sprintf("org %s cannot create batches: %s", o.Name, ae.Error()))
		}
		if aerr := r.abandon(ctx, b, "the API refused the create: "+ae.Error()); aerr != nil {
			return aerr
		}
		return fmt.Errorf("org %s refused batch %d (%d requests) with %s; nothing of it was created", o.Name, local, b.N, ae.Error())
	}
	// A 5xx, a reset or a timeout: the batch may exist. Reconcile.
	r.emit(fmt.Sprintf("batch %d: the create's answer was lost (%v); looking for it in org %s's batches before anything is sent again", local, err, o.Name), recData(&b.BatchRecord))
	b.next, b.wait = now, r.api(pollMin)
	return nil
}

func (r *Route) count(ctx context.Context, c map[string]int64) {
	if _, err := r.cfg.Sink.Commit(context.WithoutCancel(ctx), store.Batch{Counters: c}); err != nil {
		r.log.Warn("recording batch counters", "error", err.Error())
	}
}
