package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/sony/gobreaker/v2"

	"github.com/ringfence/ringfence/policy"
)

// The benchmarks compare Guard with the executor a user would otherwise
// pick, in one run (from bench/): go test -run '^$' -bench . -benchmem ./policy/
//
// Success: a closed breaker and a handler that succeeds. Ours runs the
// breaker (slow-call check included), retry, budget and latency estimate
// from policy.Default() without its AttemptTimeout, as the other libraries
// time no attempt; "ringfence-default" is policy.Default() as is (each
// attempt under its 10s AttemptTimeout), and "ringfence-attempt-timeout"
// the first with that timeout put back.
// "ringfence-timed" also times every attempt instead of a random one in 8;
// "ringfence-no-slow-call" turns the slow-call check off;
// "ringfence-bulkhead" counts units in flight against MaxConcurrent.
// gobreaker is a breaker alone; failsafe-go composes a retry policy with a
// circuit breaker.
// Rejected: the breaker is open and every call is refused.
// AllowDone: the two-step form an engine uses, Allow then Permit.Done.

var errBench = errors.New("bench: failure")

func okFn(context.Context) error { return nil }
func okPlain() error             { return nil }
func okGB() (struct{}, error)    { return struct{}{}, nil }

func benchPolicy() policy.Policy {
	p := policy.Default()
	p.Breaker = &policy.Breaker{OpenTimeout: time.Hour, MaxOpenTimeout: time.Hour}
	p.AttemptTimeout = 0
	return p
}

func benchGuardOf(b *testing.B, p policy.Policy) *policy.Guard {
	b.Helper()
	g, err := policy.New(p)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

func benchGuard(b *testing.B) *policy.Guard { return benchGuardOf(b, benchPolicy()) }

func benchGuardDefault(b *testing.B) *policy.Guard { return benchGuardOf(b, policy.Default()) }

func benchGuardAttemptTimeout(b *testing.B) *policy.Guard {
	p := benchPolicy()
	p.AttemptTimeout = policy.Default().AttemptTimeout
	return benchGuardOf(b, p)
}

func benchGuardNoSlowCall(b *testing.B) *policy.Guard {
	p := benchPolicy()
	p.Breaker.SlowCall.Disabled = true
	return benchGuardOf(b, p)
}

func benchGuardBulkhead(b *testing.B) *policy.Guard {
	p := benchPolicy()
	p.Bulkhead.MaxConcurrent = 1000
	return benchGuardOf(b, p)
}

// benchGuardRecycled is benchGuard built by a Recycler, as a scope builds
// its guards: every call counts itself in and out of the recyclable state.
func benchGuardRecycled(b *testing.B) *policy.Guard {
	b.Helper()
	c, err := policy.Compile(benchPolicy())
	if err != nil {
		b.Fatal(err)
	}
	return policy.NewRecycler(1).New(c, nil)
}

func benchGuardTimed(b *testing.B) *policy.Guard {
	p := benchPolicy()
	p.Latency.SampleEvery = 1
	return benchGuardOf(b, p)
}

func benchGobreaker() *gobreaker.CircuitBreaker[struct{}] {
	return gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{Name: "bench", Timeout: time.Hour})
}

// benchFailsafe composes a retry policy (3 attempts, exponential backoff,
// no retry on an open breaker, like ours) with a circuit breaker.
func benchFailsafe(open bool) failsafe.Executor[any] {
	rp := retrypolicy.NewBuilder[any]().WithMaxAttempts(3).
		WithBackoff(50*time.Millisecond, 5*time.Second).
		AbortOnErrors(circuitbreaker.ErrOpen).Build()
	cb := circuitbreaker.NewBuilder[any]().WithFailureThreshold(5).WithDelay(time.Hour).Build()
	if open {
		cb.Open()
	}
	return failsafe.With[any](rp, cb)
}

