package numfmt

import (
	"math"
	"testing"
)

func TestCommas(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0", 7: "7", 999: "999", 1000: "1,000", 141600: "141,600", 1234567: "1,234,567",
		-1: "-1", -1000: "-1,000", -141600: "-141,600",
		math.MaxInt64: "9,223,372,036,854,775,807", math.MinInt64: "-9,223,372,036,854,775,808",
	} {
		if got := Commas(n); got != want {
			t.Errorf("Commas(%d) = %q, want %q", n, got, want)
		}
	}
}
