package cputime

import (
	"runtime"
	"slices"
	"sync/atomic"
	"time"
)

// RoundTrip is the time two goroutines on their own threads take to hand a
// cache line to each other and back: the median of rounds of up to n
// round trips each (a round stops early after 50ms). On a virtual machine
// it says how far apart the host placed the vCPUs right now: it reads
// several times higher when they share no cache than when they do, and a
// host may move them between the two while a benchmark runs. Every figure
// in which work crosses between cores (the engine's) moves with it, so
// benchmarks report it beside their own. With
// other processes busy on the cores it reads far higher still (a spinning
// thread waits for its turn on a core): then the row beside it is not to be
// trusted either. It is 0 where it cannot be measured: fewer than 2 CPUs or
// GOMAXPROCS below 2.
func RoundTrip(rounds, n int) time.Duration {
	if runtime.NumCPU() < 2 || runtime.GOMAXPROCS(0) < 2 || rounds < 1 || n < 1 {
		return 0
	}
	d := make([]time.Duration, rounds)
	for r := range d {
		d[r] = roundTrip(n, 50*time.Millisecond)
	}
	slices.Sort(d)
	return d[len(d)/2]
}

// roundTrip plays up to n round trips, or as many as fit in limit: the
// leader writes even values, the follower answers each with the next odd
// one, and -1 tells the follower to return.
func roundTrip(n int, limit time.Duration) time.Duration {
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
		for want := int64(0); ; want += 2 {
			v := line.x.Load()
			for v != want && v >= 0 {
				v = line.x.Load()
			}
			if v < 0 {
				return
			}
			line.x.Store(want + 1)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := time.Now()
	trips := 0
	for trips < n {
		want := int64(2*trips + 1)
		for line.x.Load() != want {
		}
		trips++
		if trips&63 == 0 && time.Since(t0) > limit {
			break
		}
		if trips < n {
			line.x.Store(want + 1)
		}
	}
	el := time.Since(t0)
	line.x.Store(-1)
	<-done
	return el / time.Duration(trips)
}
