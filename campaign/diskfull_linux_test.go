package campaign

import "golang.org/x/sys/unix"

// setFileLimit sets the file size limit of process pid (RLIMIT_FSIZE): a
// write growing a file past it fails with EFBIG, as on a full disk.
func setFileLimit(pid int, limit uint64) error {
	return unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}, nil)
}
