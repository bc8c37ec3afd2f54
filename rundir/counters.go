package rundir

import (
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
)

// The names of the counters a run keeps in its store, beside its outcomes:
// every route and engine of a run adds to them, the summary reads them, and
// a resume goes on from them.

// Counter names kept in the store.
const (
	CounterAttempts     = "attempts"
	CounterRateLimited  = "rate_limited_429"
	CounterOverloaded   = "overloaded_529"
	CounterOtherRetries = "other_retries"
	CounterMaybeBilled  = "possible_duplicate_billing"
	// CounterMaybeBilledNanos is the worst case, in nano-USD, of the
	// requests counted in CounterMaybeBilled under --max-cost: what the API
	// may have billed that no usage says. A resume's spend gate counts it
	// as spent (SpentBefore), as the run that saw them counted it held.
	CounterMaybeBilledNanos = "possible_duplicate_billing_nanos"
)

// Store counters of the cache, so a resumed run counts its earlier hits.
const (
	CounterCacheHits       = "cache_hits"        // items answered without a request of their own
	CounterCacheSavedNanos = "cache_saved_nanos" // what those requests cost when they were sent
	CounterCacheDuplicates = "cache_duplicates"  // hits that were duplicates inside this input
	// CounterCacheWriteFailed counts successes whose result was kept
	// while their cache entry could not be written (a full disk): the
	// cache misses them, so a later run sends them again.
	CounterCacheWriteFailed = "cache_write_failed"
)

// Store counters of the batch route.
const (
	CounterBatches       = "batches_created"
	CounterBatchRequests = "batch_requests"
	CounterBatchRetried  = "batch_retried"
	CounterBatchAdopted  = "batches_adopted"
	// CounterBatchArchived counts batches whose results were past
	// retention when the route came to read them.
	CounterBatchArchived = "batches_archived"
	// CounterBatchSyncPriceNanos is what the batch route's results would
	// have cost at the standard (sync) price: the summary shows the saving.
	CounterBatchSyncPriceNanos = "batch_sync_price_nanos"
)

// SpentBefore is what a run directory counts as spent against --max-cost
// when a process starts on it: the usage of what it recorded, and the
// worst case of what may have been billed without an answer (a connection
// lost after sending, a truncated answer, a request in flight or a
// success not yet recorded when a process died).
func SpentBefore(agg store.Aggregate) cost.Nanos {
	return cost.Nanos(agg.CostNanos + agg.Counters[CounterMaybeBilledNanos])
}
