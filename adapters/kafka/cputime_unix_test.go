//go:build unix

package kafka

import (
	"syscall"
	"time"
)

// cpuTime is the process's user+system CPU time so far (the in-process
// server included), for a benchmark figure that other processes' load does
// not distort.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
