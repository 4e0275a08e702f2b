package scope_test

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// TestHeapBoundedByDistinctKeys streams heapTestKeys distinct keys (10
// million without -race; a tenth with -short) through a scope with MaxKeys
// 1024 and checks that the live heap after a GC stays under 16 MiB, at
// checkpoints and at the end.
func TestHeapBoundedByDistinctKeys(t *testing.T) {
	const maxKeys, limit = 1024, 16 << 20
	keys := heapTestKeys
	if testing.Short() {
		keys /= 10
	}
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: maxKeys})
	bound := 5 * maxKeys
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := live()
	var peak uint64
	buf := make([]byte, 0, 32)
	for i := range keys {
		buf = strconv.AppendInt(append(buf[:0], "tenant-"...), int64(i), 10)
		if s.For(string(buf)) == nil {
			t.Fatal("nil guard")
		}
		if n := s.Len(); n > bound {
			t.Fatalf("Len %d beyond HardCeiling+MaxKeys after %d keys", n, i+1)
		}
		if (i+1)%(keys/10) == 0 {
			h := live()
			peak = max(peak, h)
			if h > limit {
				t.Fatalf("live heap %.1f MiB after %d distinct keys, want < 16 MiB", float64(h)/(1<<20), i+1)
			}
		}
	}
	st := s.Stats()
	t.Logf("%d distinct keys, MaxKeys %d: live heap after GC %.2f MiB (peak at checkpoints %.2f MiB, %.2f MiB before the first key); Len %d, %d sweeps, %d evictions",
		keys, maxKeys, float64(live())/(1<<20), float64(peak)/(1<<20), float64(base)/(1<<20), st.Size, st.Sweeps, st.Evictions)
	if st.Misses != uint64(keys) || st.Evictions < uint64(keys-bound) {
		t.Fatalf("stats %+v: every key should have missed and almost all been evicted", st)
	}
	runtime.KeepAlive(s)
}
