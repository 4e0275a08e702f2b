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

// TestTenantLayout checks the cache-line layout of a tenant (see tenant):
// a whole number of lines, so that its size class puts every tenant at a
// line's start, with what finding and taking its lane reads on the first
// line and what the rest of a lane's turn reads on the second, its guard's
// handle included.
func TestTenantLayout(t *testing.T) {
	var x tenant
	if size := unsafe.Sizeof(x); size%64 != 0 {
		t.Fatalf("a tenant is %d bytes, not a whole number of lines (adjust tenantPad)", size)
	}
	line := func(name string, off, size uintptr, want uintptr) {
		if off/64 != want || (off+size-1)/64 != want {
			t.Errorf("%s (bytes %d-%d) is not on line %d", name, off, off+size-1, want)
		}
	}
	line("key", unsafe.Offsetof(x.key), unsafe.Sizeof(x.key), 0)
	line("lanes", unsafe.Offsetof(x.lanes), unsafe.Sizeof(x.lanes), 0)
	line("onIdle", unsafe.Offsetof(x.onIdle), 1, 0)
	line("keyBuf", unsafe.Offsetof(x.keyBuf), unsafe.Sizeof(x.keyBuf), 0)
	line("guardP", unsafe.Offsetof(x.guardP), unsafe.Sizeof(x.guardP), 0)
	line("inflight", unsafe.Offsetof(x.inflight), unsafe.Sizeof(x.inflight), 0)
	line("gd", unsafe.Offsetof(x.gd), unsafe.Sizeof(x.gd), 1)
	line("ctl", unsafe.Offsetof(x.ctl), unsafe.Sizeof(x.ctl), 1)
	line("handled", unsafe.Offsetof(x.handled), unsafe.Sizeof(x.handled), 1)
	line("nblocked", unsafe.Offsetof(x.nblocked), unsafe.Sizeof(x.nblocked), 1)
	line("openSince", unsafe.Offsetof(x.openSince), unsafe.Sizeof(x.openSince), 1)
}

// TestConsumerLayout checks that what every delivery reads of the engine
// (parts, for the partition's shard, and maxIdle, for its lane bound)
// shares no line with the tenant table's lock, taken for every message of
// a tenant whose lane must be made.
func TestConsumerLayout(t *testing.T) {
	var c Consumer
	tl := unsafe.Offsetof(c.tmu) / 64
	for name, off := range map[string]uintptr{"parts": unsafe.Offsetof(c.parts), "maxIdle": unsafe.Offsetof(c.maxIdle), "ntenants": unsafe.Offsetof(c.ntenants)} {
		for _, base := range []uintptr{0, 8} {
			if (base+off)/64 == (base+unsafe.Offsetof(c.tmu))/64 {
				t.Errorf("base %d: %s (byte %d) shares tmu's line %d", base, name, off, tl)
			}
		}
	}
}
