//go:build unix

// Package cputime reads the process's CPU time, for benchmark figures that
// other processes' load distorts far less than wall time.
package cputime

import (
	"syscall"
	"time"
)

// Process is the process's user+system CPU time so far (an in-process
// broker included); zero if it cannot be read.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
