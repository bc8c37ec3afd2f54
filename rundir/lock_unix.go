//go:build unix

package rundir

import (
	"errors"
	"os"
	"syscall"
)

// LockExclusive opens (creating it) the file at path and takes an
// exclusive advisory lock on it, held until the returned file is closed or
// the process dies (the kernel drops it, so a kill -9 never leaves a stale
// lock). When another process holds it the error is ErrLocked.
func LockExclusive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, FilePerm)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return f, nil
}
