package batch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// errForeign: a batch's results hold a custom_id its record never sent.
var errForeign = errors.New("batch: results hold a custom_id the batch was not given")

// Bounds of the waits of a record whose create's answer was lost.
const (
	// expiryGrace is how long past its expires_at a candidate batch may
	// still not have ended before the record stops waiting for it.
	expiryGrace = time.Hour
	// batchLife is the API's expiry, for a batch object without expires_at.
	batchLife = 24 * time.Hour
)

// proof is what a candidate batch's results say about a record.
type proof int

const (
	// proofForeign: a custom_id the record did not write (another
	// batch's, a colleague's): not the record's batch.
	proofForeign proof = iota
	// proofOurs: exactly the record's custom_ids, each once.
	proofOurs
	// proofMarked: custom_ids with the record's prefix, but not exactly
	// its items (some missing, repeated, or unknown): nobody else writes
	// that prefix, so a person must look.
	proofMarked
)

// reconcile settles a record whose create's answer was lost (or whose
// process died during the create). The org's batches created since the
// record (less the clock skew allowed) with its request count, not held
// by another record of the run, are its candidates. One is adopted only
// when its results prove it the record's: they hold exactly the custom_ids
// the record wrote, which carry its prefix (random, made for it alone), so
// a colleague's batch of the same size and the same custom_ids is never
// taken. A candidate proven not the record's is never looked at again.
// While candidates have not ended the record waits, holding its items (no
// second batch is made for them), at most until the latest one's expiry
// plus expiryGrace (then ErrNeedsPerson). With no candidate left, once the
// API has had reconcileWait to show the batch, the create made nothing and
// the record is abandoned: its items are free again.
func (r *Route) reconcile(ctx context.Context, b *rec) error {
	now := time.Now()
	from := b.CreatedAt.Add(-listSkew)
	var ended, running []apiBatch
	err := b.org.cl.list(ctx, func(ab *apiBatch) bool {
		if ab.CreatedAt.Before(from) {
			return false // newest first: the rest are older still
		}
		if ab.Total != b.N || r.claimedByOther(b, ab.ID) || b.rejected[ab.ID] || ab.Prefix != "" && ab.Prefix != b.Prefix {
			return true
		}
		// ended: its custom_ids can be read now (a message batch's
		// results; an OpenAI batch's input file, whatever its state).
		if b.org.cl.ready(ab) || ab.Ended {
			ended = append(ended, *ab)
		} else {
			running = append(running, *ab)
		}
		return true
	})
	if err != nil {
		if ctx.Err() == nil {
			r.backoff(b, now, retryAfter(err))
		}
		return nil
	}
	for i := range ended {
		c := &ended[i]
		if c.ArchivedAt != nil {
			// Its results are gone: it cannot be proven ours, and were it
			// ours there would be nothing to harvest.
			r.reject(b, c.ID, "its results are past retention (archived)")
			continue
		}
		p, err := r.prove(ctx, b, c)
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.status == http.StatusNotFound {
				r.reject(b, c.ID, "its results are not found")
				continue
			}
			if ctx.Err() == nil {
				r.backoff(b, now, retryAfter(err))
			}
			return nil
		}
		switch p {
		case proofOurs:
			return r.adopt(ctx, b, c, "its results hold exactly the custom_ids this record wrote (prefix "+b.Prefix+")")
		case proofMarked:
			return fmt.Errorf("%w: batch %s on org %s holds custom_ids with the prefix %s, which only batch %d of this run writes, but not exactly its %d items; it was not adopted and batch %d's items stay held: check that batch (apidispatch cannot tell which results are right)",
				ErrNeedsPerson, c.ID, b.Org, b.Prefix, b.Local, b.N, b.Local)
		}
		r.reject(b, c.ID, "its results hold custom_ids this record did not write")
	}
	if len(running) > 0 {
		var bound time.Time
		ids := make([]string, len(running))
		for i := range running {
			c := &running[i]
			ids[i] = c.ID
			exp := c.ExpiresAt
			if exp.IsZero() {
				exp = c.CreatedAt.Add(r.api(batchLife))
			}
			bound = maxTime(bound, exp.Add(r.api(expiryGrace)))
		}
		if now.After(bound) {
			return fmt.Errorf("%w: batch %d of this run (org %s, %d requests) lost its create's answer, and the org's batches %v, of its size, have not ended %s after their expiry, so whether one is this record's cannot be told; its items stay held: check the org's batches, cancel the one that holds custom_ids beginning %s_ if any, then run again",
				ErrNeedsPerson, b.Local, b.Org, b.N, ids, r.api(expiryGrace), b.Prefix)
		}
		if !b.waitNoted {
			b.waitNoted = true
			r.emit(fmt.Sprintf("batch %d (org %s, %d requests): waiting for %d batch(es) of the org of its size (%v) to end, to tell from their results whether one is its own; its items stay held and nothing is created for them meanwhile (bound: %s)",
				b.Local, b.Org, b.N, len(running), ids, bound.UTC().Format(time.RFC3339)), recData(&b.BatchRecord))
		}
		r.backoff(b, now, 0)
		return nil
	}
	if now.Sub(b.CreatedAt) < r.api(reconcileWait) {
		r.backoff(b, now, 0)
		return nil
	}
	r.discard(ctx, b, b.upload)
	return r.abandon(ctx, b, fmt.Sprintf("no batch of org %s created since %s holds its %d requests (custom_ids %s_…), %s after the create; the create made no batch",
		b.Org, b.CreatedAt.Format(time.RFC3339), b.N, cmp.Or(b.Prefix, "unprefixed"), now.Sub(b.CreatedAt).Round(time.Second)))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// claimedByOther reports whether batch id is held by a record of the run
