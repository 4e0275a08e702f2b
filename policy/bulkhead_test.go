package policy_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// hold starts n Runs of g that block until release is closed, and waits
// until all n are in fn.
func hold(t *testing.T, g *policy.Guard, n int, release chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	in := make(chan struct{}, n)
	for range n {
		wg.Go(func() {
			err := g.Run(context.Background(), func(context.Context) error {
				in <- struct{}{}
				<-release
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	for range n {
		<-in
	}
	return &wg
}

func TestBulkheadRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		bulk    policy.Bulkhead
		held    int  // Runs in flight
		refused bool // the next Run is refused
	}{
		{"under the cap", policy.Bulkhead{MaxConcurrent: 3}, 2, false},
		{"at the cap", policy.Bulkhead{MaxConcurrent: 3}, 3, true},
		{"cap of one", policy.Bulkhead{MaxConcurrent: 1}, 1, true},
		{"no cap", policy.Bulkhead{}, 50, false},
		{"weight is no cap", policy.Bulkhead{Weight: 1}, 50, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			g := mustNew(t, policy.Policy{Bulkhead: tt.bulk, OnEvent: rec.event})
			release := make(chan struct{})
			wg := hold(t, g, tt.held, release)
			st := g.Stats()
			wantInFlight := tt.held
			if tt.bulk.MaxConcurrent == 0 {
				wantInFlight = 0 // not counted without a bulkhead
			}
			if st.InFlight != wantInFlight {
				t.Fatalf("InFlight %d, want %d", st.InFlight, wantInFlight)
			}
			called := false
			err := g.Run(context.Background(), func(context.Context) error { called = true; return nil })
			var be *policy.BulkheadError
			if tt.refused {
				if called || !errors.Is(err, policy.ErrBulkheadFull) || !errors.As(err, &be) || be.Limit != tt.bulk.MaxConcurrent {
					t.Fatalf("Run = %v, called %v; want a BulkheadError", err, called)
				}
				if evs := rec.events(); len(evs) != 1 || evs[0].Kind != policy.EventBulkheadFull || evs[0].Err != err {
					t.Fatalf("events %+v", evs)
				}
				if g.Stats().BulkheadFull != 1 {
					t.Fatalf("BulkheadFull %d", g.Stats().BulkheadFull)
				}
			} else if err != nil || !called {
				t.Fatalf("Run = %v, called %v", err, called)
			}
			close(release)
			wg.Wait()
			if err := g.Run(context.Background(), okFn); err != nil || g.Stats().InFlight != 0 {
				t.Fatalf("after the held Runs ended: %v, InFlight %d", err, g.Stats().InFlight)
			}
		})
	}
}

// TestBulkheadReleasedOnPanic: a unit of work that panics gives its slot
// back.
func TestBulkheadReleasedOnPanic(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Bulkhead: policy.Bulkhead{MaxConcurrent: 1}})
	func() {
		defer func() { _ = recover() }()
		_ = g.Run(context.Background(), func(context.Context) error { panic("boom") })
	}()
	if err := g.Run(context.Background(), okFn); err != nil {
		t.Fatalf("Run after a panic: %v", err)
	}
}

// TestBulkheadNotInAllow: the two-step form does not enforce the bulkhead;
// the engine counts its own units and asks Concurrency.
func TestBulkheadNotInAllow(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Bulkhead: policy.Bulkhead{MaxConcurrent: 1}})
	var ps []policy.Permit
	for range 5 {
		p, err := g.Allow(context.Background())
		if err != nil {
			t.Fatalf("Allow refused: %v", err)
		}
		ps = append(ps, p)
	}
	for i := range ps {
		ps[i].Done(nil)
	}
	if st := g.Stats(); st.InFlight != 0 || st.BulkheadFull != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrencyAndWeight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		bulk   policy.Bulkhead
		def    int
		want   int
		weight int
	}{
		{"engine default", policy.Bulkhead{}, 8, 8, 1},
		{"engine default zero", policy.Bulkhead{}, 0, 0, 1},
		{"MaxConcurrent wins", policy.Bulkhead{MaxConcurrent: 3}, 8, 3, 1},
		{"MaxConcurrent above the default", policy.Bulkhead{MaxConcurrent: 30}, 8, 30, 1},
		{"weight", policy.Bulkhead{Weight: 4}, 8, 8, 4},
		{"adaptive starts at the cap", policy.Bulkhead{MaxConcurrent: 5, Adaptive: true}, 8, 5, 1},
		{"adaptive, engine default cap", policy.Bulkhead{Adaptive: true}, 8, 8, 1},
		{"adaptive, no cap at all", policy.Bulkhead{Adaptive: true}, 0, 1000, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := mustNew(t, policy.Policy{Bulkhead: tt.bulk})
			if got := g.Concurrency(tt.def); got != tt.want {
				t.Fatalf("Concurrency(%d) = %d, want %d", tt.def, got, tt.want)
			}
			if got := g.Weight(); got != tt.weight {
				t.Fatalf("Weight() = %d, want %d", got, tt.weight)
			}
		})
	}
}

