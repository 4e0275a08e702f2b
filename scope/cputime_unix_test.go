//go:build unix

package scope_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user+system) the process has used. Benchmarks
// report it per op next to ns/op: on a shared, oversubscribed machine
// wall-clock ns/op mostly measures the neighbours.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
}
