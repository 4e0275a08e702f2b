package policy

import (
	"testing"
	"unsafe"
)

// TestGuardLayout checks the cache-line layout that the engine's per-message
// cost depends on (see head and counterShard): the fields a closed
// breaker's success reads fit one line, and the two counters it writes
// share one, both for an object at a line's start and for one 8 bytes in
// (Go's allocator puts a header first in objects of a guard's size).
func TestGuardLayout(t *testing.T) {
	var g guard
	hot := []struct {
		name string
		off  uintptr
		size uintptr
	}{
		{"pool", unsafe.Offsetof(g.pool), unsafe.Sizeof(g.pool)},
		{"life", unsafe.Offsetof(g.life), unsafe.Sizeof(g.life)},
		{"state", unsafe.Offsetof(g.state), unsafe.Sizeof(g.state)},
		{"r", unsafe.Offsetof(g.r), unsafe.Sizeof(g.r)},
		{"samples", unsafe.Offsetof(g.samples), unsafe.Sizeof(g.samples)},
		{"consec", unsafe.Offsetof(g.consec), unsafe.Sizeof(g.consec)},
		{"slowAt", unsafe.Offsetof(g.slowAt), unsafe.Sizeof(g.slowAt)},
		{"spent", unsafe.Offsetof(g.spent), unsafe.Sizeof(g.spent)},
	}
	for _, f := range hot {
		if f.off+f.size > 56 {
			t.Errorf("%s ends at byte %d of the guard, past 56: the hot fields no longer fit one line", f.name, f.off+f.size)
		}
	}
	for i := range g.counts {
		sh := unsafe.Offsetof(g.counts) + uintptr(i)*unsafe.Sizeof(g.counts[i])
		a := sh + unsafe.Offsetof(g.counts[i].active)
		s := sh + unsafe.Offsetof(g.counts[i].successes)
		for _, base := range []uintptr{0, 8} {
			if (base+a)/64 != (base+s+7)/64 {
				t.Errorf("shard %d: active (byte %d) and successes (byte %d) straddle a line at base %d", i, a, s, base)
			}
		}
	}
	if unsafe.Sizeof(g.counts[0])%64 != 0 {
		t.Errorf("a counter shard is %d bytes, not a whole number of lines", unsafe.Sizeof(g.counts[0]))
	}
}
