package stripecount

import (
	"sync"
	"testing"
)

func closed(c *Counts) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// TestDoneAtEveryShare: Done closes only once every stripe reached its
// share, however the adds interleave, and a stripe past its share does not
// close it early.
func TestDoneAtEveryShare(t *testing.T) {
	c := New([]int64{3, 0, 2})
	c.Add(0)
	c.Add(0)
	c.Add(0)
	c.Add(0) // past its share: counted, does not count the stripe twice
	if closed(c) {
		t.Fatal("done with stripe 2 at 0 of 2")
	}
	c.Add(2)
	if closed(c) {
		t.Fatal("done with stripe 2 at 1 of 2")
	}
	c.Add(2)
	if !closed(c) {
		t.Fatal("not done with every stripe at its share")
	}
	if got := c.Total(); got != 6 {
		t.Fatalf("Total %d, want 6", got)
	}
}

func TestAllZeroDoneAtOnce(t *testing.T) {
	if !closed(New([]int64{0, 0})) {
		t.Fatal("not done with nothing to count")
	}
}

func TestConcurrentAdds(t *testing.T) {
	const stripes, per = 8, 1000
	want := make([]int64, stripes)
	for i := range want {
		want[i] = per
	}
	c := New(want)
	var wg sync.WaitGroup
	for i := range stripes {
		for range 2 {
			wg.Go(func() {
				for range per / 2 {
					c.Add(i)
				}
			})
		}
	}
	wg.Wait()
	if !closed(c) || c.Total() != stripes*per {
		t.Fatalf("done %v, total %d, want done and %d", closed(c), c.Total(), stripes*per)
	}
}
