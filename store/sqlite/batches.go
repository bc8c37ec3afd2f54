package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/store"
)

// seqsPerInsert is how many batch_items rows one INSERT writes.
const seqsPerInsert = 400

// unixNanos is t as stored (0 for the zero time).
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// AddBatch records b as submitting with its items (see store.Store).
func (s *Store) AddBatch(ctx context.Context, b store.BatchRecord, seqs []int64) (int64, error) {
	if err := s.check(ctx, true); err != nil {
		return 0, err
	}
	if len(seqs) == 0 {
		return 0, errors.New("sqlite: add batch: no items")
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: add batch: %w", err)
	}
	defer tx.Rollback()
	var local int64
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(local), 0) + 1 FROM batches`).Scan(&local); err != nil {
		return 0, fmt.Errorf("sqlite: add batch: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO batches (local, org, status, batch_id, n, bytes, worst_nanos,
		created_at, submitted_at, ended_at, harvested_at, cancel_requested, note, prefix) VALUES (?, ?, 'submitting', '', ?, ?, ?, ?, 0, 0, 0, 0, ?, ?)`,
		local, b.Org, int64(len(seqs)), b.Bytes, b.WorstNanos, unixNanos(b.CreatedAt), b.Note, b.Prefix); err != nil {
		return 0, fmt.Errorf("sqlite: add batch: %w", err)
	}
	row := "(?, ?),"
	full := `INSERT INTO batch_items (batch, seq) VALUES ` + strings.TrimSuffix(strings.Repeat(row, seqsPerInsert), ",")
	args := make([]any, 0, 2*seqsPerInsert)
	for from := 0; from < len(seqs); from += seqsPerInsert {
		part := seqs[from:min(from+seqsPerInsert, len(seqs))]
		args = args[:0]
		for _, q := range part {
			args = append(args, local, q)
		}
		q := full
		if len(part) < seqsPerInsert {
			q = `INSERT INTO batch_items (batch, seq) VALUES ` + strings.TrimSuffix(strings.Repeat(row, len(part)), ",")
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return 0, fmt.Errorf("sqlite: add batch: items: %w", err)
		}
	}
	// Every item must be pending and in no other open batch.
	var notPending, busy int64
	if err := tx.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM batch_items bi WHERE bi.batch = ?1 AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.seq = bi.seq)),
		(SELECT count(*) FROM batch_items bi JOIN batch_items o ON o.seq = bi.seq AND o.batch != bi.batch
			JOIN batches ob ON ob.local = o.batch AND ob.status IN ('submitting', 'submitted') WHERE bi.batch = ?1)`,
		local).Scan(&notPending, &busy); err != nil {
		return 0, fmt.Errorf("sqlite: add batch: check items: %w", err)
	}
	if notPending > 0 || busy > 0 {
		return 0, fmt.Errorf("%w: %d not pending, %d in another open batch", store.ErrItemBusy, notPending, busy)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: add batch to %s: %w", s.path, err)
	}
	return local, nil
}

// UpdateBatch stores b's status, id, times, cancel flag, note, parts read
// and queue tokens (its
// prefix is AddBatch's and never changes).
func (s *Store) UpdateBatch(ctx context.Context, b store.BatchRecord) error {
	if err := s.check(ctx, true); err != nil {
		return err
	}
	switch b.Status {
	case store.BatchSubmitting, store.BatchSubmitted, store.BatchHarvested, store.BatchAbandoned:
	default:
		return fmt.Errorf("sqlite: update batch %d: unknown status %q", b.Local, b.Status)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: update batch: %w", err)
	}
	defer tx.Rollback()
	var was string
	err = tx.QueryRowContext(ctx, `SELECT status FROM batches WHERE local = ?`, b.Local).Scan(&was)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite: update batch %d: no such batch", b.Local)
	}
	if err != nil {
		return fmt.Errorf("sqlite: update batch %d: %w", b.Local, err)
	}
	if !store.BatchStatus(was).Open() && was != string(b.Status) {
		return fmt.Errorf("sqlite: update batch %d: it is %s already and cannot become %s", b.Local, was, b.Status)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET status = ?, batch_id = ?, submitted_at = ?, ended_at = ?,
		harvested_at = ?, cancel_requested = ?, note = ?, parts_read = ?, queue_tokens = ? WHERE local = ?`,
		string(b.Status), b.ID, unixNanos(b.SubmittedAt), unixNanos(b.EndedAt), unixNanos(b.HarvestedAt),
		boolInt(b.CancelRequested), b.Note, b.PartsRead, b.QueueTokens, b.Local); err != nil {
		return fmt.Errorf("sqlite: update batch %d (id %s): %w", b.Local, b.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: update batch %d in %s: %w", b.Local, s.path, err)
	}
	return nil
}

