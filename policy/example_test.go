package policy_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// Default is a template: copy it and change what a tenant needs.
func ExampleDefault() {
	p := policy.Default()
	fmt.Println("breaker:", p.Breaker != nil)
	fmt.Println("attempts:", p.Retry.MaxAttempts)
	fmt.Println("backoff:", p.Retry.Backoff.Kind, p.Retry.Backoff.Base, "to", p.Retry.Backoff.Max)
	fmt.Println("per attempt:", p.AttemptTimeout, "in all:", p.Deadline, "(none)")
	fmt.Println("slow calls are failures:", !p.Breaker.SlowCall.Disabled)

	premium := policy.Default()
	premium.Deadline = 30 * time.Second
	premium.Breaker = &policy.Breaker{ConsecutiveFailures: 10}
	premium.Bulkhead = policy.Bulkhead{MaxConcurrent: 16, Weight: 4}
	fmt.Println("premium deadline:", premium.Deadline)
	// Output:
	// breaker: true
	// attempts: 3
	// backoff: exponential 50ms to 5s
	// per attempt: 10s in all: 0s (none)
	// slow calls are failures: true
	// premium deadline: 30s
}

// New validates a Policy and builds one guard: one tenant's own breaker,
// budget and latency estimate. An invalid field is named in the error.
func ExampleNew() {
	g, err := policy.New(policy.Default())
	if err != nil {
		panic(err)
	}
	fmt.Println(g.State(), g.MaxAttempts())

	bad := policy.Default()
	bad.Breaker = &policy.Breaker{FailureRatio: 1.5}
	_, err = policy.New(bad)
	fmt.Println(errors.Is(err, policy.ErrInvalidPolicy))
	fmt.Println(err)
	// Output:
	// closed 3
	// true
	// policy: invalid Breaker.FailureRatio: must be in (0, 1] or 0 to disable, got 1.5
}

// Run retries a failing handler with backoff and returns on the first
// success.
func ExampleGuard_Run() {
	p := policy.Default()
	p.Retry.Backoff = policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}
	p.OnEvent = func(e policy.Event) {
		if e.Kind == policy.EventRetryScheduled {
			fmt.Printf("attempt %d failed (%v), retrying\n", e.Attempt, e.Err)
		}
	}
	g, err := policy.New(p)
	if err != nil {
		panic(err)
	}
	calls := 0
	err = g.Run(context.Background(), func(ctx context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("connection refused")
		}
		return nil
	})
	fmt.Println("err:", err, "calls:", calls)

	// A permanent error is not retried.
	err = g.Run(context.Background(), func(ctx context.Context) error {
		return policy.Permanent(errors.New("malformed message"))
	})
	fmt.Println("permanent:", policy.IsPermanent(err), err)
	// Output:
	// attempt 1 failed (connection refused), retrying
	// attempt 2 failed (connection refused), retrying
	// err: <nil> calls: 3
	// permanent: true malformed message
}

// fixedClock stands still, so the example's open period prints exactly.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// Allow, Done and NextRetry are the two-step form for an engine that parks
// work instead of blocking: ask for a permit, run the work elsewhere, report
// the outcome, and ask what to do next. The decision is a value: the
// handler's error is only classified, never taken for the guard's refusal.
func ExampleGuard_Allow() {
	p := policy.Default()
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 2, OpenTimeout: 10 * time.Second}
	p.Retry.Backoff = policy.Backoff{Kind: policy.Constant, Base: time.Second}
	p.Clock = fixedClock{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	g, _ := policy.New(p)
	ctx := context.Background()

	for attempt := 1; ; attempt++ {
		permit, err := g.Allow(ctx)
		if err != nil { // refused: park until a probe is admitted
			var open *policy.OpenError
			if errors.As(err, &open) {
				fmt.Println("refused: park for", open.RetryAfter())
			}
			return
		}
		herr := errors.New("timeout") // the handler failed
		permit.Done(herr)
		permit.Done(herr) // a second Done does nothing
		d := g.NextRetry(attempt, herr, 0)
		if !d.Retry {
			fmt.Printf("attempt %d: stop (%v), park for %v\n", attempt, d.Stop, g.RetryAfter())
			return
		}
		fmt.Printf("attempt %d: retry after %v\n", attempt, d.Delay)
	}
	// Output:
	// attempt 1: retry after 1s
	// attempt 2: stop (open), park for 10s
}

// Concurrency and Weight are what a fair scheduler asks of each tenant's
// guard: the units it may have in flight (its own bulkhead, or the engine's
// default) and its share.
func ExampleGuard_Concurrency() {
	premium := policy.Default()
	premium.Bulkhead = policy.Bulkhead{MaxConcurrent: 8, Weight: 4}
	g, _ := policy.New(premium)
	std, _ := policy.New(policy.Default())

	const engineDefault = 2
	fmt.Println("premium:", g.Concurrency(engineDefault), "in flight, weight", g.Weight())
	fmt.Println("standard:", std.Concurrency(engineDefault), "in flight, weight", std.Weight())
	// Output:
	// premium: 8 in flight, weight 4
	// standard: 2 in flight, weight 1
}

// Compile validates a policy once; each guard built from it shares the
// policy and has its own state. A keyed collection of guards (scope.Scope
// does this) builds one guard per tenant this way.
func ExampleCompile() {
	c, err := policy.Compile(policy.Default())
	if err != nil {
		panic(err)
	}
	acme, globex := c.New(), c.New()
	fmt.Println(acme != globex, acme.State(), globex.MaxAttempts())
	// Output:
	// true closed 3
}

// A collection whose keys come and go retires the guard of a key it drops;
// the next guard it builds reuses that state. A caller still holding the
// retired guard is moved to a fresh state of its own, so it cannot touch
// the guard that took its old state.
func ExampleRecycler() {
	p := policy.Default()
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Minute}
	c, err := policy.Compile(p)
	if err != nil {
		panic(err)
	}
	rc := policy.NewRecycler(64)
	ctx := context.Background()

	acme := rc.New(c, nil)
	rc.Retire(acme)          // tenant "acme" evicted...
	globex := rc.New(c, nil) // ...and its state reused for "globex"

	// A handler that still held acme's guard fails through it.
	_ = acme.Run(ctx, func(context.Context) error { return errors.New("boom") })
	fmt.Println("held acme guard:", acme.State())
	fmt.Println("globex guard:", globex.State(), globex.Stats().Failures)
	// Output:
	// held acme guard: open
	// globex guard: closed 0
}
