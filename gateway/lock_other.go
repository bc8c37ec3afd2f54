//go:build !unix

package gateway

import (
	"os"
	"path/filepath"
)

// lockStateDir only creates dir/lock where advisory locks are not available:
// nothing stops two gateways sharing a state directory there.
func lockStateDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, stateLockFile), os.O_CREATE|os.O_RDWR, 0o600)
}
