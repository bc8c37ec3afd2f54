package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

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
	rows, err := s.r.QueryContext(ctx, `SELECT rseq, line FROM results WHERE rseq > ? ORDER BY rseq`, after)
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

// Aggregate sums the run from one snapshot, in one pass over items grouped
// by (state, org, error_type), plus the highest rseq and the counters.
func (s *Store) Aggregate(ctx context.Context) (store.Aggregate, error) {
	if err := s.check(ctx, true); err != nil {
		return store.Aggregate{}, err
	}
	a := store.Aggregate{
		ErroredByType: map[string]int64{},
		ByOrg:         map[string]store.OrgTotals{},
		Counters:      map[string]int64{},
	}
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT state, org, error_type, count(*),
			coalesce(sum(cost_nanos), 0), coalesce(sum(input_tok), 0), coalesce(sum(output_tok), 0),
			coalesce(sum(cache_read), 0), coalesce(sum(cache_write), 0)
			FROM items GROUP BY state, org, error_type`)
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
			a.N += n
			switch store.State(state) {
			case store.Pending:
				a.Pending += n
				continue
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
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(rseq), 0) FROM results`).Scan(&a.Results); err != nil {
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
// is the minimum and q=1 the maximum). Each rank is read from an index on
// latency, within one snapshot. A q outside [0,1] is an error.
func (s *Store) LatencyPercentiles(ctx context.Context, qs []float64) ([]int64, error) {
	if err := s.check(ctx, true); err != nil {
		return nil, err
	}
	for _, q := range qs {
		if !(q >= 0 && q <= 1) {
			return nil, fmt.Errorf("sqlite: latency percentiles: quantile %v is outside [0,1]", q)
		}
	}
	out := make([]int64, len(qs))
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		var n int64
		if err := tx.QueryRowContext(ctx,
			`SELECT count(*) FROM items INDEXED BY items_latency WHERE state = 'succeeded'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		for i, q := range qs {
			k := nearestRank(q, n)
			if err := tx.QueryRowContext(ctx, `SELECT latency_ms FROM items INDEXED BY items_latency
				WHERE state = 'succeeded' ORDER BY latency_ms LIMIT 1 OFFSET ?`, k-1).Scan(&out[i]); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("rank %d of %d vanished", k, n)
				}
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sqlite: latency percentiles: %w", err)
	}
	return out, nil
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
	for _, st := range []*sql.Stmt{s.pending, s.insertChunk, s.insertOne, s.update, s.insertResult, s.maxRSeq, s.addCounter} {
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
