package sim

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The Message Batches API (docs/design.md §19), per org. A batch keeps the
// raw bytes of its create body and, per request, where its custom_id and
// params lie in them (16 bytes a request); nothing is parsed until the batch
// ends. Its schedule is fixed at creation: the org's batches are processed
// one after another (FIFO) at the org's throughput after a queue wait, all
// in API time, so a bigger batch takes longer and the speed factor K
// compresses it like every other wait. When a batch is first seen ended its
// requests are validated, their outcomes fixed and the succeeded ones billed
// (at the batch price); results are generated from the params when read.

// Limits of the Message Batches API.
const (
	MaxBatchRequests  = 100_000   // requests per batch
	MaxBatchBodyBytes = 256 << 20 // bytes per create body; larger is 413
	batchExpiry       = 24 * time.Hour
)

// DefaultBatchRetention is how long after its creation a batch's results
// can be downloaded (docs/design.md §19: 29 days); then the batch is
// archived (archived_at is set; the object is still served) and its
// results answer 404 not_found_error.
const DefaultBatchRetention = 29 * 24 * time.Hour

// Default BatchLimits: the Start tier of docs/design.md §14 "Other pools";
// a queue wait and throughput (never measured, docs/design.md §24) at which a
// 500-request batch takes about 4.3 min (the origin saw "~5 min") and a
// 100,000-request one 54 min ("most batches finish within 1 h").
const (
	DefaultBatchRPM       = 1000
	DefaultBatchQueue     = 200_000
	DefaultBatchPerMinute = 2000
	DefaultBatchQueueWait = 4 * time.Minute
	DefaultBatchCancel    = 5 * time.Second
)

// BatchLimits are one org's Message Batches limits and processing model, in
// API units. A zero field takes its default (the Default* constants).
type BatchLimits struct {
	// RPM is the requests per minute over all batch endpoints together.
	RPM int64 `json:"rpm,omitempty"`
	// Queue is the most requests the org may have in the processing queue
	// (created, not yet processed); a create beyond it is a 429.
	Queue int64 `json:"queue,omitempty"`
	// PerMinute is how many batch requests the org's batches process per
	// API minute (one batch after another).
	PerMinute int64 `json:"per_minute,omitempty"`
	// QueueWaitS is the API seconds between a create and the start of its
	// processing (when nothing is ahead of it).
	QueueWaitS float64 `json:"queue_wait_s,omitempty"`
	// CancelS is how long (API seconds) a batch stays canceling.
	CancelS float64 `json:"cancel_s,omitempty"`
	// RetentionS is how long (API seconds) after its creation a batch's
	// results can be downloaded (default 29 days, the API's); shorter
	// only to test what a client does with an archived batch.
	RetentionS float64 `json:"retention_s,omitempty"`
}

func (l BatchLimits) check() error {
	if l.RPM < 0 || l.Queue < 0 || l.PerMinute < 0 || !(l.QueueWaitS >= 0) || !(l.CancelS >= 0) || !(l.RetentionS >= 0) ||
		math.IsInf(l.QueueWaitS, 0) || math.IsInf(l.CancelS, 0) || math.IsInf(l.RetentionS, 0) {
		return fmt.Errorf("limits must not be negative")
	}
	return nil
}

func (l BatchLimits) withDefaults() BatchLimits {
	if l.RPM == 0 {
		l.RPM = DefaultBatchRPM
	}
	if l.Queue == 0 {
		l.Queue = DefaultBatchQueue
	}
	if l.PerMinute == 0 {
		l.PerMinute = DefaultBatchPerMinute
	}
	if l.QueueWaitS == 0 {
		l.QueueWaitS = DefaultBatchQueueWait.Seconds()
	}
	if l.CancelS == 0 {
		l.CancelS = DefaultBatchCancel.Seconds()
	}
	if l.RetentionS == 0 {
		l.RetentionS = DefaultBatchRetention.Seconds()
	}
	return l
}

// span is where a value lies in a batch's arena.
type span struct{ off, end uint32 }

// batchItem is one request of a batch: its custom_id (without quotes) and
// its params object, as spans of the arena.
type batchItem struct{ cid, params span }

// outcome is a request's result once its batch has ended.
type outcome uint8

const (
	outPending outcome = iota
	outSucceeded
	outInvalid       // params failed validation (message from re-validating)
	outFaultAPI      // batch_errored_api
	outFaultOverload // batch_errored_overloaded
	outFaultInvalid  // batch_errored_invalid
	outCanceled
	outExpired
)

// batchCounts are request_counts.
type batchCounts struct {
	processing, succeeded, errored, canceled, expired int64
}