// other than b (open or settled: a batch of this run is never adopted
// twice).
func (r *Route) claimedByOther(b *rec, id string) bool {
	l, ok := r.known[id]
	return ok && l != b.Local
}

// reject records that candidate id is not b's batch, so that it is not
// read again.
func (r *Route) reject(b *rec, id, why string) {
	if b.rejected == nil {
		b.rejected = map[string]bool{}
	}
	b.rejected[id] = true
	r.emit(fmt.Sprintf("batch %d (org %s): batch %s, of its size, is not its own: %s", b.Local, b.Org, id, why), map[string]any{"batch": b.Local, "org": b.Org, "candidate": id})
}

// prove reads the results of batch id and says whether they are record
// b's. It stops at the first custom_id without b's prefix when none with
// it came before (a colleague's batch costs a line or two).
func (r *Route) prove(ctx context.Context, b *rec, c *apiBatch) (proof, error) {
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return proofForeign, err
	}
	want := make(map[string]bool, len(its))
	for _, it := range its {
		want[sentID(b.Prefix, it.Item)] = false
	}
	seen, marked, foreign, repeated := 0, false, false, false
	err = b.org.cl.sent(ctx, c, func(line []byte) error {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		json.Unmarshal(line, &l)
		done, ok := want[l.CustomID]
		switch {
		case ok && done:
			repeated = true
		case ok:
			want[l.CustomID] = true
			seen++
		default:
			foreign = true
		}
		if b.Prefix != "" && hasPrefix(b.Prefix, l.CustomID) {
			marked = true
		}
		if foreign && !marked {
			return errForeign // not ours: the rest need not be read
		}
		return nil
	})
	if errors.Is(err, errForeign) {
		return proofForeign, nil
	}
	if err != nil {
		return proofForeign, err
	}
	switch {
	case !foreign && !repeated && seen == len(want):
		return proofOurs, nil
	case marked:
		return proofMarked, nil
	}
	return proofForeign, nil
}

