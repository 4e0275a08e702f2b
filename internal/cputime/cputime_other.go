//go:build !unix

// Package cputime reads the process's CPU time, for benchmark figures that
// other processes' load distorts far less than wall time.
package cputime

import "time"

// Process is zero where the process's CPU time cannot be read.
func Process() time.Duration { return 0 }

// Faults is zero where the process's page faults cannot be read.
func Faults() int64 { return 0 }
