// Package store defines the durable state of a run behind one interface, so
// the engine does not care whether it lives in an embedded SQLite file or a
// shared database, and every implementation passes one conformance suite
// (storetest).
//
// The engine streams the input once into the store (AddItems), then reads
// pending items in input order (Pending) and records terminal outcomes in
// batches (Commit). Every state change is guarded by the expected previous
// state, so committing the same item twice is a no-op, never a duplicate.
package store

import (
	"context"
	"errors"
	"time"
)

// State is an item's durable state. In-flight is not durable: an item that was
// being sent when the process died is pending again on resume.
type State string

// Item states.
const (
	Pending   State = "pending"
	Succeeded State = "succeeded"
	Errored   State = "errored"
)

// Sentinel errors.
var (
	// ErrInputMismatch: the run directory belongs to another input file.
	ErrInputMismatch = errors.New("store: run directory belongs to a different input")
	// ErrNotInitialized: Meta or another read before Init.
	ErrNotInitialized = errors.New("store: not initialized")
	// ErrClosed: a method other than Close was called after Close.
	ErrClosed = errors.New("store: closed")
	// ErrInvalidOutcome: Commit was given an outcome it cannot record (a
	// state other than Succeeded or Errored, a Seq below 1, or a result line
	// that is empty or holds a newline). Nothing of that batch is written.
	ErrInvalidOutcome = errors.New("store: invalid outcome")
	// ErrUnsupportedSchema: the database was written by a newer version of
	// this program (or is not a store at all) and is left untouched.
	ErrUnsupportedSchema = errors.New("store: unsupported schema")
)

// Meta identifies the input a store was created for.
type Meta struct {
	InputPath string    `json:"input_path"`
	InputHash string    `json:"input_hash"` // hex SHA-256 of the whole input file
	N         int64     `json:"n"`          // number of items (lines with a request)
	CreatedAt time.Time `json:"created_at"`
}

// Item is one request of the input, located by its byte range in the input
// file (the body itself is not copied into the store).
type Item struct {
	Seq       int64  // 1-based order of the item in the input
	Line      int64  // 1-based line number in the input file
	CustomID  string //
	Offset    int64  // byte offset of the line in the input file
	Length    int64  // byte length of the line, without the line ending
	Model     string //
	MaxTokens int64  //
	EstInput  int64  // local estimate of input tokens
	// Provider is the API the item is for: "" (Anthropic, the default) or
	// "openai" (org.OpenAI). An item goes only to its provider's orgs.
	Provider string
	// Choices is an OpenAI item's n (0: one). MaxTokens is then its
	// max_completion_tokens (else max_tokens) per choice, 0 when it sets
	// neither.
	Choices int64
}

// Outcome is the terminal result of one item.
type Outcome struct {
	Seq        int64
	State      State  // Succeeded or Errored
	Org        string // org that served it ("" when none did)
	ErrorType  string // error.type for Errored
	Attempts   int64
	LatencyMs  int64
	CostNanos  int64 // cost in nano-dollars (1e-9 USD), exact
	InputTok   int64
	OutputTok  int64
	CacheRead  int64
	CacheWrite int64
	// Route is the API that carried it: RouteSync ("" means sync too) or
	// RouteBatch.
	Route string
	// Line is the complete results.jsonl line for this item, without newline.
	Line []byte
	// Counters are added to the store's named counters in the same
	// transaction, and only when this outcome is taken (its item was
	// pending): a figure about the item (a cache hit, what it saved) is
	// counted once however often its outcome is submitted.
	Counters map[string]int64
}

// Routes an outcome can come by.
const (
	RouteSync  = "sync"
	RouteBatch = "batch"
)

// Batch is what one Commit makes durable in one transaction.
type Batch struct {
	Outcomes []Outcome
	// Counters are added to the store's named counters (attempts, 429s, ...).
	Counters map[string]int64
}