func (r *Route) adopt(ctx context.Context, b *rec, ab *apiBatch, why string) error {
	now := time.Now()
	b.Status, b.ID, b.SubmittedAt = store.BatchSubmitted, ab.ID, now.UTC()
	b.Note = "adopted: " + why
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording adopted batch %d (%s): %w", b.Local, ab.ID, err)
	}
	r.known[ab.ID] = b.Local
	r.res.Adopted++
	r.res.Requests += b.N
	r.count(ctx, map[string]int64{rundir.CounterBatchAdopted: 1, rundir.CounterBatches: 1, rundir.CounterBatchRequests: b.N})
	r.emit(fmt.Sprintf("batch %d adopted as %s on org %s (%s); not created again", b.Local, ab.ID, b.Org, why), recData(&b.BatchRecord))
	b.next, b.wait = now, r.api(pollMin)
	b.last = ab
	if ab.Ended {
		b.ended = true
		b.EndedAt = derefTime(ab.EndedAt)
	}
	return nil
}

// harvestChunk is how many outcomes one commit carries.
const harvestChunk = 1000

// harvest reads an ended batch's results into the store and results.jsonl.
// Each outcome passes the store's guard, so a harvest repeated after a
// crash or a broken stream writes nothing twice.
func (r *Route) harvest(ctx context.Context, b *rec) error {
	now := time.Now()
	if b.last == nil || !b.last.Ended {
		ab, err := b.org.cl.retrieve(ctx, b.ID)
		if err != nil {
			if ctx.Err() == nil {
				r.backoff(b, now, retryAfter(err))
			}
			return nil
		}
		b.last = ab
	}
	if b.last.Failed != "" {
		return r.failed(ctx, b)
	}
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return err
	}
	byID := make(map[string]*store.BatchItem, len(its))
	for i := range its {
		byID[sentID(b.Prefix, its[i].Item)] = &its[i]
	}
	prov := upstream.For(b.org.Org)
	seen := make(map[string]bool, len(its))
	var outs []store.Outcome
	var retried, errRetry, overloaded, expired, costN int64
	var succ, errd int64
	var syncOf []int64 // per outcome in outs: its cost at the sync price
	latency := b.EndedAt.Sub(b.CreatedAt)
	if b.EndedAt.IsZero() || latency < 0 {
		latency = now.Sub(b.CreatedAt)
	}
	flush := func() error {
		if len(outs) == 0 {
			return nil
		}
		res, err := r.cfg.Sink.Commit(context.WithoutCancel(ctx), store.Batch{Outcomes: outs})
		if err != nil {
			return fmt.Errorf("the run's state could not be written while harvesting batch %d (%s); nothing unwritten is marked done, and the same command harvests it again: %w", b.Local, b.ID, err)
		}
		// What the results the guard took would have cost by sync, for
		// the summary's comparison (a crash just here loses a little of
		// this figure, never of the cost).
		var taken int64
		for i, o := range outs {
			if res.RSeq[i] != 0 {
				r.res.CostNanos += o.CostNanos
				taken += syncOf[i]
			}
		}
		if taken > 0 {
			r.count(ctx, map[string]int64{rundir.CounterBatchSyncPriceNanos: taken})
		}
		outs, syncOf = outs[:0], syncOf[:0]
		return nil
	}
	parts := b.org.cl.parts(b.last)
	skip := min(b.PartsRead, len(parts))
	if skip > 0 {
		// Read to their end by an earlier harvest (a process that
		// stopped), their results committed: the items of the batch not
		// pending were in them.
		pending, err := r.pendingOf(ctx, its)
		if err != nil {
			return err
		}
		for id, it := range byID {
			if !pending[it.Seq] {
				seen[id] = true
			}
		}
	}
	read := func(line []byte) error {
		l, err := b.org.cl.parse(line)
		if err != nil {
			return fmt.Errorf("batch %d (%s): %w", b.Local, b.ID, err)
		}
		it := byID[l.customID]
		if it == nil {
			return fmt.Errorf("%w: %s in %s", errForeign, l.customID, b.ID)
		}
		if seen[l.customID] {
			return nil
		}
		seen[l.customID] = true
		switch l.kind {
		case resultSucceeded:
			c, err := prov.Cost(r.cfg.Prices, it.Model, l.usage, true)
			if err != nil {
				return fmt.Errorf("pricing %s: %w", it.CustomID, err)
			}
			sc, err := prov.Cost(r.cfg.Prices, it.Model, l.usage, false)
			if err != nil {
				return fmt.Errorf("pricing %s: %w", it.CustomID, err)
			}
			succ++
			costN += int64(c)
			syncOf = append(syncOf, int64(sc))
			outs = append(outs, r.outcome(b, it, store.Succeeded, &l, c, latency))
		case resultErrored:
			errd++
			syncOf = append(syncOf, 0)
			outs = append(outs, r.outcome(b, it, store.Errored, &l, 0, latency))
		default:
			retried++
			switch {
			case l.expired:
				expired++
			case l.errType == anthropic.ErrOverloaded:
				overloaded++
			case l.errType != "" || l.status != 0:
				errRetry++
			}
			return nil
		}
		if len(outs) >= harvestChunk {
			return flush()
		}
		return nil
	}
	var streamErr error
	for i := skip; i < len(parts) && streamErr == nil; i++ {
		if streamErr = b.org.cl.results(ctx, b.last, parts[i], read); streamErr != nil || i+1 == len(parts) {
			break
		}
		// Read to its end: once its results are committed, a harvest
		// started again (a resume) reads only the parts after it.
		if err := flush(); err != nil {
			return err
		}
		b.PartsRead = i + 1
		if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
			return fmt.Errorf("recording that batch %d's results file %s was read: %w", b.Local, parts[i], err)
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if streamErr != nil {
		if errors.Is(streamErr, errForeign) {
			return fmt.Errorf("%w: batch %d of this run on org %s is %s, whose results hold custom_ids it was not given (%v); the results committed before that one stand, the rest were not harvested and its items stay held: check that batch on the org (every resume would find the same)", ErrNeedsPerson, b.Local, b.Org, b.ID, streamErr)
		}
		var ae *apiError
		if !errors.As(streamErr, &ae) {
			return streamErr
		}
		if ctx.Err() != nil {
			return nil // cut by the stop: not a failure of the download
		}
		gone := false
		if ae.status == http.StatusNotFound {
			// Gone, or past retention: the batch object says which.
			ab, err := b.org.cl.retrieve(ctx, b.ID)
			if err == nil && ab.ArchivedAt != nil {
				return r.pastRetention(ctx, b, *ab.ArchivedAt)
			}
			if err == nil {
				// An OpenAI file the batch still names answers 404: it
				// was deleted, or is past its retention.
				gone = ae.file != "" && (ab.OutputFile == ae.file || ab.ErrorFile == ae.file)
				b.last = ab
			}
		}
		r.res.BrokenDownloads++
		if err := r.readFailed(b, now, seen, byID, gone, ae); err != nil {
			return err
		}
		r.log.Warn("reading a batch's results failed; reading them again", "batch", b.Local, "id", b.ID, "error", org.Scrub(streamErr.Error()))
		r.backoff(b, now, ae.retryAfter)
		return nil
	}
	b.fails = readFails{}
	missing := int64(len(its) - len(seen))
	retried += missing
	r.discard(ctx, b, b.last.InputFile)
	if err := r.settled(ctx, b, now); err != nil {
		return err
	}
	if retried > 0 {
		r.count(ctx, map[string]int64{rundir.CounterBatchRetried: retried, rundir.CounterOverloaded: overloaded, rundir.CounterOtherRetries: errRetry})
	}
	r.res.Harvested++
	r.res.Retried += retried
	r.res.Expired += expired
	r.emit(fmt.Sprintf("batch %d (%s, org %s) harvested: %d succeeded, %d errored, %d back to pending (%d missing from the results); %s at the batch price",
		b.Local, b.ID, b.Org, succ, errd, retried, missing, cost.Nanos(costN)),
		map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "succeeded": succ, "errored": errd, "retried": retried, "expired": expired, "missing": missing, "cost_usd": cost.Nanos(costN).USD()})
	return r.release(ctx, b)
}

