package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/store"
)

func usageOf(in, out int64) anthropic.Usage {
	return anthropic.Usage{InputTokens: in, OutputTokens: out}
}

// errForeign: an adopted batch's results hold a custom_id its record never
// sent, so it is not this record's batch.
var errForeign = errors.New("batch: results hold a custom_id the batch was not given")

// reconcile looks for the batch a submitting record made, in the org's
// list: created since the record (less the clock skew allowed), with the
// record's request count, and not claimed by another record. One such
// batch is adopted; several are told apart by their results' custom_ids
// once they have ended; none, once the API has had reconcileWait to show
// it, means the create made nothing, and the record is abandoned.
func (r *Route) reconcile(ctx context.Context, b *rec) error {
	now := time.Now()
	claimed := map[string]bool{}
	for _, o := range r.recs {
		if o != b && o.ID != "" {
			claimed[o.ID] = true
		}
	}
	from := b.CreatedAt.Add(-listSkew)
	var cands []apiBatch
	err := b.org.cl.list(ctx, func(ab *apiBatch) bool {
		if ab.CreatedAt.Before(from) {
			return false // newest first: the rest are older still
		}
		if ab.RequestCounts.total() == b.N && !claimed[ab.ID] {
			cands = append(cands, *ab)
		}
		return true
	})
	if err != nil {
		if ctx.Err() == nil {
			r.backoff(b, now, retryAfter(err))
		}
		return nil
	}
	switch {
	case len(cands) == 1 && !cands[0].ended():
		return r.adopt(ctx, b, &cands[0], "the only batch of the org created since the record with its request count")
	case len(cands) >= 1:
		// Several (or one that has ended): its results must hold exactly
		// this record's custom_ids.
		for i := range cands {
			c := &cands[i]
			if !c.ended() {
				continue
			}
			ok, err := r.matches(ctx, b, c.ID)
			if err != nil {
				r.backoff(b, now, retryAfter(err))
				return nil
			}
			if ok {
				return r.adopt(ctx, b, c, "its results hold exactly this batch's custom_ids")
			}
		}
		if len(cands) == 1 || anyRunning(cands) {
			r.backoff(b, now, 0)
			return nil // wait for them to end
		}
	}
	if now.Sub(b.CreatedAt) < r.api(reconcileWait) {
		r.backoff(b, now, 0)
		return nil
	}
	return r.abandon(ctx, b, fmt.Sprintf("no batch of org %s created since %s holds its %d requests, %s after the create; the create made no batch",
		b.Org, b.CreatedAt.Format(time.RFC3339), b.N, now.Sub(b.CreatedAt).Round(time.Second)))
}

func anyRunning(cs []apiBatch) bool {
	for i := range cs {
		if !cs[i].ended() {
			return true
		}
	}
	return false
}

// matches reports whether the results of batch id hold exactly the
// custom_ids of record b.
func (r *Route) matches(ctx context.Context, b *rec, id string) (bool, error) {
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return false, err
	}
	want := make(map[string]bool, len(its))
	for _, it := range its {
		want[it.CustomID] = true
	}
	seen := 0
	foreign := false
	err = b.org.cl.results(ctx, id, func(line []byte) error {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		if json.Unmarshal(line, &l) != nil || !want[l.CustomID] {
			foreign = true
			return errForeign
		}
		seen++
		return nil
	})
	if foreign {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return seen == len(want), nil
}

func (r *Route) adopt(ctx context.Context, b *rec, ab *apiBatch, why string) error {
	now := time.Now()
	b.Status, b.ID, b.SubmittedAt = store.BatchSubmitted, ab.ID, now.UTC()
	b.Note = "adopted: " + why
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording adopted batch %d (%s): %w", b.Local, ab.ID, err)
	}
	r.res.Adopted++
	r.res.Requests += b.N
	r.count(ctx, map[string]int64{CounterBatchAdopted: 1, CounterBatches: 1, CounterBatchRequests: b.N})
	r.emit(fmt.Sprintf("batch %d adopted as %s on org %s (%s); not created again", b.Local, ab.ID, b.Org, why), recData(&b.BatchRecord))
	b.next, b.wait = now, r.api(pollMin)
	if ab.ended() {
		b.ended = true
		b.EndedAt = derefTime(ab.EndedAt)
	}
	return nil
}

// resultLine is one line of a batch's results.
type resultLine struct {
	CustomID string          `json:"custom_id"`
	Result   json.RawMessage `json:"result"`
}

type resultBody struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string          `json:"id"`
		Usage anthropic.Usage `json:"usage"`
	} `json:"message"`
	Error *anthropic.ErrorEnvelope `json:"error"`
}

// harvestChunk is how many outcomes one commit carries.
const harvestChunk = 1000

