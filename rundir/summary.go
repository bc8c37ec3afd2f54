package rundir

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"slices"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/store"
)

// DataLoss is the check that every input ended as exactly one outcome or is
// still pending, and that no retryable cause was written down as an error.
type DataLoss struct {
	Inputs                  int64 `json:"inputs"`
	Outcomes                int64 `json:"outcomes"`
	Unfinished              int64 `json:"unfinished"`
	Missing                 int64 `json:"missing"`
	Duplicates              int64 `json:"duplicates"`
	RetryableMarkedTerminal int64 `json:"retryable_marked_terminal"`
	Passed                  bool  `json:"passed"`
}

// CostUSD is spend from usage.
type CostUSD struct {
	Total      float64            `json:"total"`
	TotalNanos int64              `json:"total_nanos"`
	ByOrg      map[string]float64 `json:"by_org"`
}

// Tokens are usage sums.
type Tokens struct {
	Input      int64 `json:"input"`
	Output     int64 `json:"output"`
	CacheRead  int64 `json:"cache_read"`
	CacheWrite int64 `json:"cache_write"`
}

// Latency percentiles in milliseconds.
type Latency struct {
	P50 int64 `json:"p50"`
	P95 int64 `json:"p95"`
	P99 int64 `json:"p99"`
}

// OrgSplit is one org's share of the run.
type OrgSplit struct {
	Succeeded int64   `json:"succeeded"`
	Errored   int64   `json:"errored"`
	CostUSD   float64 `json:"cost_usd"`
	Key       string  `json:"key_fingerprint"`
	// Attempts, RateLimited429 and Rate429 (their ratio) are this
	// invocation's attempts on the org and the 429s among them: a
	// contended org shows at once.
	Attempts       int64   `json:"attempts"`
	RateLimited429 int64   `json:"rate_limited_429"`
	Rate429        float64 `json:"rate_429"`
}

// Summary is summary.json (docs/design.md §3).
type Summary struct {
	N              int64            `json:"n"`
	Succeeded      int64            `json:"succeeded"`
	Errored        int64            `json:"errored"`
	ErroredByType  map[string]int64 `json:"errored_by_type"`
	Unfinished     int64            `json:"unfinished"`
	DataLoss       DataLoss         `json:"data_loss"`
	Cost           CostUSD          `json:"cost_usd"`
	Tokens         Tokens           `json:"tokens"`
	Attempts       int64            `json:"attempts"`
	RateLimited429 int64            `json:"rate_limited_429"`
	Overloaded529  int64            `json:"overloaded_529"`
	OtherRetries   int64            `json:"other_retries"`
	// PossibleDuplicateBilling counts attempts that the API may have billed
	// without their result being recorded, each of which was sent again
	// and can be billed a second time: a connection lost after the request
	// went out, a body cut short, and — found in the attempt journal of a
	// process that died — requests in flight at the crash and successes
	// received but not yet durable. It is an upper bound: the API's count
	// of requests billed twice is never higher, and equals it when the API
	// bills every request it received.
	PossibleDuplicateBilling int64               `json:"possible_duplicate_billing"`
	LatencyMs                Latency             `json:"latency_ms"`
	RequestsPerMin           float64             `json:"requests_per_min"`
	APIRequestsPerMin        float64             `json:"api_requests_per_min"`
	CompletedThisRun         int64               `json:"completed_this_run"`
	WallS                    float64             `json:"wall_s"`
	Speed                    float64             `json:"speed_factor"`
	APIEquivalentWallS       float64             `json:"api_equivalent_wall_s"`
	ByOrg                    map[string]OrgSplit `json:"by_org"`
	Lanes                    []gate.LaneSnapshot `json:"lanes"`
	StopReason               string              `json:"stop_reason,omitempty"`
	Projection               json.RawMessage     `json:"projection,omitempty"`
	Extra                    map[string]any      `json:"extra,omitempty"`
	// Shared describes the shared budget (--shared): Redis' host, the
	// processes seen on the same keys, the periods run on a local share.
	Shared any                 `json:"shared,omitempty"`
	Orgs   []map[string]string `json:"orgs"`
	// Cache is present when the run had a result cache.
	Cache *CacheSummary `json:"cache,omitempty"`
	// ByRoute is what each route carried (docs/design.md §12): "sync",
	// "batch", and "cache" for items the result cache answered.
	ByRoute map[string]*RouteSplit `json:"by_route"`
	// Route is the route the run was asked for (sync, batch or auto).
	Route string `json:"route,omitempty"`
	// Router is the auto route's decision, with its arithmetic.
	Router any `json:"router,omitempty"`
	// Batches are the batch route's batches (batch and auto).
	Batches *BatchesSummary `json:"batches,omitempty"`
}

