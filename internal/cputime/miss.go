package cputime

import (
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"time"
)

// MissSpan is the memory MemoryMiss walks: larger than the last-level
// cache of the machines the benchmarks run on, and of the order of what
// the engine's state for 100,000 tenants spans.
const MissSpan = 256 << 20

// MemoryMiss is the time one load takes when it must wait for a cache
// line from memory: the mean step of a chase through MissSpan bytes of
// heap, each step a load whose address the previous load returned (so
// that no two overlap), in an order that defeats the prefetchers, over
// up to steps steps or 200ms. It includes the TLB miss such a load pays
// on the heap's pages, as the engine's loads of a cold tenant do. A state
// that the cache cannot hold (a tenant seen once in 100,000) costs a
// message at least this for each line it must read before the next
// address is known; benchmarks report it beside the rows whose state
// spans more than the caches, as RoundTrip beside those that cross cores.
//
// Before it returns, it collects its memory and returns it to the
// operating system: otherwise what a benchmark allocates next would be
// served from pages the chase already faulted in, and a row measured after
// it would not pay the page faults that the same row run alone pays.
func MemoryMiss(steps int) time.Duration {
	if steps < 1 {
		return 0
	}
	d := chase(steps)
	debug.FreeOSMemory()
	return d
}

// chase is MemoryMiss's measurement; its memory is garbage once it
// returns.
func chase(steps int) time.Duration {
	type line struct {
		next *line
		_    [56]byte
	}
	ls := make([]line, MissSpan/64)
	// One cycle through every line, in random order. Linking writes every
	// line, so the chase faults no page in.
	order := rand.Perm(len(ls))
	for i, j := range order {
		ls[j].next = &ls[order[(i+1)%len(order)]]
	}
	p := &ls[order[0]]
	for range min(steps, len(ls)) / 10 { // an unmeasured start
		p = p.next
	}
	t0 := time.Now()
	n := 0
	for n < steps {
		for range 1024 {
			p = p.next
		}
		n += 1024
		if time.Since(t0) > 200*time.Millisecond {
			break
		}
	}
	el := time.Since(t0)
	runtime.KeepAlive(p) // the chase's result is used: it is not optimised away
	return el / time.Duration(n)
}
