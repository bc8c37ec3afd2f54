package campaign

import "testing"

// pacedShare's slack is one request at each edge of the judged window, no
// more: a stuck org stays far below the floor, one at its limit less the
// two cut edges passes, and one three requests short of its limit in a
// two-second window fails.
func TestPacedShareSlack(t *testing.T) {
	const perReal = 12.5 // 50 requests a minute at speed 15
	for _, c := range []struct {
		admitted float64
		n        int
		pass     bool
	}{
		{admitted: 1, n: 2, pass: false},  // stuck: 0.12
		{admitted: 23, n: 2, pass: true},  // 25 refilled, two cut at the edges
		{admitted: 20, n: 2, pass: false}, // five short: 0.88
		{admitted: 48, n: 4, pass: true},  // 50 refilled, two cut at the edges
		{admitted: 41, n: 4, pass: false}, // nine short: 0.86
	} {
		got := pacedShare(c.admitted, c.n, perReal)
		if (got >= 0.9) != c.pass {
			t.Errorf("%v admitted in %d s at %v a second: %.3f of the limit, want pass %v at 0.9", c.admitted, c.n, perReal, got, c.pass)
		}
	}
}
