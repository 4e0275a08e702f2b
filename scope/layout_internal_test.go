package scope

import (
	"testing"
	"unsafe"
)

// TestEntryLayout: the entry of a string key, the one allocation of a key
// life, fits the 64-byte size class.
func TestEntryLayout(t *testing.T) {
	if n := unsafe.Sizeof(entry[string]{}); n > 64 {
		t.Fatalf("entry[string] takes %d bytes, want at most 64", n)
	}
}

// TestCounterSaltOwnLine: the counter's salt, read by every add, shares
// no line with a stripe that adds write.
func TestCounterSaltOwnLine(t *testing.T) {
	var c counter
	if off := unsafe.Offsetof(c.stripes); off < 64 {
		t.Fatalf("the first stripe starts %d bytes after the salt, want at least 64", off)
	}
}
