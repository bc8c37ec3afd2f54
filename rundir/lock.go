package rundir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrLocked is LockExclusive's error when another process holds the lock.
var ErrLocked = errors.New("rundir: lock held by another process")

// lockRunDir takes the run directory's lock (dir/lock; see LockExclusive).
// A run directory another process holds is ErrRunDirBusy.
func lockRunDir(dir string) (*os.File, error) {
	f, err := LockExclusive(filepath.Join(dir, LockFile))
	if errors.Is(err, ErrLocked) {
		return nil, fmt.Errorf("%w: %s (wait for it to end, or use another --run-dir)", ErrRunDirBusy, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return f, nil
}
