//go:build unix

package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockStateDir takes an exclusive advisory lock on dir/lock, held until the
// returned file is closed (the kernel drops it when the process dies).
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, stateLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gateway: state dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (one gateway per --state-dir: its ledger holds each client's max_cost)", ErrStateDirBusy, dir)
		}
		return nil, fmt.Errorf("gateway: locking %s: %w", dir, err)
	}
	return f, nil
}
