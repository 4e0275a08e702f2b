package policy

import (
	"context"
	"testing"
	"time"
)

// waitCoarseFresh polls, bounded, until the coarse clock ticks fast.
func waitCoarseFresh(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, fresh := coarseNow(); fresh {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the coarse clock did not start ticking within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoarseClockTimesSlowCalls: with the system clock, an attempt that is
// not a latency sample is timed by the coarse clock, and a call slower than
// the threshold is caught by it. The slow call sleeps for real (it stands
// for a slow dependency); the margins are 40 times the clock's resolution.
func TestCoarseClockTimesSlowCalls(t *testing.T) {
	t.Parallel()
	g, err := New(Policy{
		Breaker: &Breaker{ConsecutiveFailures: 1, SlowCall: SlowCall{Threshold: 200 * time.Millisecond}},
		Latency: Latency{SampleEvery: 1 << 30}, // after the warm-up, (almost) never a sample
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range warmSamples {
		if err := g.Run(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	waitCoarseFresh(t)
	p, err := g.Allow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.clock != clockCoarse || p.timed {
		t.Fatalf("permit clock %d timed %v, want the coarse clock", p.clock, p.timed)
	}
	p.Done(nil)
	if st := g.Stats(); st.SlowCalls != 0 || st.State != Closed {
		t.Fatalf("a fast call was slow: %+v", st)
	}
	waitCoarseFresh(t)
	p, _ = g.Allow(ctx)
	time.Sleep(400 * time.Millisecond)
	p.Done(nil)
	if st := g.Stats(); st.SlowCalls != 1 || st.State != Open {
		t.Fatalf("a 400ms call at a 200ms threshold was not slow: %+v", st)
	}
}

func TestCoarseClockAdvances(t *testing.T) {
	t.Parallel()
	waitCoarseFresh(t)
	a, _ := coarseNow()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, fresh := coarseNow()
		if b < a {
			t.Fatalf("coarse clock went back from %d to %d", a, b)
		}
		if b > a {
			if !fresh || b&1 != 1 {
				t.Fatalf("a value of a ticking clock is %d, fresh %v: want odd", b, fresh)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the coarse clock did not advance within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
