package scope

import (
	"sync/atomic"
	"unsafe"
)

// counter is a striped counter: concurrent adds from different goroutines
// usually land on different cache lines, so counting hits does not make
// parallel lookups contend on one line.
type counter struct {
	stripes [counterStripes]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

const counterStripes = 32

func (c *counter) add() { c.stripes[stripe()].n.Add(1) }

func (c *counter) load() uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].n.Load()
	}
	return n
}

// stripe picks a stripe from the address of the calling goroutine's stack:
// stable for a goroutine, different across goroutines, and free to compute
// (Go exposes no processor id).
func stripe() int {
	var b byte
	p := uint64(uintptr(unsafe.Pointer(&b))) >> 10
	return int(p * 0x9E3779B97F4A7C15 >> 59) // top 5 bits: 32 stripes
}