// Bounds of the reads of a batch's results that fail (API time): a read
// that fails readFailMax times in a row, over readFailSpan at least,
// without getting further than the reads before it, will not succeed by
// being tried again; nor will the download of an OpenAI file that answers
// 404 goneConfirm times over goneSpan while the batch still names it.
const (
	readFailMax  = 10
	readFailSpan = 30 * time.Minute
	goneConfirm  = 3
	goneSpan     = time.Minute
)

// readFails counts the failed reads of a batch's results since the last
// one that got further.
type readFails struct {
	n     int       // failed reads in a row without getting further
	since time.Time // the first of them
	gone  int       // … of which the last ones in a row were confirmed 404s
	goneT time.Time // the first of those
	// reached is every item whose result a read of this process got to.
	reached map[int64]bool
	last    string // the last failure, scrubbed
}

// readFailed counts a failed read of batch b's results, which got to the
// items of seen (custom_ids sent, whose items byID maps); gone: the download answered 404 for a
// file the batch still names. A read that got to an item no read got to
// before starts the count again. Once the reads have failed long enough
// it returns ErrNeedsPerson: the run stops rather than try for ever; the
// results committed stand, the batch's items stay held (none is sent
// again, so none is paid twice), and the same command tries again.
func (r *Route) readFailed(b *rec, now time.Time, seen map[string]bool, byID map[string]*store.BatchItem, gone bool, ae *apiError) error {
	f := &b.fails
	if f.reached == nil {
		f.reached = map[int64]bool{}
	}
	further := false
	for id := range seen {
		if q := byID[id].Seq; !f.reached[q] {
			f.reached[q], further = true, true
		}
	}
	if further || f.n == 0 {
		f.n, f.since, f.gone = 0, now, 0
	}
	f.n++
	f.last = org.Scrub(ae.Error())
	if !gone {
		f.gone = 0
	} else {
		if f.gone == 0 {
			f.goneT = now
		}
		f.gone++
	}
	switch {
	case f.gone >= goneConfirm && now.Sub(f.goneT) >= r.api(goneSpan):
		return fmt.Errorf("%w: batch %d of this run (%s, org %s): its results file %s answers 404 not found (%d times over %s), though the batch still names it: deleted, or past the file's retention (last: %s); the results committed before stand, and its items stay held, none sent again (so none is paid twice): check the batch and its files on the org; the same command tries again",
			ErrNeedsPerson, b.Local, b.ID, b.Org, ae.file, f.gone, now.Sub(f.goneT).Round(time.Second), f.last)
	case f.n >= readFailMax && now.Sub(f.since) >= r.api(readFailSpan):
		return fmt.Errorf("%w: batch %d of this run (%s, org %s): reading its results failed %d times in a row over %s without getting further (last: %s); the results committed before stand, and its items stay held, none sent again (so none is paid twice): check the batch on the org; the same command tries again",
			ErrNeedsPerson, b.Local, b.ID, b.Org, f.n, now.Sub(f.since).Round(time.Second), f.last)
	}
	return nil
}

