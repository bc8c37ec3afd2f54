package upstream

import (
	"testing"

	"github.com/apidispatch/apidispatch/anthropic"
)

func TestMayHaveBilled(t *testing.T) {
	for _, c := range []struct {
		typ   string
		wrote bool
		want  bool
	}{
		{anthropic.ErrTypeTruncated, false, true},
		{anthropic.ErrTypeNotMessage, false, true},
		{anthropic.ErrTypeConnection, true, true},
		{anthropic.ErrTypeConnection, false, false},
		{anthropic.ErrOverloaded, true, false},
		{anthropic.ErrRateLimit, true, false},
	} {
		if got := MayHaveBilled(anthropic.Outcome{ErrorType: c.typ}, c.wrote); got != c.want {
			t.Errorf("%s, written whole %v: may have billed %v, want %v", c.typ, c.wrote, got, c.want)
		}
	}
}
