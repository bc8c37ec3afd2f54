//go:build !unix

package rundir

import (
	"os"
	"path/filepath"
)

// lockRunDir only creates dir/lock where advisory locks are not available:
// nothing stops two processes sharing a run directory there.
func lockRunDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, LockFile), os.O_CREATE|os.O_RDWR, 0o600)
}
