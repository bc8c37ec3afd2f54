//go:build !unix

package rundir

import "os"

// LockExclusive only opens (creating it) the file at path where advisory
// locks are not available: nothing stops two processes holding it there.
func LockExclusive(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_RDWR, FilePerm)
}