// settled records b as harvested.
func (r *Route) settled(ctx context.Context, b *rec, now time.Time) error {
	b.Status, b.HarvestedAt = store.BatchHarvested, time.Now().UTC()
	if b.EndedAt.IsZero() {
		b.EndedAt = now.UTC()
	}
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording batch %d as harvested: %w", b.Local, err)
	}
	return nil
}

// failed settles an OpenAI batch that failed as a whole: the API refused
// its input, so nothing of it ran or was billed, and its items are pending
// again. One that failed for its model's enqueued-token limit lowers what
// the route places in that queue, and its org rests; any other failure
// would repeat on every resume: the run stops and names it.
func (r *Route) failed(ctx context.Context, b *rec) error {
	now := time.Now()
	why := b.last.Failed
	o := b.org
	if b.last.QueueFull {
		// What the queue held of ours beside it is what it holds at most;
		// with nothing of ours beside it (a colleague's batches, or
		// estimates below the API's counts) half of it, and the org rests.
		// The record keeps it, so that a resume does not overrun it again.
		c := r.queuedTokens(o, b.model)
		if c <= 0 {
			c = b.tokens / 2
			o.holdUntil = now.Add(r.api(orgHoldMin))
		}
		b.QueueTokens = min(r.tokCapOf(o, b.model), max(c, 1))
		o.tokSeen[b.model] = b.QueueTokens
	}
	r.discard(ctx, b, b.last.InputFile)
	if err := r.settled(ctx, b, now); err != nil {
		return err
	}
	// Its reservation is released by harvestSpend: a failed batch runs
	// nothing, so nothing is billed.
	r.count(ctx, map[string]int64{rundir.CounterBatchRetried: b.N})
	r.res.Harvested++
	r.res.Retried += b.N
	r.emit(fmt.Sprintf("batch %d (%s, org %s, %d requests) failed: %s; its items are pending again", b.Local, b.ID, b.Org, b.N, why),
		map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "failed": why})
	if err := r.release(ctx, b); err != nil {
		return err
	}
	if b.last.QueueFull {
		return nil
	}
	return fmt.Errorf("%w: batch %d of this run (%s, org %s, %d requests) failed: %s; its items are pending again, and the same input would fail again: check the requests (or the org's access to model %s)", ErrNeedsPerson, b.Local, b.ID, b.Org, b.N, why, b.model)
}

