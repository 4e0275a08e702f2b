package cputime

import (
	"runtime"
	"testing"
	"time"
)

// The round trip returns, its follower goroutine ends, and it reads zero
// where it cannot be measured.
func TestRoundTrip(t *testing.T) {
	before := runtime.NumGoroutine()
	d := RoundTrip(3, 2000)
	if runtime.NumCPU() >= 2 && runtime.GOMAXPROCS(0) >= 2 {
		if d <= 0 {
			t.Fatalf("round trip %v, want a positive figure", d)
		}
	} else if d != 0 {
		t.Fatalf("round trip %v with one CPU, want 0", d)
	}
	// The follower may still be between closing done and exiting.
	for i := 0; runtime.NumGoroutine() > before; i++ {
		if i == 200 {
			t.Fatalf("%d goroutines after, %d before: the follower did not return", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if d := RoundTrip(3, 2000); d != 0 {
		t.Fatalf("round trip %v with GOMAXPROCS=1, want 0", d)
	}
}

// The chase returns a positive figure, and nothing for no steps; and it
// leaves its memory with the operating system, not idle in the heap, where
// a benchmark's next allocations would find it faulted in already.
func TestMemoryMiss(t *testing.T) {
	if d := MemoryMiss(20000); d <= 0 {
		t.Fatalf("memory miss %v, want a positive figure", d)
	}
	runtime.GC() // whatever the chase left in the heap is idle now
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if kept := m.HeapIdle - m.HeapReleased; kept >= MissSpan/2 {
		t.Fatalf("%d MiB idle in the heap and not released after the chase of %d MiB", kept>>20, MissSpan>>20)
	}
	if d := MemoryMiss(0); d != 0 {
		t.Fatalf("memory miss %v for no steps, want 0", d)
	}
}
