package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/apidispatch/apidispatch/store"
)

// Results streams the result lines with rseq > after in rseq order, one row
// at a time from a read transaction, so a million lines use the memory of
// one. fn gets its own copy of each line. fn may call other methods of the
// store; what it sees of commits made meanwhile is not specified.
func (s *Store) Results(ctx context.Context, after int64, fn func(rseq int64, line []byte) error) error {
	if err := s.check(ctx, true); err != nil {
		return err
	}
	rows, err := s.r.QueryContext(ctx, resultsQuery, after)
	if err != nil {
		return fmt.Errorf("sqlite: results after %d: %w", after, err)
	}
	defer rows.Close()
	for rows.Next() {
		var rseq int64
		var line []byte
		if err := rows.Scan(&rseq, &line); err != nil {
			return fmt.Errorf("sqlite: results after %d: %w", after, err)
		}
		if err := fn(rseq, line); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: results after %d: %w", after, err)
	}
	return nil
}

// readTx runs fn in one read transaction, so its queries see one snapshot.
func (s *Store) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return fn(tx)
}

// Aggregate sums the run from one snapshot: counts of items and pending
// items, the totals Commit keeps by (state, org, error_type), the highest
// rseq and the counters. Its cost is the two counts, ~0.1 s at 1M items.
func (s *Store) Aggregate(ctx context.Context) (store.Aggregate, error) {
	if err := s.check(ctx, true); err != nil {
		return store.Aggregate{}, err
	}
	a := store.Aggregate{
		ErroredByType: map[string]int64{},
		ByOrg:         map[string]store.OrgTotals{},
		Counters:      map[string]int64{},
		ByRoute:       map[string]store.OrgTotals{},
	}
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM items), (SELECT count(*) FROM pending),
			(SELECT coalesce(max(rseq), 0) FROM results)`).Scan(&a.N, &a.Pending, &a.Results); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT state, org, error_type, n,
			cost_nanos, input_tok, output_tok, cache_read, cache_write FROM totals`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var state, org, errType string
			var n int64
			var t store.OrgTotals
			if err := rows.Scan(&state, &org, &errType, &n,
				&t.CostNanos, &t.InputTok, &t.OutputTok, &t.CacheRead, &t.CacheWrite); err != nil {
				return err
			}
			switch store.State(state) {
			case store.Succeeded:
				a.Succeeded += n
				t.Succeeded = n
			case store.Errored:
				a.Errored += n
				a.ErroredByType[errType] += n
				t.Errored = n
			}
			a.CostNanos += t.CostNanos
			a.InputTok += t.InputTok
			a.OutputTok += t.OutputTok
			a.CacheRead += t.CacheRead
			a.CacheWrite += t.CacheWrite
			o := a.ByOrg[org]
			o.Succeeded += t.Succeeded
			o.Errored += t.Errored
			o.CostNanos += t.CostNanos
			o.InputTok += t.InputTok
			o.OutputTok += t.OutputTok
			o.CacheRead += t.CacheRead
			o.CacheWrite += t.CacheWrite
			a.ByOrg[org] = o
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rrows, err := tx.QueryContext(ctx, `SELECT route, succeeded, errored, cost_nanos, input_tok, output_tok, cache_read, cache_write FROM route_totals`)
		if err != nil {
			return err
		}
		defer rrows.Close()
		for rrows.Next() {
			var route string
			var t store.OrgTotals
			if err := rrows.Scan(&route, &t.Succeeded, &t.Errored, &t.CostNanos, &t.InputTok, &t.OutputTok, &t.CacheRead, &t.CacheWrite); err != nil {
				return err
			}
			a.ByRoute[route] = t
		}
		if err := rrows.Err(); err != nil {
			return err
		}
		crows, err := tx.QueryContext(ctx, `SELECT name, value FROM counters`)
		if err != nil {
			return err
		}
		defer crows.Close()
		for crows.Next() {
			var name string
			var v int64
			if err := crows.Scan(&name, &v); err != nil {
				return err
			}
			a.Counters[name] = v
		}
		return crows.Err()
	})
	if err != nil {
		return store.Aggregate{}, fmt.Errorf("sqlite: aggregate: %w", err)
	}
	return a, nil
}

// LatencyPercentiles returns, for each q, the nearest-rank latency over
// succeeded items: the k-th smallest with k = ceil(q·n), at least 1 (so q=0
// is the minimum and q=1 the maximum). A q outside [0,1] is an error.
//
// It reads every succeeded latency once, unsorted, into a histogram of
// distinct values (SQLite sorts slowly, and an index would cost every
// Commit): about a second at 1M results, memory in proportion to the
// distinct latencies. It is meant for the end of a run, not for progress.
func (s *Store) LatencyPercentiles(ctx context.Context, qs []float64) ([]int64, error) {
	if err := s.check(ctx, true); err != nil {
		return nil, err
	}
	for _, q := range qs {
		if !(q >= 0 && q <= 1) {
			return nil, fmt.Errorf("sqlite: latency percentiles: quantile %v is outside [0,1]", q)
		}
	}
	hist := map[int64]int64{}
	var n int64
	rows, err := s.r.QueryContext(ctx, latenciesQuery)
	if err != nil {
		return nil, fmt.Errorf("sqlite: latency percentiles: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var ms int64
		if err := rows.Scan(&ms); err != nil {
			return nil, fmt.Errorf("sqlite: latency percentiles: %w", err)
		}
		hist[ms]++
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: latency percentiles: %w", err)
	}
	return percentiles(hist, n, qs), nil
}

// percentiles picks the nearest-rank values for qs from a histogram of n
// values (value -> count); zeros when n is 0.
func percentiles(hist map[int64]int64, n int64, qs []float64) []int64 {
	out := make([]int64, len(qs))
	if n == 0 {
		return out
	}
	values := slices.Sorted(maps.Keys(hist))
	for i, q := range qs {
		k := nearestRank(q, n)
		var seen int64
		for _, v := range values {
			seen += hist[v]
			if seen >= k {
				out[i] = v
				break
			}
		}
	}
	return out
}

// nearestRank is ceil(q·n) clamped to [1, n]. A product within a few ulps of
// an integer counts as that integer, so that 0.95·20 is rank 19, not 20.
func nearestRank(q float64, n int64) int64 {
	x := q * float64(n)
	r := math.Round(x)
	k := int64(math.Ceil(x))
	if math.Abs(x-r) <= 1e-9*math.Max(1, x) {
		k = int64(r)
	}
	return max(1, min(k, n))
}

// Close closes the store's connections; the last one to close checkpoints
// the WAL into the main file. It waits for reads in progress. It is safe to
// call more than once: later calls return what the first returned. Every
// other method returns
// store.ErrClosed after Close.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.wmu.Lock() // let a Commit in progress finish
		defer s.wmu.Unlock()
		s.closeErr = s.closeDBs()
		if s.closeErr != nil {
			s.closeErr = fmt.Errorf("sqlite: close %s: %w", s.path, s.closeErr)
		}
	})
	return s.closeErr
}

func (s *Store) closeDBs() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.pending, s.insertChunk, s.insertOne, s.itemsBetween, s.itemExists, s.insertPendings, s.insertPending, s.unpend, s.insertResults, s.insertResult, s.insertLines, s.insertLine, s.maxRSeq, s.addTotal, s.addCounter} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if s.r != nil && s.r != s.w {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	return errors.Join(errs...)
}