// simBatch is one batch. Fields above mu are fixed at creation.
type simBatch struct {
	id      string
	seq     uint64 // creation order, server-wide, from 1
	ks      *keyState
	beta    bool // anthropic-beta context-1m at create
	arena   []byte
	items   []batchItem
	created time.Duration // API time
	wall0   time.Time     // wall time of created; other times are offsets from it
	start   time.Duration // API time processing starts
	rate    float64       // requests per API second
	stallAt int           // requests processed before a stall; len(items) without one
	expires time.Duration // created + 24 h
	archive time.Duration // created + the org's retention: results gone from then
	hidden  time.Duration // invisible until this API time (batch_not_found)
	cancelD time.Duration // how long canceling lasts

	mu       sync.Mutex
	cancelAt time.Duration // API time cancel was initiated; -1 if never
	end      time.Duration // API time it ends: finished, expired or canceled
	final    bool          // outcomes fixed and billed
	outcomes []outcome
	counts   batchCounts
}

// procTime is the API time request k (in processing order) is processed.
func (b *simBatch) procTime(k int) time.Duration {
	return b.start + time.Duration(float64(k+1)/b.rate*float64(time.Second))
}

// processedAt is how many requests have been processed by API time t.
func (b *simBatch) processedAt(t time.Duration) int {
	if t < b.start {
		return 0
	}
	p := int(math.Floor((t - b.start).Seconds() * b.rate))
	p = min(max(p, 0), b.stallAt)
	for p < b.stallAt && b.procTime(p) <= t {
		p++
	}
	for p > 0 && b.procTime(p-1) > t {
		p--
	}
	return p
}

// naturalEnd is when the batch ends without a cancel: after its last
// request, or at expiry if that comes first (or it stalls).
func (b *simBatch) naturalEnd() time.Duration {
	if b.stallAt < len(b.items) {
		return b.expires
	}
	return min(b.procTime(len(b.items)-1), b.expires)
}

func (b *simBatch) cid(k int) []byte {
	s := b.items[k].cid
	return b.arena[s.off:s.end]
}

func (b *simBatch) params(k int) []byte {
	s := b.items[k].params
	return b.arena[s.off:s.end]
}

// orgBatches is one org's batches. Lock order: orgBatches.mu, then
// simBatch.mu.
type orgBatches struct {
	lim BatchLimits
	rpm *poolLimiter // nil when Config.Unlimited

	mu        sync.Mutex
	list      []*simBatch // creation order; deleted ones removed
	byID      map[string]*simBatch
	seqOf     map[string]uint64 // every id ever created, for list cursors
	busyUntil time.Duration     // API time the org's last batch ends
	created   int64             // batches created
	requests  int64             // requests in the batches created
	refused   int64             // creates refused by the queue cap
	maxQueued int64             // most requests queued, just after a create

	// Calls to the batch endpoints, admitted or refused: how many, the
	// API times of those of the last API minute, the most there ever were
	// in one API minute, and how many the RPM refused (429).
	calls, callsMax, callsLimited int64
	callsWindow                   []time.Duration
}

// countCall records a call to a batch endpoint at API time now. ob.mu is
// held.
func (ob *orgBatches) countCall(now time.Duration, limited bool) {
	ob.calls++
	if limited {
		ob.callsLimited++
	}
	i := 0
	for i < len(ob.callsWindow) && ob.callsWindow[i] <= now-time.Minute {
		i++
	}
	ob.callsWindow = append(ob.callsWindow[i:], now)
	ob.callsMax = max(ob.callsMax, int64(len(ob.callsWindow)))
}

// BatchStats is one org's Message Batches activity.
type BatchStats struct {
	Created      int64 `json:"created"`       // batches created (lost answers included)
	Requests     int64 `json:"requests"`      // requests in the batches created
	QueueRefused int64 `json:"queue_refused"` // creates refused (429) by the queue cap
	InProgress   int   `json:"in_progress"`   // batches not ended now
	Queued       int64 `json:"queued"`        // requests in the processing queue now
	MaxQueued    int64 `json:"max_queued"`    // most requests ever queued (checked at each create)
	QueueCap     int64 `json:"queue_cap"`
	// Calls counts the requests to every batch endpoint (create,
	// retrieve, list, results, cancel, delete), those the RPM refused
	// included; MaxCallsPerMinute is the most of them in any one API
	// minute (a sliding window), RPM the org's limit, RateLimited those
	// it refused with 429.
	Calls             int64 `json:"calls"`
	MaxCallsPerMinute int64 `json:"max_calls_per_minute"`
	RPM               int64 `json:"rpm"`
	RateLimited       int64 `json:"rate_limited"`
}

