//go:build !long

package dispatch_test

import (
	"slices"
	"testing"
)

// TestFaultMatrix, quick: everything at once, and three faults alone that
// test the promises most directly (a reset after billing, a key revoked
// mid-run, invalid requests); -tags long runs every case.
func TestFaultMatrix(t *testing.T) {
	quick := []string{"everything at once", "reset after billing", "key revoked mid-run", "invalid requests mixed in"}
	var cases []faultCase
	for _, fc := range faultCases() {
		if slices.Contains(quick, fc.name) {
			cases = append(cases, fc)
		}
	}
	if len(cases) != len(quick) {
		t.Fatalf("%d of the quick fault cases %q exist", len(cases), quick)
	}
	faultMatrix(t, cases)
}
