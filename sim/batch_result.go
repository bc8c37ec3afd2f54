package sim

import (
	"bytes"
	"crypto/sha256"
	"net/http"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// half is the Message Batches price: 50 % of every rate. Every rate in the
// table is an even number of nano-dollars, so it is exact
// (TestBatchPricesHalveExactly).
func (p price) half() price {
	return price{in: p.in / 2, out: p.out / 2, write5m: p.write5m / 2, write1h: p.write1h / 2, read: p.read / 2}
}

// batchCost prices a usage on m at the batch rates (long-context rates
// halved when they apply), ×1.1 for inference_geo "us" as a synchronous
// request is (the multipliers stack).
func (m *modelInfo) batchCost(u usage) int64 {
	p := m.price
	if m.longContext && u.input+u.write5m+u.write1h+u.read > 200000 {
		p = m.longPrice
	}
	c := p.half().cost(u.input, u.output, u.write5m, u.write1h, u.read)
	if u.geoUS {
		c = c / 10 * 11
	}
	return c
}

// batchUsage is the usage of a batch request req whose answer is out: its
// input and output, in the inference geography it asked for (the
// simulator's batches write and read no prompt cache).
func batchUsage(req request, out output) usage {
	return usage{input: req.input, output: out.tokens, geoUS: req.x != nil && req.x.geoUS}
}

// validateItem validates request k of b as POST /v1/messages would, plus
// what the Batches API refuses (stream, speed, max_tokens 0), and that the
// org serves the model. Every failure is an invalid_request_error: the
// request must be fixed before it is sent again.
func (s *Server) validateItem(b *simBatch, k int) (request, *apiError) {
	p := b.params(k)
	var w wireRequest
	if !fastDecodeRequest(p, &w) {
		w = wireRequest{}
		if e := strictDecodeRequest(p, &w); e != nil {
			return request{}, asInvalid(e)
		}
	}
	switch {
	case w.Stream != nil && *w.Stream:
		return request{}, invalid("stream: streaming is not supported in the Message Batches API")
	case w.MaxTokens != nil && *w.MaxTokens == 0:
		return request{}, invalid("max_tokens: must be at least 1 in the Message Batches API")
	case len(w.Speed) > 0 && !bytes.Equal(w.Speed, []byte("null")):
		return request{}, invalid("speed: fast mode is not available in the Message Batches API")
	}
	req, aerr := parseRequest(p, false, b.beta)
	if aerr != nil {
		return request{}, asInvalid(aerr)
	}
	if _, served := b.ks.org.pools[req.model.pool]; !served {
		return request{}, invalid("model: %s", req.model.id)
	}
	return req, nil
}

func asInvalid(e *apiError) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: anthropic.ErrInvalidRequest, msg: e.msg}
}

// finalizeBatch fixes the outcome of every request of an ended batch and
// bills the succeeded ones, once. b.mu is held. A request processed before
// the end is validated and then errored by the batch_errored_* faults
// configured now that match its processing time; the rest are canceled
// (the batch was canceled) or expired.
func (s *Server) finalizeBatch(b *simBatch) {
	if b.final {
		return
	}
	n := len(b.items)
	done := b.processedAt(b.end)
	rest := outExpired
	if b.cancelAt >= 0 && b.end < b.expires {
		rest = outCanceled
	}
	b.outcomes = make([]outcome, n)
	var c batchCounts
	fs := s.faults.Load()
	o := b.ks.org
	wall := time.Now()
	now := wall.Sub(s.start)
	for k := range n {
		if k >= done {
			b.outcomes[k] = rest
			if rest == outCanceled {
				c.canceled++
			} else {
				c.expired++
			}
			continue
		}
		req, aerr := s.validateItem(b, k)
		if aerr != nil {
			b.outcomes[k] = outInvalid
			c.errored++
			continue
		}
		at := b.procTime(k)
		r := rng{s: s.seed ^ mix64(itemKey(b, k)^saltBatchErr)}
		pool := req.model.pool
		switch {
		case fs.match(FaultBatchErroredAPI, o.idx, pool, b.ks.fp, at, &r) != nil:
			b.outcomes[k] = outFaultAPI
		case fs.match(FaultBatchErroredOverloaded, o.idx, pool, b.ks.fp, at, &r) != nil:
			b.outcomes[k] = outFaultOverload
		case fs.match(FaultBatchErroredInvalid, o.idx, pool, b.ks.fp, at, &r) != nil:
			b.outcomes[k] = outFaultInvalid
		default:
			b.outcomes[k] = outSucceeded
			c.succeeded++
			p := b.params(k)
			sum := sha256.Sum256(p)
			out := plan(sum, req)
			u := batchUsage(req, out)
			cost := req.model.batchCost(u)
			s.recordBatch(o, b.ks, &LedgerEntry{
				RequestID: s.newID("req_", itemKey(b, k), saltBatchReq), MessageID: s.newID("msg_", itemKey(b, k), saltBatchMsg),
				Org: o.name, KeyFingerprint: b.ks.fp, Model: req.model.id, BodySHA256: sum,
				InputTokens: u.input, OutputTokens: u.output, CostNanos: cost, CostUSD: nanosToUSD(cost),
				Time: wall, APISeconds: float64(at.Microseconds()) / 1e6, Status: http.StatusOK, Delivery: DeliveryOK,
				ServiceTier: "batch", BatchID: b.id, CustomID: string(b.cid(k)), USGeo: u.geoUS,
			}, now)
			continue
		}
		c.errored++
	}
	b.counts = c
	b.final = true
}

