package scope

import (
	"sync"
	"testing"
)

// TestCounterCountsEveryAdd: adds from many goroutines at once, colliding
// on stripes and moving the salt, are each counted once.
func TestCounterCountsEveryAdd(t *testing.T) {
	var c counter
	const goroutines, adds = 8, 20000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range adds {
				c.add()
			}
		})
	}
	wg.Wait()
	if n := c.load(); n != goroutines*adds {
		t.Fatalf("counted %d, want %d", n, goroutines*adds)
	}
}

// TestCounterCollisionMovesSalt: an add whose stripe changed under it is
// still counted, and moves the salt that every goroutine's stripe is drawn
// from.
func TestCounterCollisionMovesSalt(t *testing.T) {
	var c counter
	salt := c.salt.Load()
	s := &c.stripes[stripe(salt)].n
	s.Store(41)
	c.collided(s)
	if n := c.load(); n != 42 {
		t.Fatalf("counted %d, want 42", n)
	}
	if c.salt.Load() == salt {
		t.Fatal("a collision left the salt as it was")
	}
}
