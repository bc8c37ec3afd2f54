//go:build !linux

package campaign

import "errors"

// setFileLimit is not available here: the full-disk disturbance does nothing.
func setFileLimit(int, uint64) error { return errors.New("no RLIMIT_FSIZE for another process") }
