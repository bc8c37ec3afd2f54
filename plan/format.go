package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/internal/numfmt"
)

// usd formats money for people: cents with thousands separators from $1
// up ("$1,019.52"), six decimals below ("$0.002340").
func usd(n cost.Nanos) string {
	if n < 0 {
		return "-" + usd(-n)
	}
	if n < cost.NanosPerUSD {
		return fmt.Sprintf("$%.6f", n.USD())
	}
	cents := (int64(n) + 5_000_000) / 10_000_000 // round half up to a cent
	return fmt.Sprintf("$%s.%02d", numfmt.Commas(cents/100), cents%100)
}

// perM formats a per-token price in nano-dollars as dollars per million
// tokens: 3000 → "$3.00", 300 → "$0.30", 3750 → "$3.75", 125 → "$0.125".
func perM(n cost.Nanos) string {
	s := strconv.FormatFloat(float64(n)/1000, 'f', 3, 64)
	s = strings.TrimSuffix(s, "0")
	return "$" + s
}

// tok formats a per-request token figure: whole numbers without decimals,
// others with one.
func tok(f float64) string {
	if f == math.Trunc(f) {
		return numfmt.Commas(int64(f))
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

// dur formats seconds: "48.3 s", "19 min 17 s", "2 h 03 min".
func dur(s float64) string {
	switch {
	case math.IsInf(s, 1) || math.IsNaN(s):
		return "never"
	case s < 60:
		return fmt.Sprintf("%.1f s", s)
	case s < 3600:
		m := int(s) / 60
		return fmt.Sprintf("%d min %02d s", m, int(s)-60*m)
	}
	h := int(s) / 3600
	return fmt.Sprintf("%d h %02d min", h, (int(s)-3600*h)/60)
}

// rpm formats requests per minute.
func rpm(f float64) string {
	if f <= 0 {
		return "-"
	}
	return numfmt.Commas(int64(math.Round(f)))
}
