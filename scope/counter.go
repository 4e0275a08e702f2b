package scope

import (
	"sync/atomic"
	"unsafe"
)

// counter is a striped counter: concurrent adds from different goroutines
// usually land on different cache lines, so counting hits does not make
// parallel lookups contend on one line.
//
// A goroutine's stripe comes from its stack's address (Go exposes no
// processor id), mixed with salt. Two goroutines that count at the same
// time may still draw the same stripe, far more often than one time in
// counterStripes (stack addresses are far from random), and would then
// pass its line back and forth on every add for as long as they run, at
// several times the cost of a lookup. An add that finds its stripe
// changed under it (its compare-and-swap fails) therefore changes the
// salt, which moves every goroutine to another stripe.
type counter struct {
	// salt is read by every add and written only on a collision: a line
	// of its own, so that the adds' writes do not keep taking it away.
	salt atomic.Uint64
	_    [56]byte

	stripes [counterStripes]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

const counterStripes = 32

func (c *counter) add() {
	s := &c.stripes[stripe(c.salt.Load())].n
	if n := s.Load(); !s.CompareAndSwap(n, n+1) {
		c.collided(s)
	}
}

// collided counts the add whose compare-and-swap on s failed (another
// goroutine added to s meanwhile), and moves the salt.
func (c *counter) collided(s *atomic.Uint64) {
	c.salt.Add(1)
	s.Add(1)
}

func (c *counter) load() uint64 {
	var n uint64
	for i := range c.stripes {
		n += c.stripes[i].n.Load()
	}
	return n
}

// stripe picks a stripe from the address of the calling goroutine's stack
// and salt: stable for a goroutine while the salt is, different across
// goroutines, and free to compute.
func stripe(salt uint64) int {
	p := uint64(uintptr(unsafe.Pointer(&salt)))>>10 ^ salt // salt is on the stack
	return int(p * 0x9E3779B97F4A7C15 >> 59)               // top 5 bits: 32 stripes
}