// settleBatches finalizes (and so bills) every batch that has ended, so
// that the ledger, its totals and Mark count a batch when it ends, not only
// when a client first sees it ended.
func (s *Server) settleBatches() {
	s.oaSettleBatches()
	if s.batches.seq.Load() == 0 {
		return // no batch was ever created
	}
	now := s.apiNow()
	for _, o := range s.orgs {
		ob := s.orgBatches(o)
		ob.mu.Lock()
		list := append([]*simBatch(nil), ob.list...)
		ob.mu.Unlock()
		for _, b := range list {
			b.mu.Lock()
			if now >= b.end {
				s.finalizeBatch(b)
			}
			b.mu.Unlock()
		}
	}
}

// recordBatch is bill without the in-flight bookkeeping of a synchronous
// request: ledger, totals, series, duplicates.
func (s *Server) recordBatch(o *orgState, ks *keyState, e *LedgerEntry, now time.Duration) {
	s.record(o, ks, e, now, false)
}

var (
	tierStandard = []byte(`"service_tier":"standard"`)
	tierBatch    = []byte(`"service_tier":"batch"`)
)

// appendResult appends the JSONL line of request k of a finalized batch.
// A succeeded message is the synchronous one (appendMessage, from the same
// plan of the same bytes) with usage.service_tier "batch". scratch is
// reused for the message and returned.
func (s *Server) appendResult(line, scratch []byte, b *simBatch, k int) ([]byte, []byte) {
	line = append(line, `{"custom_id":"`...)
	line = append(line, b.cid(k)...)
	line = append(line, `","result":{"type":"`...)
	errored := func(e *apiError) []byte {
		line = append(line, `errored","error":`...)
		line = appendError(line, e, s.newID("req_", itemKey(b, k), saltBatchReq))
		return append(line, "}}\n"...)
	}
	switch b.outcomes[k] {
	case outSucceeded:
		req, aerr := s.validateItem(b, k)
		if aerr != nil { // cannot happen: it validated when finalized
			return errored(aerr), scratch
		}
		p := b.params(k)
		out := plan(sha256.Sum256(p), req)
		scratch = appendMessage(scratch[:0], s.newID("msg_", itemKey(b, k), saltBatchMsg), req.model.id, out, batchUsage(req, out))
		line = append(line, `succeeded","message":`...)
		if i := bytes.LastIndex(scratch, tierStandard); i >= 0 {
			line = append(line, scratch[:i]...)
			line = append(line, tierBatch...)
			line = append(line, scratch[i+len(tierStandard):]...)
		} else {
			line = append(line, scratch...)
		}
		return append(line, "}}\n"...), scratch
	case outInvalid:
		_, aerr := s.validateItem(b, k)
		if aerr == nil {
			aerr = invalid("invalid request")
		}
		return errored(aerr), scratch
	case outFaultAPI:
		return errored(&apiError{typ: anthropic.ErrAPI, msg: "Internal server error"}), scratch
	case outFaultOverload:
		return errored(&apiError{typ: anthropic.ErrOverloaded, msg: "Overloaded"}), scratch
	case outFaultInvalid:
		return errored(&apiError{typ: anthropic.ErrInvalidRequest, msg: "The request could not be processed (simulated invalid_request_error)"}), scratch
	case outCanceled:
		return append(line, "canceled\"}}\n"...), scratch
	default:
		return append(line, "expired\"}}\n"...), scratch
	}
}