// harvest reads an ended batch's results into the store and results.jsonl.
// Each outcome passes the store's guard, so a harvest repeated after a
// crash or a broken stream writes nothing twice.
func (r *Route) harvest(ctx context.Context, b *rec) error {
	now := time.Now()
	its, err := r.cfg.Store.BatchItems(ctx, b.Local)
	if err != nil {
		return err
	}
	byID := make(map[string]*store.BatchItem, len(its))
	for i := range its {
		byID[its[i].CustomID] = &its[i]
	}
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
			r.count(ctx, map[string]int64{dispatch.CounterBatchSyncPriceNanos: taken})
		}
		outs, syncOf = outs[:0], syncOf[:0]
		return nil
	}
	streamErr := b.org.cl.results(ctx, b.ID, func(line []byte) error {
		var l resultLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("batch %d (%s): a results line is not JSON: %w", b.Local, b.ID, err)
		}
		it := byID[l.CustomID]
		if it == nil {
			return fmt.Errorf("%w: %s in %s", errForeign, l.CustomID, b.ID)
		}
		if seen[l.CustomID] {
			return nil
		}
		seen[l.CustomID] = true
		var rb resultBody
		if err := json.Unmarshal(l.Result, &rb); err != nil {
			return fmt.Errorf("batch %d (%s): the result of %s is not a result object: %w", b.Local, b.ID, l.CustomID, err)
		}
		switch rb.Type {
		case "succeeded":
			if rb.Message == nil {
				retried++ // not a message: sent again
				return nil
			}
			c, err := r.cfg.Prices.Cost(it.Model, rb.Message.Usage, true)
			if err != nil {
				return fmt.Errorf("pricing %s: %w", it.CustomID, err)
			}
			sc, err := r.cfg.Prices.Cost(it.Model, rb.Message.Usage, false)
			if err != nil {
				return fmt.Errorf("pricing %s: %w", it.CustomID, err)
			}
			succ++
			costN += int64(c)
			syncOf = append(syncOf, int64(sc))
			outs = append(outs, r.outcome(b, it, store.Succeeded, "", l.Result, c, rb.Message.Usage, latency))
		case "errored":
			typ := ""
			if rb.Error != nil {
				typ = rb.Error.Error.Type
			}
			if typ == "" || anthropic.IsRetryableType(typ) {
				retried++
				if typ == anthropic.ErrOverloaded {
					overloaded++
				} else {
					errRetry++
				}
				return nil
			}
			errd++
			syncOf = append(syncOf, 0)
			outs = append(outs, r.outcome(b, it, store.Errored, typ, l.Result, 0, anthropic.Usage{}, latency))
		case "expired":
			retried++
			expired++
			return nil
		default: // canceled: sent again
			retried++
			return nil
		}
		if len(outs) >= harvestChunk {
			return flush()
		}
		return nil
	})
	if err := flush(); err != nil {
		return err
	}
	if streamErr != nil {
		if errors.Is(streamErr, errForeign) {
			return fmt.Errorf("batch %d of this run on org %s was matched to %s, whose results are not its requests (%v); it was not harvested: check the org's batches", b.Local, b.Org, b.ID, streamErr)
		}
		var ae *apiError
		if !errors.As(streamErr, &ae) {
			return streamErr
		}
		b.harvestErr++
		r.res.BrokenDownloads++
		r.log.Warn("reading a batch's results failed; reading them again", "batch", b.Local, "id", b.ID, "error", streamErr.Error())
		if ctx.Err() == nil {
			r.backoff(b, now, ae.retryAfter)
		}
		return nil
	}
	missing := int64(len(its) - len(seen))
	retried += missing
	b.Status, b.HarvestedAt = store.BatchHarvested, time.Now().UTC()
	if b.EndedAt.IsZero() {
		b.EndedAt = now.UTC()
	}
	if err := r.cfg.Store.UpdateBatch(context.WithoutCancel(ctx), b.BatchRecord); err != nil {
		return fmt.Errorf("recording batch %d as harvested: %w", b.Local, err)
	}
	if retried > 0 {
		r.count(ctx, map[string]int64{CounterBatchRetried: retried, dispatchOverloaded: overloaded, dispatchOther: errRetry})
	}
	r.res.Harvested++
	r.res.Retried += retried
	r.res.Expired += expired
	r.emit(fmt.Sprintf("batch %d (%s, org %s) harvested: %d succeeded, %d errored, %d back to pending (%d missing from the results); %s at the batch price",
		b.Local, b.ID, b.Org, succ, errd, retried, missing, cost.Nanos(costN)),
		map[string]any{"batch": b.Local, "batch_id": b.ID, "org": b.Org, "succeeded": succ, "errored": errd, "retried": retried, "expired": expired, "missing": missing, "cost_usd": cost.Nanos(costN).USD()})
	return r.release(ctx, b)
}

// Counter names shared with the sync route's summary.
const (
	dispatchOverloaded = "overloaded_529"
	dispatchOther      = "other_retries"
)

// outcome builds the durable outcome and results.jsonl line of a batch
// result: the API's result object as it came, and a dispatch object.
func (r *Route) outcome(b *rec, it *store.BatchItem, st store.State, errType string, result json.RawMessage, c cost.Nanos, u anthropic.Usage, latency time.Duration) store.Outcome {
	var res bytes.Buffer
	if json.Compact(&res, result) != nil {
		res.Reset()
		res.Write(result)
	}
	d, _ := json.Marshal(struct {
		Org       string  `json:"org"`
		Route     string  `json:"route"`
		BatchID   string  `json:"batch_id"`
		Attempts  int64   `json:"attempts"`
		LatencyMs int64   `json:"latency_ms"`
		CostUSD   float64 `json:"cost_usd"`
	}{b.Org, store.RouteBatch, b.ID, it.Batches, latency.Milliseconds(), c.USD()})
	id, _ := json.Marshal(it.CustomID)
	line := make([]byte, 0, res.Len()+len(d)+len(id)+40)
	line = append(line, `{"custom_id":`...)
	line = append(line, id...)
	line = append(line, `,"result":`...)
	line = append(line, res.Bytes()...)
	line = append(line, `,"dispatch":`...)
	line = append(line, d...)
	line = append(line, '}')
	return store.Outcome{
		Seq: it.Seq, State: st, Org: b.Org, Route: store.RouteBatch, ErrorType: errType, Attempts: it.Batches,
		LatencyMs: latency.Milliseconds(), CostNanos: int64(c), InputTok: u.InputTokens, OutputTok: u.OutputTokens,
		CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens, Line: line,
	}
}
