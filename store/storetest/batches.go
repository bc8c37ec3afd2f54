package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/store"
)

// testBatches: a batch is recorded with its items; an item is in one open
// batch at most and must be pending; statuses move forward only; ids are
// unique; an item's batch count grows with each batch it is in.
func testBatches(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	ctx := t.Context()
	add(t, s, 1, 1000)
	at := time.Date(2026, 12, 3, 14, 0, 0, 123000, time.UTC)
	seqsA := seqRange(1, 600)
	a, err := s.AddBatch(ctx, store.BatchRecord{Org: "org_a", Bytes: 1 << 20, WorstNanos: 5e9, CreatedAt: at, Note: "n", Prefix: "adtest0001"}, seqsA)
	if err != nil || a != 1 {
		t.Fatalf("AddBatch = %d, %v; want 1, nil", a, err)
	}
	// Overlapping an open batch: refused, nothing recorded.
	if _, err := s.AddBatch(ctx, store.BatchRecord{Org: "org_b", CreatedAt: at}, seqRange(590, 700)); !errors.Is(err, store.ErrItemBusy) {
		t.Fatalf("AddBatch overlapping an open batch: %v; want ErrItemBusy", err)
	}
	// A terminal item: refused.
	commit(t, s, store.Batch{Outcomes: []store.Outcome{ok(900)}})
	if _, err := s.AddBatch(ctx, store.BatchRecord{Org: "org_b", CreatedAt: at}, seqRange(899, 901)); !errors.Is(err, store.ErrItemBusy) {
		t.Fatalf("AddBatch with a terminal item: %v; want ErrItemBusy", err)
	}
	b, err := s.AddBatch(ctx, store.BatchRecord{Org: "org_b", CreatedAt: at}, seqRange(601, 700))
	if err != nil || b != 2 {
		t.Fatalf("second AddBatch = %d, %v; want 2, nil (the refused ones recorded nothing)", b, err)
	}
	bs, err := s.Batches(ctx)
	if err != nil || len(bs) != 2 {
		t.Fatalf("Batches = %d, %v; want 2", len(bs), err)
	}
	if r := bs[0]; r.Local != 1 || r.Org != "org_a" || r.Status != store.BatchSubmitting || r.ID != "" || r.N != 600 ||
		r.Bytes != 1<<20 || r.WorstNanos != 5e9 || !r.CreatedAt.Equal(at) || r.Note != "n" || r.Prefix != "adtest0001" || bs[1].Prefix != "" {
		t.Fatalf("batch 1 = %+v", r)
	}
	sub := bs[0]
	sub.Status, sub.ID, sub.SubmittedAt = store.BatchSubmitted, "msgbatch_1", at.Add(time.Second)
	sub.PartsRead, sub.QueueTokens = 1, 4_000_000
	if err := s.UpdateBatch(ctx, sub); err != nil {
		t.Fatalf("UpdateBatch: %v", err)
	}
	dup := bs[1]
	dup.Status, dup.ID = store.BatchSubmitted, "msgbatch_1"
	if err := s.UpdateBatch(ctx, dup); err == nil {
		t.Fatal("UpdateBatch gave a second batch the same id")
	}
	// Abandoning batch 2 frees its items for a new batch.
	dup.ID, dup.Status = "", store.BatchAbandoned
	if err := s.UpdateBatch(ctx, dup); err != nil {
		t.Fatalf("UpdateBatch abandoned: %v", err)
	}
	dup.Status = store.BatchSubmitted
	if err := s.UpdateBatch(ctx, dup); err == nil {
		t.Fatal("an abandoned batch became submitted again")
	}
	c, err := s.AddBatch(ctx, store.BatchRecord{Org: "org_c", CreatedAt: at}, seqRange(650, 660))
	if err != nil {
		t.Fatalf("AddBatch of an abandoned batch's items: %v", err)
	}
	its, err := s.BatchItems(ctx, c)
	if err != nil || len(its) != 11 {
		t.Fatalf("BatchItems = %d, %v; want 11", len(its), err)
	}
	for i, it := range its {
		want := item(650 + int64(i))
		if it.Item != want || it.Batches != 2 {
			t.Fatalf("BatchItems[%d] = %+v (batches %d); want %+v in 2 batches", i, it.Item, it.Batches, want)
		}
	}
	got, _ := s.Batches(ctx)
	if got[0].Status != store.BatchSubmitted || got[0].ID != "msgbatch_1" || !got[0].SubmittedAt.Equal(at.Add(time.Second)) ||
		got[0].PartsRead != 1 || got[0].QueueTokens != 4_000_000 || got[1].PartsRead != 0 || got[1].QueueTokens != 0 {
		t.Fatalf("batch 1 after update = %+v", got[0])
	}
	check(t, s)
}

// testByRoute: Aggregate sums terminal items by route; "" counts as sync.
func testByRoute(t *testing.T, open func(t *testing.T) store.Store) {
	s := fresh(t, open)
	add(t, s, 1, 10)
	var outs []store.Outcome
	for q := int64(1); q <= 6; q++ {
		o := ok(q)
		switch q % 3 {
		case 0:
			o.Route = store.RouteBatch
		case 1:
			o.Route = store.RouteSync
		}
		outs = append(outs, o)
	}
	e := errored(7, "invalid_request_error")
	e.Route = store.RouteBatch
	outs = append(outs, e, ok(3)) // ok(3) again: skipped, not counted twice
	commit(t, s, store.Batch{Outcomes: outs})
	a := aggregate(t, s)
	if b := a.ByRoute[store.RouteBatch]; b.Succeeded != 2 || b.Errored != 1 || b.CostNanos != 3000+6000+e.CostNanos {
		t.Fatalf("batch route = %+v", b)
	}
	if sy := a.ByRoute[store.RouteSync]; sy.Succeeded != 4 || sy.Errored != 0 || sy.CostNanos != 1000+2000+4000+5000 {
		t.Fatalf("sync route = %+v", sy)
	}
}
