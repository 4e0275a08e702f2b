package consumer

import (
	"reflect"
	"testing"
	"unsafe"
)

// TestShardLayout checks the cache-line layout that a worker's run depends
// on (see runOn): the fields it reads at every message without the lock
// (readyHint, gate) share no line with any other field of the shard (the
// groups DeliverBatch writes at every message it queues, mu, ready,
// commit and count, among them), nor with a neighbouring object's,
// wherever the allocator puts the shard (at a line's start, or 8 bytes
// in). BenchmarkEngine guards the gain.
func TestShardLayout(t *testing.T) {
	var sh shard
	rf := unsafe.Offsetof(sh.readyHint)
	gl := unsafe.Offsetof(sh.gate) + unsafe.Sizeof(sh.gate) - 1
	if rf > gl {
		t.Fatalf("readyHint (byte %d) is not before gate (last byte %d)", rf, gl)
	}
	typ := reflect.TypeFor[shard]()
	for _, base := range []uintptr{0, 8} {
		lo, hi := (base+rf)/64, (base+gl)/64
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Name == "_" || f.Name == "readyHint" || f.Name == "gate" || f.Type.Size() == 0 {
				continue
			}
			fl, fh := (base+f.Offset)/64, (base+f.Offset+f.Type.Size()-1)/64
			if fh >= lo && fl <= hi {
				t.Errorf("base %d: %s (bytes %d-%d) shares a line with readyHint..gate (bytes %d-%d)", base, f.Name, f.Offset, f.Offset+f.Type.Size()-1, rf, gl)
			}
		}
		if (base+unsafe.Sizeof(sh)-1)/64 <= hi {
			t.Errorf("base %d: the shard ends on gate's line: a neighbouring object may share it", base)
		}
	}
}