// Committed reports what a Commit did: for each outcome in the batch, in
// order, the result number it was given (1, 2, 3… in commit order across the
// whole run), or 0 when the item was not pending (already terminal: skipped).
type Committed struct {
	RSeq []int64
}

// OrgTotals are per-org sums over terminal items.
type OrgTotals struct {
	Succeeded  int64
	Errored    int64
	CostNanos  int64
	InputTok   int64
	OutputTok  int64
	CacheRead  int64
	CacheWrite int64
}

// Aggregate is the store's view of the whole run. Its maps are never nil.
type Aggregate struct {
	N             int64 // items stored (equals Meta.N once the import is complete)
	Pending       int64
	Succeeded     int64
	Errored       int64
	ErroredByType map[string]int64
	ByOrg         map[string]OrgTotals // terminal items by the org that served them ("" for none)
	CostNanos     int64
	InputTok      int64
	OutputTok     int64
	CacheRead     int64
	CacheWrite    int64
	Results       int64 // highest result number given
	Counters      map[string]int64
	// ByRoute are the terminal items by the route that carried them
	// (RouteSync, RouteBatch).
	ByRoute map[string]OrgTotals
}

// BatchStatus is where a Message Batches batch of a run stands.
type BatchStatus string

// Batch statuses. A batch is recorded as submitting before its create call
// is made, so that a crash or a lost answer leaves a record to reconcile
// with the org's list of batches instead of a batch nobody knows about.
const (
	// BatchSubmitting: the create call may or may not have reached the
	// API; the batch has no id yet.
	BatchSubmitting BatchStatus = "submitting"
	// BatchSubmitted: the API has the batch under ID.
	BatchSubmitted BatchStatus = "submitted"
	// BatchHarvested: its results are committed; its items that did not
	// end are pending again.
	BatchHarvested BatchStatus = "harvested"
	// BatchAbandoned: the create never made a batch (refused, or no batch
	// of the org matches it); its items are free again.
	BatchAbandoned BatchStatus = "abandoned"
)

// Open reports whether a batch in this status still holds its items.
func (s BatchStatus) Open() bool { return s == BatchSubmitting || s == BatchSubmitted }

// BatchRecord is one batch of a run.
type BatchRecord struct {
	Local  int64  // the run's number for it, from 1
	Org    string //
	Status BatchStatus
	ID     string // the API's id (msgbatch_…), once known
	N      int64  // requests
	Bytes  int64  // upper bound of the create body's size
	// WorstNanos is the batch's worst-case cost, reserved against
	// --max-cost until it is harvested.
	WorstNanos int64
	// Prefix is what the custom_ids its requests were sent under begin
	// with: a random string made for this batch alone, followed by each
	// item's Seq, so that its results prove the batch is this record's.
	// Empty for a batch recorded before prefixes (sent under the items'
	// own custom_ids). Set by AddBatch, never changed.
	Prefix string
	// CreatedAt is when the record was made, just before the create call:
	// the start of the window in which reconciliation looks for it.
	CreatedAt   time.Time
	SubmittedAt time.Time // when the id was learned (zero until then)
	EndedAt     time.Time // when it was seen ended
	HarvestedAt time.Time
	// CancelRequested: a cancel was sent for it.
	CancelRequested bool
	// Note says, in words, how it came to its status.
	Note string
	// PartsRead is how many of the batch's results files, in the order its
	// API gives them (an OpenAI batch's output file, then its error file),
	// were read to their end with every result committed: a harvest
	// started again (a resume) does not read them again.
	PartsRead int
	// QueueTokens, for an OpenAI batch that failed for its model's
	// enqueued-token limit, is what the route learnt of that limit on its
	// org: the most enqueued tokens of the model it places there from then
	// on, resumes included (0: nothing learnt).
	QueueTokens int64
}

// BatchItem is an item of a batch, with the number of batches (this one
// included) it has been in.
type BatchItem struct {
	Item
	Batches int64
}