// BatchStats returns every org's batch activity by org name, for tests of
// a dispatcher's in-flight window (MaxQueued against QueueCap).
func (s *Server) BatchStats() map[string]BatchStats {
	now := s.apiNow()
	out := make(map[string]BatchStats, len(s.orgs))
	for _, o := range s.orgs {
		ob := s.orgBatches(o)
		ob.mu.Lock()
		st := BatchStats{Created: ob.created, Requests: ob.requests, QueueRefused: ob.refused, Queued: ob.queuedLocked(now), MaxQueued: ob.maxQueued, QueueCap: ob.lim.Queue,
			Calls: ob.calls, MaxCallsPerMinute: ob.callsMax, RPM: ob.lim.RPM, RateLimited: ob.callsLimited}
		for _, b := range ob.list {
			b.mu.Lock()
			if now < b.end {
				st.InProgress++
			}
			b.mu.Unlock()
		}
		ob.mu.Unlock()
		out[o.name] = st
	}
	return out
}

// queuedLocked is how many of the org's requests are in the processing
// queue at API time now: created, not processed, batch not ended.
func (ob *orgBatches) queuedLocked(now time.Duration) int64 {
	var q int64
	for _, b := range ob.list {
		b.mu.Lock()
		if now < b.end {
			q += int64(len(b.items) - b.processedAt(now))
		}
		b.mu.Unlock()
	}
	return q
}

// batchStore holds every org's batches; its zero value is ready and it
// builds the per-org state on first use.
type batchStore struct {
	once sync.Once
	orgs []*orgBatches
	seq  atomic.Uint64
}

func (s *Server) orgBatches(o *orgState) *orgBatches {
	s.batches.once.Do(func() {
		for _, oc := range s.cfg.Orgs {
			lim := oc.Batch.withDefaults()
			ob := &orgBatches{lim: lim, byID: map[string]*simBatch{}, seqOf: map[string]uint64{}}
			if !s.cfg.Unlimited {
				ob.rpm = newPoolLimiter(Limits{RPM: lim.RPM}, s.cfg.BurstFraction, s.speed)
			}
			s.batches.orgs = append(s.batches.orgs, ob)
		}
	})
	return s.batches.orgs[o.idx]
}

const batchTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// appendBatch appends the message_batch object of b at API time now. b.mu
// is held, and b is finalized when ended.
func (s *Server) appendBatch(buf []byte, b *simBatch, now time.Duration, host string) []byte {
	ended := now >= b.end
	status := "in_progress"
	switch {
	case ended:
		status = "ended"
	case b.cancelAt >= 0:
		status = "canceling"
	}
	ts := func(buf []byte, t time.Duration) []byte {
		buf = append(buf, '"')
		// Offsets from the creation's wall time, so that expires_at is
		// exactly created_at + 24 h/K.
		buf = b.wall0.Add(s.real(t-b.created)).UTC().AppendFormat(buf, batchTimeLayout)
		return append(buf, '"')
	}
	buf = append(buf, `{"id":`...)
	buf = appendJSONString(buf, b.id)
	buf = append(buf, `,"type":"message_batch","processing_status":"`...)
	buf = append(buf, status...)
	c := batchCounts{processing: int64(len(b.items))}
	if ended {
		c = b.counts
	}
	buf = append(buf, `","request_counts":{"processing":`...)
	buf = appendInt(buf, c.processing)
	buf = append(buf, `,"succeeded":`...)
	buf = appendInt(buf, c.succeeded)
	buf = append(buf, `,"errored":`...)
	buf = appendInt(buf, c.errored)
	buf = append(buf, `,"canceled":`...)
	buf = appendInt(buf, c.canceled)
	buf = append(buf, `,"expired":`...)
	buf = appendInt(buf, c.expired)
	buf = append(buf, `},"ended_at":`...)
	if ended {
		buf = ts(buf, b.end)
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"created_at":`...)
	buf = ts(buf, b.created)
	buf = append(buf, `,"expires_at":`...)
	buf = ts(buf, b.expires)
	buf = append(buf, `,"archived_at":`...)
	if now >= b.archive {
		buf = ts(buf, b.archive)
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"cancel_initiated_at":`...)
	if b.cancelAt >= 0 {
		buf = ts(buf, b.cancelAt)
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"results_url":`...)
	if ended {
		buf = appendJSONString(buf, "http://"+host+"/v1/messages/batches/"+b.id+"/results")
	} else {
		buf = append(buf, "null"...)
	}
	return append(buf, '}')
}

func appendInt(b []byte, v int64) []byte { return strconv.AppendInt(b, v, 10) }
