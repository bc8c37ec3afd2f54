package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/rundir"
)

// lockStateDir takes the state directory's lock (dir/lock; see
// rundir.LockExclusive). A directory another gateway holds is
// ErrStateDirBusy.
func lockStateDir(dir string) (*os.File, error) {
	f, err := rundir.LockExclusive(filepath.Join(dir, stateLockFile))
	if errors.Is(err, rundir.ErrLocked) {
		return nil, fmt.Errorf("%w: %s (one gateway per --state-dir: its ledger holds each client's max_cost)", ErrStateDirBusy, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: locking %s: %w", dir, err)
	}
	return f, nil
}
