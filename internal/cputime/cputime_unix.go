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

// Faults is the number of page faults the process has taken so far (minor
// and major); zero if it cannot be read. On a virtual machine a fault can
// cost microseconds, so benchmarks whose rows differ in the memory they
// touch report it beside their CPU time.
func Faults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt + ru.Majflt
}
