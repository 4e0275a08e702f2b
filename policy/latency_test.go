package policy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func TestLatencyEstimate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		q      float64
		lo, hi time.Duration // accepted band around the true quantile
	}{
		{0, 85 * time.Millisecond, 95 * time.Millisecond}, // default 0.9 of U(0,100ms)
		{0.5, 45 * time.Millisecond, 55 * time.Millisecond},
		{0.99, 96 * time.Millisecond, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.q), func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			// Every attempt timed: this tests the estimator, deterministically.
			g := mustNew(t, policy.Policy{Latency: policy.Latency{Quantile: tt.q, SampleEvery: 1}, Clock: clk})
			if g.Stats().Latency != 0 {
				t.Fatal("estimate before any sample")
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var sum time.Duration
			const n = 20000
			for i := range n {
				p, _ := g.Allow(context.Background())
				clk.Advance(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
				p.Done(nil)
				if i >= n/2 {
					sum += g.Stats().Latency
				}
			}
			// The mean of the estimate over the second half.
			if avg := sum / (n / 2); avg < tt.lo || avg > tt.hi {
				t.Fatalf("estimate %v, want within [%v, %v]", avg, tt.lo, tt.hi)
			}
		})
	}
}

func TestLatencyEstimateTracksShift(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Clock: clk, Latency: policy.Latency{SampleEvery: 1}})
	feed := func(d time.Duration, n int) {
		for range n {
			p, _ := g.Allow(context.Background())
			clk.Advance(d)
			p.Done(nil)
		}
	}
	feed(time.Millisecond, 1000)
	if l := g.Stats().Latency; l < 900*time.Microsecond || l > 1100*time.Microsecond {
		t.Fatalf("constant 1ms: estimate %v", l)
	}
	feed(time.Second, 1000) // a slow dependency: it must follow within a few hundred samples
	if l := g.Stats().Latency; l < 900*time.Millisecond || l > 1100*time.Millisecond {
		t.Fatalf("after the shift to 1s: estimate %v", l)
	}
	feed(0, 1) // a zero duration is a valid sample
}

// countingClock counts reads: the hot path reads the clock only to sample.
type countingClock struct {
	fakeClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time { c.reads.Add(1); return c.fakeClock.Now() }

// TestLatencyIgnoresPermanentFailures: a burst of work that fails at once
// with a permanent error leaves the latency estimate where the dependency's
// calls put it; with Breaker.CountPermanent its durations are samples like
// any failure's.
func TestLatencyIgnoresPermanentFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		count bool
		want  func(before, after time.Duration) bool
	}{
		{"default: not a sample", false, func(b, a time.Duration) bool { return a == b }},
		{"CountPermanent: a sample", true, func(b, a time.Duration) bool { return a < b/10 }},
	} {
		clk := newFakeClock()
		g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{CountPermanent: tc.count, ConsecutiveFailures: 1 << 30}, Clock: clk, Latency: policy.Latency{SampleEvery: 1}})
		for range 100 {
			p, _ := g.Allow(context.Background())
			clk.Advance(2 * time.Millisecond)
			p.Done(nil)
		}
		before := g.Stats().Latency
		for range 1000 {
			p, _ := g.Allow(context.Background())
			clk.Advance(time.Microsecond)
			p.Done(policy.Permanent(errFail))
		}
		if after := g.Stats().Latency; !tc.want(before, after) {
			t.Errorf("%s: estimate %v before a burst of 1µs permanent failures, %v after", tc.name, before, after)
		}
	}
}

func TestLatencySampling(t *testing.T) {
	t.Parallel()
	noSlow := &policy.Breaker{SlowCall: policy.SlowCall{Disabled: true}}
	tests := []struct {
		name    string
		breaker *policy.Breaker
		every   int
		lo, hi  int64 // clock reads for 8000 successes after New
	}{
		{"every attempt", noSlow, 1, 16000, 16000},
		{"one in 8 after 32 warm-up samples", noSlow, 0, 64 + 2*(996-200), 64 + 2*(996+200)},
		{"no breaker", nil, 0, 64 + 2*(996-200), 64 + 2*(996+200)},
		{"one in 2", noSlow, 2, 64 + 2*(3984-300), 64 + 2*(3984+300)},
		// With an injected Clock, the slow-call check (on by default with
		// a breaker) times every attempt with it; the system clock's
		// check reads the coarse clock instead.
		{"slow-call check", &policy.Breaker{}, 0, 16000, 16000},
		{"fixed slow-call threshold", &policy.Breaker{SlowCall: policy.SlowCall{Threshold: time.Second}}, 0, 16000, 16000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := &countingClock{fakeClock: *newFakeClock()}
			g := mustNew(t, policy.Policy{Breaker: tt.breaker, Clock: clk, Latency: policy.Latency{SampleEvery: tt.every}})
			clk.reads.Store(0)
			for i := range 8000 {
				if err := g.Run(context.Background(), func(context.Context) error { return nil }); err != nil {
					t.Fatal(err)
				}
				if i == 31 && clk.reads.Load() != 64 {
					t.Fatalf("%d reads in the 32 warm-up attempts, want 64", clk.reads.Load())
				}
			}
			if n := clk.reads.Load(); n < tt.lo || n > tt.hi {
				t.Fatalf("%d clock reads, want within [%d, %d]", n, tt.lo, tt.hi)
			}
		})
	}
}

func TestHedge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		g := mustNew(t, policy.Policy{Hedge: policy.Hedge{Enabled: true, MinDelay: 10 * time.Millisecond}, OnEvent: rec.event})
		var calls atomic.Int32
		var firstCanceled atomic.Bool
		start := time.Now()
		err := g.Run(context.Background(), func(ctx context.Context) error {
			if calls.Add(1) == 1 { // the slow one
				<-ctx.Done()
				firstCanceled.Store(true)
				return ctx.Err()
			}
			time.Sleep(2 * time.Millisecond)
			return nil
		})
		synctest.Wait()
		if err != nil || calls.Load() != 2 || !firstCanceled.Load() {
			t.Fatalf("Run = %v, calls=%d, first canceled=%v", err, calls.Load(), firstCanceled.Load())
		}
		if got := time.Since(start); got != 12*time.Millisecond {
			t.Fatalf("hedged Run took %v, want 12ms (10ms delay + 2ms)", got)
		}
		if got := rec.lines(); !equalLines(got, []string{"hedge-started"}) {
			t.Fatalf("events %v", got)
		}
		if e := rec.events()[0]; e.Attempt != 1 || e.Delay != 10*time.Millisecond {
			t.Fatalf("hedge event %+v", e)
		}

		// A fast attempt is not hedged; both failing returns a failure.
		calls.Store(0)
		err = g.Run(context.Background(), func(ctx context.Context) error { calls.Add(1); return nil })
		if err != nil || calls.Load() != 1 {
			t.Fatalf("fast Run = %v, calls=%d", err, calls.Load())
		}
		calls.Store(0)
		err = g.Run(context.Background(), func(ctx context.Context) error {
			calls.Add(1)
			time.Sleep(time.Second)
			return errFail
		})
		if err != errFail || calls.Load() != 2 {
			t.Fatalf("both failing: %v, calls=%d", err, calls.Load())
		}
		// A panic in a hedged attempt is a failure (it cannot be re-raised
		// on another goroutine).
		err = g.Run(context.Background(), func(ctx context.Context) error { panic("hedged boom") })
		if err == nil || !strings.Contains(err.Error(), "hedged boom") {
			t.Fatalf("hedged panic: %v", err)
		}
	})
}