// RouteSplit is one route's share of a run: items ended by it, their cost,
// and the wall-clock the route was active in this invocation.
type RouteSplit struct {
	Items     int64   `json:"items"`
	Succeeded int64   `json:"succeeded"`
	Errored   int64   `json:"errored"`
	CostUSD   float64 `json:"cost_usd"`
	CostNanos int64   `json:"cost_nanos"`
	// SyncPriceUSD, for the batch route, is what its results would have
	// cost at the standard (sync) price: the saving is the difference.
	SyncPriceUSD float64 `json:"sync_price_usd,omitempty"`
	WallS        float64 `json:"wall_s"`
}

// BatchesSummary counts the batch route's batches over the run directory.
type BatchesSummary struct {
	Created   int64 `json:"created"`
	Adopted   int64 `json:"adopted"`
	Requests  int64 `json:"requests"`
	Retried   int64 `json:"retried"`
	Open      int   `json:"open"`
	Harvested int   `json:"harvested"`
	Abandoned int   `json:"abandoned"`
}

// SummaryInput is what BuildSummary sums: a run's store and results file,
// and what the caller knows of this invocation.
type SummaryInput struct {
	Store       store.Store
	ResultsPath string
	Orgs        []org.Org
	// Start is when this invocation began; DoneStart how many items were
	// terminal then.
	Start      time.Time
	DoneStart  int64
	Speed      float64
	Lanes      []gate.LaneSnapshot
	StopReason string
}

// BuildSummary sums a run from its store and checks its results file (the
// data-loss check). It returns the store's aggregate too.
func BuildSummary(ctx context.Context, in SummaryInput) (*Summary, store.Aggregate, error) {
	st := in.Store
	agg, err := st.Aggregate(ctx)
	if err != nil {
		return nil, agg, fmt.Errorf("summarising: %w", err)
	}
	lat, err := st.LatencyPercentiles(ctx, []float64{0.5, 0.95, 0.99})
	if err != nil {
		return nil, agg, fmt.Errorf("summarising latencies: %w", err)
	}
	speed := cmp.Or(in.Speed, 1)
	wall := time.Since(in.Start).Seconds()
	s := &Summary{
		N: agg.N, Succeeded: agg.Succeeded, Errored: agg.Errored, ErroredByType: agg.ErroredByType,
		Unfinished: agg.Pending,
		Cost:       CostUSD{Total: cost.Nanos(agg.CostNanos).USD(), TotalNanos: agg.CostNanos, ByOrg: map[string]float64{}},
		Tokens:     Tokens{agg.InputTok, agg.OutputTok, agg.CacheRead, agg.CacheWrite},
		Attempts:   agg.Counters[CounterAttempts], RateLimited429: agg.Counters[CounterRateLimited],
		Overloaded529: agg.Counters[CounterOverloaded], OtherRetries: agg.Counters[CounterOtherRetries],
		PossibleDuplicateBilling: agg.Counters[CounterMaybeBilled],
		LatencyMs:                Latency{lat[0], lat[1], lat[2]}, WallS: wall, Speed: speed,
		APIEquivalentWallS: wall * speed, ByOrg: map[string]OrgSplit{}, StopReason: in.StopReason,
		Lanes: in.Lanes,
	}
	if s.ErroredByType == nil {
		s.ErroredByType = map[string]int64{}
	}
	s.CompletedThisRun = agg.Succeeded + agg.Errored - in.DoneStart
	if wall > 0 {
		s.RequestsPerMin = float64(s.CompletedThisRun) / wall * 60
		s.APIRequestsPerMin = s.RequestsPerMin / speed
	}
	keys := map[string]string{}
	for _, o := range in.Orgs {
		keys[o.Name] = o.Key.Fingerprint()
		s.Orgs = append(s.Orgs, map[string]string{"org": o.Name, "key_fingerprint": o.Key.Fingerprint()})
	}
	for name, t := range agg.ByOrg {
		if name == "" {
			continue
		}
		s.Cost.ByOrg[name] = cost.Nanos(t.CostNanos).USD()
		s.ByOrg[name] = OrgSplit{Succeeded: t.Succeeded, Errored: t.Errored, CostUSD: cost.Nanos(t.CostNanos).USD(), Key: keys[name]}
	}
	for _, l := range in.Lanes {
		if l.Attempts == 0 {
			continue
		}
		o := s.ByOrg[l.Org]
		if o.Key == "" {
			o.Key = keys[l.Org]
		}
		o.Attempts += l.Attempts
		o.RateLimited429 += l.RateLimited429
		o.Rate429 = float64(o.RateLimited429) / float64(o.Attempts)
		s.ByOrg[l.Org] = o
	}
	s.ByRoute = map[string]*RouteSplit{}
	for name, t := range agg.ByRoute {
		s.ByRoute[name] = &RouteSplit{Items: t.Succeeded + t.Errored, Succeeded: t.Succeeded, Errored: t.Errored,
			CostUSD: cost.Nanos(t.CostNanos).USD(), CostNanos: t.CostNanos}
	}
	if b := s.ByRoute[store.RouteBatch]; b != nil {
		b.SyncPriceUSD = cost.Nanos(agg.Counters[CounterBatchSyncPriceNanos]).USD()
	}
	dl, err := CheckResults(in.ResultsPath, agg)
	if err != nil {
		return nil, agg, err
	}
	s.DataLoss = dl
	return s, agg, nil
}

