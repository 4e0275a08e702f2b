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
