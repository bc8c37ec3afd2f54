// Package numfmt formats numbers for people, the one way every report,
// table and message of apidispatch writes them.
package numfmt

import "strconv"

// Commas formats n with thousands separators: 141600 is "141,600".
func Commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	b := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return sign + string(b)
}