func BenchmarkSuccess(b *testing.B) {
	ctx := context.Background()
	// Three guards, each called directly in the loop: the default one, the
	// same built by a Recycler (what scope.For returns), and the same with
	// every attempt timed for the latency estimate (Latency.SampleEvery = 1:
	// two clock reads per attempt).
	for _, v := range []struct {
		name  string
		guard func(*testing.B) *policy.Guard
	}{
		{"ringfence", benchGuard},
		{"ringfence-default", benchGuardDefault},
		{"ringfence-recycled", benchGuardRecycled},
		{"ringfence-timed", benchGuardTimed},
		{"ringfence-attempt-timeout", benchGuardAttemptTimeout},
		{"ringfence-no-slow-call", benchGuardNoSlowCall},
		{"ringfence-bulkhead", benchGuardBulkhead},
	} {
		b.Run(v.name+"/serial", func(b *testing.B) {
			g := v.guard(b)
			b.ReportAllocs()
			for b.Loop() {
				if err := g.Run(ctx, okFn); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(v.name+"/parallel", func(b *testing.B) {
			g := v.guard(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := g.Run(ctx, okFn); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("gobreaker/serial", func(b *testing.B) {
		cb := benchGobreaker()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cb.Execute(okGB); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gobreaker/parallel", func(b *testing.B) {
		cb := benchGobreaker()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := cb.Execute(okGB); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("failsafe/serial", func(b *testing.B) {
		ex := benchFailsafe(false)
		b.ReportAllocs()
		for b.Loop() {
			if err := ex.Run(okPlain); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("failsafe/parallel", func(b *testing.B) {
		ex := benchFailsafe(false)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := ex.Run(okPlain); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkRejected(b *testing.B) {
	ctx := context.Background()
	openGuard := func(b *testing.B) *policy.Guard {
		g := benchGuard(b)
		for g.State() != policy.Open {
			p, _ := g.Allow(ctx)
			p.Done(errBench)
		}
		return g
	}
	openGobreaker := func(b *testing.B) *gobreaker.CircuitBreaker[struct{}] {
		cb := benchGobreaker()
		for cb.State() != gobreaker.StateOpen {
			_, _ = cb.Execute(func() (struct{}, error) { return struct{}{}, errBench })
		}
		return cb
	}
	// The loops check only err != nil, the same for every library; each
	// breaker's refusal is checked once before.
	check := func(b *testing.B, err error) {
		if err == nil {
			b.Fatal("rejection path ran the handler")
		}
	}
	b.Run("ringfence/serial", func(b *testing.B) {
		g := openGuard(b)
		if err := g.Run(ctx, okFn); !errors.Is(err, policy.ErrOpen) {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			check(b, g.Run(ctx, okFn))
		}
	})
	b.Run("ringfence/parallel", func(b *testing.B) {
		g := openGuard(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := g.Run(ctx, okFn); err == nil {
					b.Error("handler ran")
					return
				}
			}
		})
	})
	b.Run("gobreaker/serial", func(b *testing.B) {
		cb := openGobreaker(b)
		if _, err := cb.Execute(okGB); !errors.Is(err, gobreaker.ErrOpenState) {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			_, err := cb.Execute(okGB)
			check(b, err)
		}
	})
	b.Run("gobreaker/parallel", func(b *testing.B) {
		cb := openGobreaker(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := cb.Execute(okGB); err == nil {
					b.Error("handler ran")
					return
				}
			}
		})
	})
	b.Run("failsafe/serial", func(b *testing.B) {
		ex := benchFailsafe(true)
		if err := ex.Run(okPlain); !errors.Is(err, circuitbreaker.ErrOpen) {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			check(b, ex.Run(okPlain))
		}
	})
	b.Run("failsafe/parallel", func(b *testing.B) {
		ex := benchFailsafe(true)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := ex.Run(okPlain); err == nil {
					b.Error("handler ran")
					return
				}
			}
		})
	})
}

func BenchmarkAllowDone(b *testing.B) {
	// A guard from a scope, as the consumer's worker uses it: Allow per
	// attempt, or a Batch over a run of 8 attempts (policy.Batch).
	for _, bc := range []struct {
		name  string
		guard func(*testing.B) *policy.Guard
		batch int // attempts per policy.Batch; 0: Guard.Allow
	}{
		{"ringfence", benchGuard, 0},
		{"ringfence-recycled", benchGuardRecycled, 0},
		{"ringfence-recycled-batch8", benchGuardRecycled, 8},
	} {
		b.Run(bc.name+"/serial", func(b *testing.B) {
			g := bc.guard(b)
			b.ReportAllocs()
			var run policy.Batch
			for i := 0; b.Loop(); i++ {
				if !allowDone(b, g, &run, bc.batch, i) {
					return
				}
			}
			run.End()
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			g := bc.guard(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var run policy.Batch
				for i := 0; pb.Next(); i++ {
					if !allowDone(b, g, &run, bc.batch, i) {
						return
					}
				}
				run.End()
			})
		})
	}
}

// allowDone makes attempt i: Allow then Done(nil) on g, through run, a
// policy.Batch renewed every batch attempts, if batch > 0.
func allowDone(b *testing.B, g *policy.Guard, run *policy.Batch, batch, i int) bool {
	var p policy.Permit
	var err error
	if batch > 0 {
		if i%batch == 0 {
			run.End()
			*run = g.Batch()
		}
		p, err = run.Allow(context.Background())
	} else {
		p, err = g.Allow(context.Background())
	}
	if err != nil {
		b.Error(err)
		return false
	}
	p.Done(nil)
	return true
}