// Batches returns every batch of the run, by Local.
func (s *Store) Batches(ctx context.Context) ([]store.BatchRecord, error) {
	if err := s.check(ctx, true); err != nil {
		return nil, err
	}
	return s.batches(ctx)
}

// OpenBatchesOfAnyInput returns the input path the store was made for and
// its open batches, whatever input Init was given (Init not needed): a
// refusal of another input names the batches still running for the first
// (they go on being billed).
func (s *Store) OpenBatchesOfAnyInput(ctx context.Context) (inputPath string, open []store.BatchRecord, err error) {
	if err := s.check(ctx, false); err != nil {
		return "", nil, err
	}
	kv, err := readMeta(ctx, s.r)
	if err != nil {
		return "", nil, fmt.Errorf("sqlite: %w", err)
	}
	all, err := s.batches(ctx)
	if err != nil {
		return "", nil, err
	}
	for _, b := range all {
		if b.Status.Open() {
			open = append(open, b)
		}
	}
	return kv["input_path"], open, nil
}

func (s *Store) batches(ctx context.Context) ([]store.BatchRecord, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT local, org, status, batch_id, n, bytes, worst_nanos, created_at,
		submitted_at, ended_at, harvested_at, cancel_requested, note, prefix, parts_read, queue_tokens FROM batches ORDER BY local`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: batches: %w", err)
	}
	defer rows.Close()
	var out []store.BatchRecord
	for rows.Next() {
		var b store.BatchRecord
		var status string
		var created, submitted, ended, harvested, cancel int64
		if err := rows.Scan(&b.Local, &b.Org, &status, &b.ID, &b.N, &b.Bytes, &b.WorstNanos, &created,
			&submitted, &ended, &harvested, &cancel, &b.Note, &b.Prefix, &b.PartsRead, &b.QueueTokens); err != nil {
			return nil, fmt.Errorf("sqlite: batches: %w", err)
		}
		b.Status = store.BatchStatus(status)
		b.CreatedAt, b.SubmittedAt = fromUnixNanos(created), fromUnixNanos(submitted)
		b.EndedAt, b.HarvestedAt = fromUnixNanos(ended), fromUnixNanos(harvested)
		b.CancelRequested = cancel != 0
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: batches: %w", err)
	}
	return out, nil
}

// BatchItems returns the items of batch local, by Seq, each with the number
// of batches it has been in.
func (s *Store) BatchItems(ctx context.Context, local int64) ([]store.BatchItem, error) {
	if err := s.check(ctx, true); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT i.seq, i.line, i.custom_id, i.byte_offset, i.byte_length, i.model,
		i.max_tokens, i.est_input, i.provider, i.choices, (SELECT count(*) FROM batch_items o WHERE o.seq = i.seq)
		FROM batch_items bi JOIN items i ON i.seq = bi.seq WHERE bi.batch = ? ORDER BY i.seq`, local)
	if err != nil {
		return nil, fmt.Errorf("sqlite: items of batch %d: %w", local, err)
	}
	defer rows.Close()
	var out []store.BatchItem
	for rows.Next() {
		var b store.BatchItem
		it := &b.Item
		if err := rows.Scan(&it.Seq, &it.Line, &it.CustomID, &it.Offset, &it.Length, &it.Model,
			&it.MaxTokens, &it.EstInput, &it.Provider, &it.Choices, &b.Batches); err != nil {
			return nil, fmt.Errorf("sqlite: items of batch %d: %w", local, err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: items of batch %d: %w", local, err)
	}
	return out, nil
}
