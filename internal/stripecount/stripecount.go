// Package stripecount counts a benchmark's finished messages per stripe (a
// partition, a tenant), each count on a cache line of its own, and says
// when every stripe reached its share. One counter that workers on several
// cores increment is a line bouncing between them on every message: a cost
// of the benchmark's bookkeeping that would be charged to the code it
// measures.
package stripecount

import "sync/atomic"

// Counts is a set of striped counts. Its zero value is not usable: see New.
type Counts struct {
	n    []padded
	want []int64
	left atomic.Int64 // stripes not yet at their share
	done chan struct{}
}

type padded struct {
	atomic.Int64
	_ [56]byte
}

// New returns counts for len(want) stripes, stripe i done at want[i]. Done
// is closed at once when every share is zero.
func New(want []int64) *Counts {
	c := &Counts{n: make([]padded, len(want)), want: want, done: make(chan struct{})}
	left := 0
	for _, w := range want {
		if w > 0 {
			left++
		}
	}
	c.left.Store(int64(left))
	if left == 0 {
		close(c.done)
	}
	return c
}

// Add counts one message of stripe i.
func (c *Counts) Add(i int) {
	if c.n[i].Add(1) == c.want[i] && c.left.Add(-1) == 0 {
		close(c.done)
	}
}

// Done is closed when every stripe has reached its share.
func (c *Counts) Done() <-chan struct{} { return c.done }

// Total is how many messages were counted so far.
func (c *Counts) Total() int64 {
	var n int64
	for i := range c.n {
		n += c.n[i].Load()
	}
	return n
}
