//go:build !unix

// Package host reads what the machine says about this process and itself,
// for benchmarks and the A/B's record of how busy the machine was.
package host

import "time"

// ProcessCPU is not measured here (0).
func ProcessCPU() time.Duration { return 0 }

// LoadAverage is not known here (-1).
func LoadAverage() float64 { return -1 }

// FileLimit is not known here (0).
func FileLimit() uint64 { return 0 }