// CheckResults reads results.jsonl and checks it against the store's
// aggregate: one line per terminal item, no custom_id twice, nothing missing,
// no retryable cause marked terminal. Memory is eight bytes per line.
func CheckResults(path string, agg store.Aggregate) (DataLoss, error) {
	dl := DataLoss{Inputs: agg.N, Unfinished: agg.Pending}
	for t, n := range agg.ErroredByType {
		if anthropic.IsRetryableType(t) {
			dl.RetryableMarkedTerminal += n
		}
	}
	// Eight bytes per line, sorted: a third of what a hash set takes.
	seed := maphash.MakeSeed()
	hashes := make([]uint64, 0, agg.Succeeded+agg.Errored)
	err := eachResultID(path, func(id []byte) {
		dl.Outcomes++
		hashes = append(hashes, maphash.Bytes(seed, id))
	})
	if err != nil {
		return dl, err
	}
	slices.Sort(hashes)
	var collided []uint64
	for i := 1; i < len(hashes); i++ {
		if hashes[i] == hashes[i-1] && (len(collided) == 0 || collided[len(collided)-1] != hashes[i]) {
			collided = append(collided, hashes[i])
		}
	}
	hashes = nil
	if len(collided) > 0 {
		// Tell true duplicates from hash collisions with the exact ids.
		want := map[uint64]bool{}
		for _, h := range collided {
			want[h] = true
		}
		exact := map[string]int{}
		if err := eachResultID(path, func(id []byte) {
			if want[maphash.Bytes(seed, id)] {
				exact[string(id)]++
			}
		}); err != nil {
			return dl, err
		}
		for _, n := range exact {
			dl.Duplicates += int64(n - 1)
		}
	}
	unique := dl.Outcomes - dl.Duplicates
	terminal := agg.Succeeded + agg.Errored
	dl.Missing = max(0, agg.N-terminal-agg.Pending) + max(0, terminal-unique)
	dl.Passed = dl.Missing == 0 && dl.Duplicates == 0 && dl.RetryableMarkedTerminal == 0 && unique == terminal
	return dl, nil
}

var idPrefix = []byte(`{"custom_id":"`)

// eachResultID calls fn with the custom_id of every line of a results file.
func eachResultID(path string, fn func(id []byte)) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	lineNo := 0
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: read the rest of it.
			rest := slices.Clone(line)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.ReadSlice('\n')
				rest = append(rest, line...)
			}
			line = rest
		}
		if len(line) > 0 {
			lineNo++
			id, ok := fastID(line)
			if !ok {
				var v struct {
					CustomID string `json:"custom_id"`
				}
				if jerr := json.Unmarshal(line, &v); jerr != nil {
					return fmt.Errorf("%s line %d: %w", path, lineNo, jerr)
				}
				id = []byte(v.CustomID)
			}
			fn(id)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// fastID reads the custom_id of a line this package wrote (ids are
// [a-zA-Z0-9_-], so no escapes).
func fastID(line []byte) ([]byte, bool) {
	if !bytes.HasPrefix(line, idPrefix) {
		return nil, false
	}
	rest := line[len(idPrefix):]
	i := bytes.IndexByte(rest, '"')
	if i <= 0 || i > 64 || bytes.IndexByte(rest[:i], '\\') >= 0 {
		return nil, false
	}
	return rest[:i], true
}

// CacheSummary is the summary's "cache" object.
type CacheSummary struct {
	Mode string `json:"mode"`
	// Hits are items answered without being sent: from the cache file, or
	// by a duplicate of theirs inside the input (InputDuplicates of them).
	Hits            int64 `json:"hits"`
	InputDuplicates int64 `json:"input_duplicates"`
	// Misses are items that ended by being sent (succeeded or errored).
	Misses   int64   `json:"misses"`
	SavedUSD float64 `json:"saved_usd"`
	// Damaged counts entries found but refused (checksum), each a miss.
	Damaged int64 `json:"damaged,omitempty"`
	// WriteFailed counts successes of this run directory (over all its
	// passes) whose cache entry could not be written, though their result
	// was kept: the cache misses them, and a later run sends them again.
	WriteFailed int64 `json:"write_failed,omitempty"`
	// Origin is the API this run asks (cache.OriginOf its base URL): only
	// answers it gave are hits. OtherOrigin counts the items whose request
	// the cache holds only with another origin's answer (a simulator's,
	// another host's, or one stored before origins were recorded), each
	// a miss.
	Origin      string `json:"origin"`
	OtherOrigin int64  `json:"other_origin,omitempty"`
}