// feed makes n attempts of duration d through the two-step form.
func feed(g *policy.Guard, clk *fakeClock, d time.Duration, n int) {
	for range n {
		call(g, clk, d, nil)
	}
}

// TestAdaptiveLimit drives the gradient limit with synthetic latencies: it
// holds at the cap while latency is steady, falls when latency rises
// several-fold, and climbs back when latency recovers.
func TestAdaptiveLimit(t *testing.T) {
	t.Parallel()
	const capN = 16
	tests := []struct {
		name    string
		rise    float64 // latency multiplier
		maxDown int     // Concurrency at most this after 100 samples of the rise
		minDown int     // and at least this
	}{
		{"steady", 1, capN, capN},
		{"within tolerance", 1.4, capN, capN},
		{"doubled", 2, 8, 2},
		{"five-fold", 5, 2, 1},
		{"a hundred-fold", 100, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{
				Bulkhead: policy.Bulkhead{MaxConcurrent: capN, Adaptive: true},
				Latency:  policy.Latency{SampleEvery: 1},
				Clock:    clk,
			})
			feed(g, clk, 10*ms, 300)
			if got := g.Concurrency(0); got != capN {
				t.Fatalf("steady: Concurrency %d, want the cap %d", got, capN)
			}
			feed(g, clk, time.Duration(float64(10*ms)*tt.rise), 100)
			got := g.Concurrency(0)
			if got > tt.maxDown || got < tt.minDown {
				t.Fatalf("after the rise: Concurrency %d, want within [%d, %d]", got, tt.minDown, tt.maxDown)
			}
			if st := g.Stats(); st.AdaptiveLimit < 1 || st.AdaptiveLimit > capN || st.AdaptiveLimit != got {
				t.Fatalf("AdaptiveLimit %d, Concurrency %d", st.AdaptiveLimit, got)
			}
			feed(g, clk, 10*ms, 1000)
			if got := g.Concurrency(0); got != capN {
				t.Fatalf("recovered: Concurrency %d, want the cap %d", got, capN)
			}
		})
	}
}

// TestAdaptiveLimitBounded is a property test: whatever the latencies and
// the engine's default, the limit stays within [1, cap].
func TestAdaptiveLimitBounded(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clk := newFakeClock()
		maxC := rng.IntN(3) * rng.IntN(40) // zero a third of the time: the engine's default caps
		g := mustNew(t, policy.Policy{
			Bulkhead: policy.Bulkhead{MaxConcurrent: maxC, Adaptive: true},
			Latency:  policy.Latency{SampleEvery: 1 + rng.IntN(3)},
			Clock:    clk,
		})
		def := 1 + rng.IntN(64)
		for i := range 3000 {
			if rng.IntN(200) == 0 {
				def = rng.IntN(64) - 2 // zero and negative too
			}
			// Log-uniform latencies from 1µs to 10s, in runs.
			d := time.Duration(float64(time.Microsecond) * float64(int64(1)<<rng.IntN(24)))
			feed(g, clk, d, 1+rng.IntN(20))
			base := maxC
			if base == 0 {
				base = def
			}
			if base <= 0 {
				base = 1000
			}
			if got := g.Concurrency(def); got < 1 || got > base {
				t.Fatalf("seed %d step %d: Concurrency(%d) = %d, want within [1, %d]", seed, i, def, got, base)
			}
			if l := g.Stats().AdaptiveLimit; l < 1 || (maxC > 0 && l > maxC) || l > 1000 {
				t.Fatalf("seed %d step %d: AdaptiveLimit %d", seed, i, l)
			}
		}
	}
}

// TestAdaptiveLimitInRun: Run enforces the adaptive limit once it has
// fallen, and Run's own attempts feed it.
func TestAdaptiveLimitInRun(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Bulkhead: policy.Bulkhead{MaxConcurrent: 8, Adaptive: true},
		Latency:  policy.Latency{SampleEvery: 1},
		Clock:    clk,
	})
	run := func(d time.Duration) {
		if err := g.Run(context.Background(), func(context.Context) error { clk.Advance(d); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for range 300 {
		run(ms)
	}
	for range 200 {
		run(50 * ms)
	}
	if got := g.Concurrency(0); got != 1 {
		t.Fatalf("Concurrency %d after a 50-fold rise, want 1", got)
	}
	release := make(chan struct{})
	wg := hold(t, g, 1, release)
	err := g.Run(context.Background(), okFn)
	var be *policy.BulkheadError
	if !errors.As(err, &be) || be.Limit != 1 {
		t.Fatalf("second Run at an adaptive limit of 1: %v", err)
	}
	close(release)
	wg.Wait()
}