// EachPending calls fn for every pending item of st, by Seq, a page at a
// time, until fn returns false.
func EachPending(ctx context.Context, st Store, fn func(Item) bool) error {
	var after int64
	for {
		its, err := st.Pending(ctx, after, 4096)
		if err != nil || len(its) == 0 {
			return err
		}
		for _, it := range its {
			if !fn(it) {
				return nil
			}
		}
		after = its[len(its)-1].Seq
	}
}

// ErrItemBusy: AddBatch was given an item that is not pending or is in
// another open batch. Nothing was recorded.
var ErrItemBusy = errors.New("store: item is not pending or already in an open batch")

// Store is the durable state of one run. Implementations are safe for
// concurrent use; the engine calls Commit from a single goroutine.
type Store interface {
	// Init creates the store for meta, or opens an existing one. existing
	// reports whether the store already held this input; a store made for
	// another input hash returns ErrInputMismatch and is left untouched.
	// For an existing store the Meta recorded first is kept (a moved input
	// file keeps its original InputPath). Every other method except Close
	// returns ErrNotInitialized until some Init has recorded a Meta.
	Init(ctx context.Context, meta Meta) (existing bool, err error)
	// Meta returns what Init recorded.
	Meta(ctx context.Context) (Meta, error)
	// AddItems inserts items; an item whose Seq exists already is ignored.
	AddItems(ctx context.Context, items []Item) error
	// SetImported marks the import of all N items complete; Imported reports it.
	SetImported(ctx context.Context) error
	Imported(ctx context.Context) (bool, error)
	// Pending returns up to limit pending items with Seq > after, by Seq.
	Pending(ctx context.Context, after int64, limit int) ([]Item, error)
	// Commit makes a batch durable in one transaction. Each outcome moves its
	// item from Pending to its State only if it is still pending; an outcome
	// for an item that is terminal already, unknown, or repeated within the
	// batch is skipped (RSeq 0). When Commit returns an error nothing of the
	// batch was written, its counters included: the caller still owns every
	// outcome. A cancelled ctx aborts the batch, so a final flush at shutdown
	// should pass context.WithoutCancel(ctx).
	Commit(ctx context.Context, b Batch) (Committed, error)
	// Results calls fn for every stored result line with result number > after,
	// in result-number order, streaming (memory does not grow with the number
	// of results). fn owns line. An error from fn stops the walk and is
	// returned unchanged.
	Results(ctx context.Context, after int64, fn func(rseq int64, line []byte) error) error
	// Aggregate sums the run.
	Aggregate(ctx context.Context) (Aggregate, error)
	// LatencyPercentiles returns the latency (ms) at each quantile q in [0,1]
	// over succeeded items that were sent (Attempts > 0: an item answered
	// from the result cache has no latency of its own), nearest rank;
	// zeros when there are none.
	LatencyPercentiles(ctx context.Context, qs []float64) ([]int64, error)
	// AddBatch records a new batch in status BatchSubmitting with its
	// items, in one transaction, and returns its Local number. Every seq
	// must be pending and in no open batch (else ErrItemBusy, nothing
	// recorded).
	AddBatch(ctx context.Context, b BatchRecord, seqs []int64) (local int64, err error)
	// UpdateBatch stores b (found by b.Local): status, id, times, note,
	// parts read and queue tokens.
	// A batch leaves an open status only forward: an update of a harvested
	// or abandoned batch to another status is an error. A non-empty ID
	// already held by another batch of the run is an error.
	UpdateBatch(ctx context.Context, b BatchRecord) error
	// Batches returns every batch of the run, by Local.
	Batches(ctx context.Context) ([]BatchRecord, error)
	// BatchItems returns the items of batch local, by Seq.
	BatchItems(ctx context.Context, local int64) ([]BatchItem, error)
	// Close releases the store. It is safe to call more than once.
	Close() error
}
