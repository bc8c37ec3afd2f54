package gateway

import (
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cost"
)

// Entries recorded reach the file in order on Flush, whole, and a reopened
// ledger sums them again; 64 KB waiting wakes the flush loop early.
func TestLedgerWritesWhatItRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000 // ~150 bytes each: past 64 KB
	for i := range n {
		l.record("a", Entry{Cost: cost.Nanos(i + 1), Org: "one", RequestID: "req_x"})
	}
	select {
	case <-l.full:
	default:
		t.Error("64 KB of entries waiting did not wake the flush loop")
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.record("b", Entry{Cost: 7})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, want := r.spent("a"), cost.Nanos(n*(n+1)/2); got != want {
		t.Errorf("client a: %d nanos after reopening, want %d", got, want)
	}
	if got := r.spent("b"); got != 7 {
		t.Errorf("client b: %d nanos after reopening, want 7 (written by Close)", got)
	}
	if _, tot := r.Totals(); tot.Requests != n+1 {
		t.Errorf("%d entries after reopening, want %d", tot.Requests, n+1)
	}
}
