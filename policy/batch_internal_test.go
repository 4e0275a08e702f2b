package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// TestBatchSamplesOneInSampleEvery: a batch draws its attempts' random
// numbers itself (xorshift from a seed); after the warm-up about one
// attempt in Latency.SampleEvery is a latency sample, as with
// Guard.Allow, and every attempt counts on the batch's counter shard.
func TestBatchSamplesOneInSampleEvery(t *testing.T) {
	p := Default()
	p.Latency.SampleEvery = 8
	g, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range warmSamples { // every attempt of the warm-up is a sample
		if err := g.Run(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	const n = 8000
	timed := 0
	var shards [counterShards]int
	b := g.Batch()
	b0 := b.shard
	for range n {
		pm, err := b.Allow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if pm.timed {
			timed++
		}
		shards[pm.shard&(counterShards-1)]++
		pm.Done(nil)
	}
	b.End()
	// Binomial(8000, 1/8): mean 1000, standard deviation ~30.
	if timed < 800 || timed > 1200 {
		t.Fatalf("%d of %d batch attempts were latency samples, want about %d", timed, n, n/8)
	}
	if shards[b0] != n {
		t.Fatalf("attempts by counter shard %v, want all %d on the batch's shard %d", shards, n, b0)
	}
	if got := g.Stats().Successes; got != warmSamples+n {
		t.Fatalf("successes %d, want %d", got, warmSamples+n)
	}
}

// TestCallsKeepTheirGoroutineShard: a goroutine's calls count on one
// shard while the salt stays, the one draw gives it; a collision moves
// the salt.
func TestCallsKeepTheirGoroutineShard(t *testing.T) {
	salt := shardSalt.v.Load()
	want := goroutineShard(salt)
	for range 100 {
		if shardSalt.v.Load() != salt {
			t.Skip("another test's goroutines collided meanwhile")
		}
		if got := draw() & (counterShards - 1); got != want {
			t.Fatalf("draw's shard %d, want the goroutine's %d", got, want)
		}
	}
	// About one call in collisionEvery checks for a collision.
	n := 0
	for range 64 * collisionEvery {
		if checks(draw()) {
			n++
		}
	}
	if n < 32 || n > 96 {
		t.Fatalf("%d of %d draws check for a collision, want about 64", n, 64*collisionEvery)
	}
	var c atomic.Uint64
	c.Store(41)
	countOn[uint64](&c)
	if c.Load() != 42 {
		t.Fatalf("counted %d, want 42", c.Load())
	}
	collided()
	if shardSalt.v.Load() == salt {
		t.Fatal("a collision left the salt as it was")
	}
}

// TestShardCountsUnderCollisions: calls of many goroutines on one guard,
// colliding on shards and moving the salt, are each counted once, and a
// recycled state's count of calls in progress comes back to zero.
func TestShardCountsUnderCollisions(t *testing.T) {
	c, err := Compile(Default())
	if err != nil {
		t.Fatal(err)
	}
	rc := NewRecycler(1)
	g := rc.New(c, nil)
	const goroutines, calls = 8, 2000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range calls {
				if err := g.Run(context.Background(), func(context.Context) error { return nil }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := g.Stats().Successes; got != goroutines*calls {
		t.Fatalf("successes %d, want %d", got, goroutines*calls)
	}
	if !g.st.Load().idle() {
		t.Fatal("calls still counted in after every call ended")
	}
}
