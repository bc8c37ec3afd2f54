package upstream

import "github.com/apidispatch/apidispatch/anthropic"

// MayHaveBilled is the one rule of every route for an attempt that failed:
// it may have been billed although no usable answer came back when its
// answer was cut or unreadable after a 2xx, or when the connection was
// lost (or timed out) after the whole request went out (wrote). A refused
// dial or a broken write cannot have been billed, nor can any answer the
// API classified itself.
func MayHaveBilled(o anthropic.Outcome, wrote bool) bool {
	switch o.ErrorType {
	case anthropic.ErrTypeTruncated, anthropic.ErrTypeNotMessage:
		return true
	case anthropic.ErrTypeConnection:
		return wrote
	}
	return false
}
