//go:build unix

// Package host reads what the machine says about this process and itself,
// for benchmarks and the A/B's record of how busy the machine was.
package host

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessCPU is the CPU time this process has used (user + system), or 0
// where it cannot be read.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// LoadAverage is the host's one-minute load average (Linux), or -1.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// FileLimit is this process's limit of open files (RLIMIT_NOFILE, soft),
// or 0 where it cannot be read.
func FileLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return uint64(l.Cur)
}
