package cputime

import (
	"runtime"
	"sync/atomic"
	"time"
)

// RoundTrip is the time two goroutines on their own threads take to hand a
// cache line to each other and back, the median of rounds of n round
// trips each. On a virtual machine it says how far apart the host placed
// the vCPUs right now: on the project's 2-vCPU machine it reads ~80-130 ns
// when they share a cache and ~350 ns when they do not, and the host moves
// them between the two while a benchmark runs. Every figure in which work
// crosses between cores (the engine's) moves with it, so benchmarks report
// it beside their own. It is 0 with GOMAXPROCS=1, where it cannot be
// measured.
func RoundTrip(rounds, n int) time.Duration {
	if runtime.GOMAXPROCS(0) < 2 || rounds < 1 || n < 1 {
		return 0
	}
	d := make([]time.Duration, rounds)
	for r := range d {
		d[r] = roundTrip(n)
	}
	for i := 1; i < len(d); i++ { // insertion sort: a handful of rounds
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
	return d[len(d)/2]
}

func roundTrip(n int) time.Duration {
	var line struct {
		_ [64]byte
		x atomic.Int64
		_ [64]byte
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := int64(1); i < 2*int64(n); i += 2 {
			for line.x.Load() != i {
			}
			line.x.Store(i + 1)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := time.Now()
	for i := int64(0); i < 2*int64(n); i += 2 {
		for line.x.Load() != i {
		}
		line.x.Store(i + 1)
	}
	<-done
	return time.Since(t0) / time.Duration(n)
}
