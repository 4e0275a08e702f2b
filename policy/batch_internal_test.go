package policy

import (
	"context"
	"testing"
)

// TestBatchSamplesOneInSampleEvery: a batch draws its attempts' random
// numbers itself (xorshift from a seed); after the warm-up about one
// attempt in Latency.SampleEvery is a latency sample, as with
// Guard.Allow, and the draws spread over the counter shards.
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
	for range n {
		pm, err := b.Allow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if pm.timed {
			timed++
		}
		shards[pm.shard]++
		pm.Done(nil)
	}
	b.End()
	// Binomial(8000, 1/8): mean 1000, standard deviation ~30.
	if timed < 800 || timed > 1200 {
		t.Fatalf("%d of %d batch attempts were latency samples, want about %d", timed, n, n/8)
	}
	for i, c := range shards {
		if c < n/counterShards/2 {
			t.Fatalf("counter shard %d drew %d of %d attempts: %v", i, c, n, shards)
		}
	}
	if got := g.Stats().Successes; got != warmSamples+n {
		t.Fatalf("successes %d, want %d", got, warmSamples+n)
	}
}
