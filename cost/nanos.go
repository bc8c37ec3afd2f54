package cost

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Nanos is an amount of money in nano-dollars (1e-9 USD). Every listed price
// is a whole number of nano-dollars per token, so sums of Nanos are exact.
// The zero value is $0.
type Nanos int64

// NanosPerUSD is the number of nano-dollars in one US dollar.
const NanosPerUSD Nanos = 1_000_000_000

// USD returns the amount in dollars as a float64, for display and JSON fields
// such as cost_usd. Do arithmetic on Nanos, not on the float.
func (n Nanos) USD() float64 {
	return float64(n) / float64(NanosPerUSD)
}

// String formats the amount as dollars with at least six decimals and as
// many more (up to nine) as needed to be exact: "$0.002130", "$0.0021305",
// "-$1.500000".
func (n Nanos) String() string {
	var u uint64
	sign := ""
	if n < 0 {
		sign = "-"
		u = uint64(-(n + 1)) + 1 // no overflow for math.MinInt64
	} else {
		u = uint64(n)
	}
	whole, frac := u/uint64(NanosPerUSD), u%uint64(NanosPerUSD)
	fs := fmt.Sprintf("%09d", frac)
	for len(fs) > 6 && fs[len(fs)-1] == '0' {
		fs = fs[:len(fs)-1]
	}
	return sign + "$" + strconv.FormatUint(whole, 10) + "." + fs
}

// ParseUSD parses a dollar amount such as "12.50", "$0.002130" or "600"
// exactly (no float rounding). More than nine decimals is an error.
func ParseUSD(s string) (Nanos, error) {
	t := strings.TrimSpace(s)
	neg := false
	if strings.HasPrefix(t, "-") {
		neg, t = true, t[1:]
	}
	t = strings.TrimPrefix(t, "$")
	v, err := parseDecimal(t, 9)
	if err != nil {
		return 0, fmt.Errorf("cost: amount %q: %w", s, err)
	}
	if neg {
		v = -v
	}
	return Nanos(v), nil
}

var errNotDecimal = errors.New("not a decimal number")

// parseDecimal returns the non-negative decimal s times 10^scale, exactly.
// It accepts digits with an optional fraction and '_' digit separators
// (as TOML does); a fraction with more than scale significant digits is an
// error rather than a rounding.
func parseDecimal(s string, scale int) (int64, error) {
	s = strings.ReplaceAll(s, "_", "")
	intPart, fracPart, hasDot := strings.Cut(s, ".")
	if intPart == "" && (!hasDot || fracPart == "") {
		return 0, errNotDecimal
	}
	if hasDot && fracPart == "" {
		return 0, errNotDecimal
	}
	for _, p := range []string{intPart, fracPart} {
		for i := 0; i < len(p); i++ {
			if p[i] < '0' || p[i] > '9' {
				return 0, errNotDecimal
			}
		}
	}
	fracPart = strings.TrimRight(fracPart, "0")
	if len(fracPart) > scale {
		return 0, fmt.Errorf("more than %d decimals", scale)
	}
	fracPart += strings.Repeat("0", scale-len(fracPart))
	digits := strings.TrimLeft(intPart+fracPart, "0")
	if digits == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, errors.New("too large")
	}
	return v, nil
}
