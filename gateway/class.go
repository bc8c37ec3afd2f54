package gateway

import (
	"errors"
	"fmt"
)

// Class is a request's priority class. While a pool's lanes are full,
// every waiting interactive request is admitted before any bulk one;
// within a class, clients share by weight.
type Class uint8

// The classes, first served first.
const (
	Interactive Class = iota
	Bulk
	nClasses
)

// ErrPriority: a priority that is neither "interactive" nor "bulk".
var ErrPriority = errors.New(`priority must be "interactive" or "bulk"`)

func (c Class) String() string {
	if c == Bulk {
		return "bulk"
	}
	return "interactive"
}

// ParseClass reads a priority as the clients file and the
// x-apidispatch-priority header spell it.
func ParseClass(s string) (Class, error) {
	switch s {
	case "interactive":
		return Interactive, nil
	case "bulk":
		return Bulk, nil
	}
	return 0, fmt.Errorf("%w, not %q", ErrPriority, s)
}