// outcome builds the durable outcome and results.jsonl line of a batch
// result: the API's result as it came (its provider's line), and a
// dispatch object.
func (r *Route) outcome(b *rec, it *store.BatchItem, st store.State, l *result, c cost.Nanos, latency time.Duration) store.Outcome {
	line := b.org.cl.line(it.CustomID, l, rundir.Dispatch{Org: b.Org, Route: store.RouteBatch, BatchID: b.ID,
		Attempts: it.Batches, LatencyMs: latency.Milliseconds(), Cost: c})
	o := store.Outcome{
		Seq: it.Seq, State: st, Org: b.Org, Route: store.RouteBatch, Attempts: it.Batches,
		LatencyMs: latency.Milliseconds(), CostNanos: int64(c), Line: line,
	}
	if st == store.Errored {
		o.ErrorType = l.errType
	}
	if u := l.usage; u != nil {
		o.InputTok, o.OutputTok, o.CacheRead, o.CacheWrite = u.Input, u.Output, u.CacheRead, u.CacheWrite
	}
	return o
}

// pendingOf reports which of its are pending.
func (r *Route) pendingOf(ctx context.Context, its []store.BatchItem) (map[int64]bool, error) {
	in := make(map[int64]bool, len(its))
	for _, it := range its {
		in[it.Seq] = true
	}
	pending := make(map[int64]bool, len(its))
	err := store.EachPending(ctx, r.cfg.Store, func(it store.Item) bool {
		if in[it.Seq] {
			pending[it.Seq] = true
		}
		return true
	})
	return pending, err
}

// pastRetention settles batch b, whose results the API no longer keeps
// (archived at at, 29 days after its creation): nothing more can be read
// from it, so its items not harvested before are pending again, to be sent
// again, and it is never read again.
func (r *Route) pastRetention(ctx context.Context, b *rec, at time.Time) error {
	now := time.Now()
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return err
	}
	pending, err := r.pendingOf(ctx, its)
	if err != nil {
		return err
	}
	var back int64
	for _, it := range its {
		if pending[it.Seq] {
			back++
		}
	}
	// What the batch billed for the results that cannot be read is not
	// known: its worst case stays counted in the spend gate.
	b.hold.Keep()
	b.Status, b.HarvestedAt = store.BatchHarvested, now.UTC()
	if b.EndedAt.IsZero() {
		b.EndedAt = now.UTC()
	}
	b.Note = fmt.Sprintf("results past retention (archived %s): not harvested; %d items pending again", at.UTC().Format(time.RFC3339), back)
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording batch %d as past retention: %w", b.Local, err)
	}
	r.count(ctx, map[string]int64{rundir.CounterBatchArchived: 1, rundir.CounterBatchRetried: back})
	r.res.Archived++
	r.res.Retried += back
	r.emit(fmt.Sprintf("batch %d (%s, org %s): its results are past retention (archived %s; the API keeps them 29 days after creation) and cannot be read; its %d items not harvested are pending again and will be sent again", b.Local, b.ID, b.Org, at.UTC().Format(time.RFC3339), back),
		map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "archived_at": at, "pending_again": back})
	return r.release(ctx, b)
}
