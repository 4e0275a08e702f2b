package policy_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func TestValidationNamesTheField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		field string
		p     policy.Policy
	}{
		{"Breaker.ConsecutiveFailures", policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: -1}}},
		{"Breaker.FailureRatio", policy.Policy{Breaker: &policy.Breaker{FailureRatio: 1.5}}},
		{"Breaker.FailureRatio", policy.Policy{Breaker: &policy.Breaker{FailureRatio: -0.1}}},
		{"Breaker.FailureRatio", policy.Policy{Breaker: &policy.Breaker{FailureRatio: math.NaN()}}},
		{"Breaker.Window", policy.Policy{Breaker: &policy.Breaker{Window: -time.Second}}},
		{"Breaker.Window", policy.Policy{Breaker: &policy.Breaker{Window: 5}}},
		{"Breaker.MinRequests", policy.Policy{Breaker: &policy.Breaker{MinRequests: -1}}},
		{"Breaker.OpenTimeout", policy.Policy{Breaker: &policy.Breaker{OpenTimeout: -1}}},
		{"Breaker.MaxOpenTimeout", policy.Policy{Breaker: &policy.Breaker{MaxOpenTimeout: -1}}},
		{"Breaker.MaxOpenTimeout", policy.Policy{Breaker: &policy.Breaker{OpenTimeout: time.Minute, MaxOpenTimeout: time.Second}}},
		{"Breaker.HalfOpenProbes", policy.Policy{Breaker: &policy.Breaker{HalfOpenProbes: -2}}},
		{"Retry.MaxAttempts", policy.Policy{Retry: policy.Retry{MaxAttempts: -1}}},
		{"Retry.Backoff.Base", policy.Policy{Retry: policy.Retry{Backoff: policy.Backoff{Base: -1}}}},
		{"Retry.Backoff.Max", policy.Policy{Retry: policy.Retry{Backoff: policy.Backoff{Max: -1}}}},
		{"Retry.Backoff.Max", policy.Policy{Retry: policy.Retry{Backoff: policy.Backoff{Base: time.Second, Max: time.Millisecond}}}},
		{"Retry.Backoff.Kind", policy.Policy{Retry: policy.Retry{Backoff: policy.Backoff{Kind: 9}}}},
		{"Retry.Backoff.Custom", policy.Policy{Retry: policy.Retry{Backoff: policy.Backoff{Kind: policy.CustomKind}}}},
		{"Budget.Ratio", policy.Policy{Budget: &policy.Budget{Ratio: 2}}},
		{"Budget.MaxTokens", policy.Policy{Budget: &policy.Budget{MaxTokens: -1}}},
		{"Budget.MaxTokens", policy.Policy{Budget: &policy.Budget{MaxTokens: math.Inf(1)}}},
		{"Budget.MinPerSecond", policy.Policy{Budget: &policy.Budget{MinPerSecond: math.NaN()}}},
		{"Latency.Quantile", policy.Policy{Latency: policy.Latency{Quantile: 1}}},
		{"Latency.Quantile", policy.Policy{Latency: policy.Latency{Quantile: -0.5}}},
		{"Deadline", policy.Policy{Deadline: -time.Second}},
		{"Hedge.MinDelay", policy.Policy{Hedge: policy.Hedge{Enabled: true, MinDelay: -1}}},
		{"Latency.SampleEvery", policy.Policy{Latency: policy.Latency{SampleEvery: -1}}},
		{"AttemptTimeout", policy.Policy{AttemptTimeout: -time.Second}},
		{"Bulkhead.MaxConcurrent", policy.Policy{Bulkhead: policy.Bulkhead{MaxConcurrent: -1}}},
		{"Bulkhead.Weight", policy.Policy{Bulkhead: policy.Bulkhead{Weight: -1}}},
		{"Breaker.SlowCall.Threshold", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Threshold: -1}}}},
		{"Breaker.SlowCall.Factor", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Factor: 0.5}}}},
		{"Breaker.SlowCall.Factor", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Factor: -2}}}},
		{"Breaker.SlowCall.Factor", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Factor: math.NaN()}}}},
		{"Breaker.SlowCall.Factor", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Factor: math.Inf(1)}}}},
		{"Breaker.SlowCall.Floor", policy.Policy{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Floor: -1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			t.Parallel()
			g, err := policy.New(tt.p)
			var ie *policy.InvalidPolicyError
			if g != nil || !errors.Is(err, policy.ErrInvalidPolicy) || !errors.As(err, &ie) {
				t.Fatalf("New = %v, %v; want an InvalidPolicyError", g, err)
			}
			if ie.Field != tt.field || !strings.HasPrefix(err.Error(), "policy: invalid "+tt.field+": ") {
				t.Fatalf("error %q names field %q, want %q", err, ie.Field, tt.field)
			}
		})
	}
}

func TestValidDefaults(t *testing.T) {
	t.Parallel()
	for _, p := range []policy.Policy{
		{},
		policy.Default(),
		{Breaker: &policy.Breaker{}},
		{Breaker: &policy.Breaker{FailureRatio: 1, Window: 10}},
		{Breaker: &policy.Breaker{OpenTimeout: 2 * time.Minute}}, // default cap follows OpenTimeout
		{Retry: policy.Retry{Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Minute}}},
		{Budget: &policy.Budget{Ratio: 1e-9}}, // still earns something
		{Breaker: &policy.Breaker{SlowCall: policy.SlowCall{Factor: 1, Floor: time.Nanosecond}}},
		{Bulkhead: policy.Bulkhead{MaxConcurrent: 1, Weight: 100, Adaptive: true}},
	} {
		if _, err := policy.New(p); err != nil {
			t.Errorf("New(%+v) = %v", p, err)
		}
	}
	g := mustNew(t, policy.Policy{Budget: &policy.Budget{Ratio: 1e-9, MaxTokens: 1, MinPerSecond: -1}})
	_ = g.NextRetry(0, errFail, 0)
	p, _ := g.Allow(context.Background())
	p.Done(nil)
	if tok := g.Stats().Tokens; tok <= 0 {
		t.Fatalf("a tiny ratio earns nothing: %v", tok)
	}
}

func TestDefaultPolicy(t *testing.T) {
	t.Parallel()
	p := policy.Default()
	if p.Breaker == nil || p.Retry.MaxAttempts != 3 || p.Retry.Backoff.Kind != policy.Exponential || p.Budget != nil || p.Deadline != 0 ||
		p.AttemptTimeout != 10*time.Second || p.Hedge.Enabled || p.Breaker.SlowCall != (policy.SlowCall{}) || p.Bulkhead != (policy.Bulkhead{}) {
		t.Fatalf("Default() = %+v", p)
	}
	// A template: changing a copy leaves the next Default alone.
	p.Breaker.ConsecutiveFailures = 9
	if policy.Default().Breaker.ConsecutiveFailures != 0 {
		t.Fatal("Default shares its Breaker between calls")
	}
	p.Budget = &policy.Budget{MaxTokens: 4}
	g := mustNew(t, p)
	p.Breaker.ConsecutiveFailures = 1 // after New: the guard keeps its copy
	p.Budget.MaxTokens = 1
	got := g.Policy()
	if got.Breaker.ConsecutiveFailures != 9 || got.Budget.MaxTokens != 4 || got.Retry.MaxAttempts != 3 {
		t.Fatalf("Policy() = %+v", got)
	}
	got.Breaker.ConsecutiveFailures = 2
	if g.Policy().Breaker.ConsecutiveFailures != 9 {
		t.Fatal("Policy() shares the guard's Breaker")
	}
}

func TestHookOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		g := mustNew(t, policy.Policy{
			Breaker: &policy.Breaker{ConsecutiveFailures: 10},
			Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
			Admit:   func(context.Context) error { rec.add("admit"); return nil },
			BeforeAttempt: func(_ context.Context, attempt int) error {
				rec.add(fmt.Sprintf("before %d", attempt))
				return nil
			},
			OnEvent: rec.event,
		})
		n := 0
		err := g.Run(context.Background(), func(context.Context) error {
			n++
			rec.add(fmt.Sprintf("attempt %d", n))
			if n < 3 {
				return errFail
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"admit", "before 1", "attempt 1", "retry-scheduled", "before 2", "attempt 2", "retry-scheduled", "before 3", "attempt 3"}
		if got := rec.lines(); !equalLines(got, want) {
			t.Fatalf("order\n got %v\nwant %v", got, want)
		}
		evs := rec.events()
		for i, e := range evs {
			if e.Attempt != i+1 || e.Delay != time.Millisecond || e.Err != errFail || e.State != policy.Closed {
				t.Fatalf("event %d = %+v", i, e)
			}
		}
	})
}

func TestAdmitRefuses(t *testing.T) {
	t.Parallel()
	var rec recorder
	errBusy := errors.New("busy")
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{},
		Admit:   func(context.Context) error { return errBusy },
		OnEvent: rec.event,
	})
	called := false
	err := g.Run(context.Background(), func(context.Context) error { called = true; return nil })
	var ae *policy.AdmitError
	if called || !errors.Is(err, policy.ErrAdmitRefused) || !errors.Is(err, errBusy) || !errors.As(err, &ae) {
		t.Fatalf("Run = %v, called=%v", err, called)
	}
	if err.Error() != "policy: admission refused: busy" {
		t.Fatalf("Error() = %q", err.Error())
	}
	if _, err := g.Allow(context.Background()); !errors.Is(err, policy.ErrAdmitRefused) {
		t.Fatalf("Allow = %v", err)
	}
	if got := rec.lines(); !equalLines(got, []string{"admit-refused", "admit-refused"}) {
		t.Fatalf("events %v", got)
	}
}

func TestBeforeAttemptRefusalReleasesProbe(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var refuse atomic.Bool
	errNo := errors.New("not now")
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1},
		BeforeAttempt: func(context.Context, int) error {
			if refuse.Load() {
				return errNo
			}
			return nil
		},
		Clock: clk,
	})
	_ = g.Run(context.Background(), func(context.Context) error { return errFail })
	clk.Advance(5 * time.Second)
	refuse.Store(true)
	for range 3 { // each refusal gives the probe slot back
		if err := g.Run(context.Background(), func(context.Context) error { return nil }); err != errNo {
			t.Fatalf("Run = %v, want BeforeAttempt's error", err)
		}
	}
	refuse.Store(false)
	if err := g.Run(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatalf("probe after refusals: %v", err)
	}
	if g.State() != policy.Closed {
		t.Fatalf("state %v", g.State())
	}
}

func TestRunPanicRecordedAndRaised(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, Retry: policy.Retry{MaxAttempts: 3}})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = g.Run(context.Background(), func(context.Context) error { panic("boom") })
	}()
	if st := g.Stats(); st.Failures != 1 || st.State != policy.Open {
		t.Fatalf("panic not recorded as a failure: %+v", st)
	}
	// runtime.Goexit (t.FailNow in a handler) is recorded, and goes on.
	g2 := mustNew(t, policy.Policy{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g2.Run(context.Background(), func(context.Context) error { runtime.Goexit(); return nil })
	}()
	<-done
	if st := g2.Stats(); st.Failures != 1 {
		t.Fatalf("Goexit not recorded: %+v", st)
	}
}

func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, FailureRatio: 0.3, MinRequests: 20, Window: time.Second,
			OpenTimeout: time.Millisecond, HalfOpenProbes: 2},
		Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Nanosecond}},
		Clock: clk,
	})
	var (
		calls, ok, failed, rejected atomic.Int64
		wg                          sync.WaitGroup
		stop                        = make(chan struct{})
	)
	wg.Go(func() { // the clock moves while work runs, so the breaker cycles
		for {
			select {
			case <-stop:
				return
			default:
				clk.Advance(100 * time.Microsecond)
				runtime.Gosched()
			}
		}
	})
	var workers sync.WaitGroup
	for w := range 8 {
		workers.Go(func() {
			for i := range 2000 {
				fail := (i+w)%3 == 0
				err := g.Run(context.Background(), func(context.Context) error {
					calls.Add(1)
					if fail {
						return errFail
					}
					return nil
				})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, policy.ErrOpen):
					rejected.Add(1)
				default:
					failed.Add(1)
				}
				if i%50 == 0 {
					_ = g.Stats()
					_ = g.State()
					_ = g.RetryAfter()
				}
			}
		})
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	st := g.Stats()
	if ok.Load()+failed.Load()+rejected.Load() != 8*2000 {
		t.Fatal("lost results")
	}
	if st.Successes+st.Failures != uint64(calls.Load()) {
		t.Fatalf("outcomes %d+%d != %d attempts", st.Successes, st.Failures, calls.Load())
	}
	if st.Successes != uint64(ok.Load()) {
		t.Fatalf("successes %d, Run returned nil %d times", st.Successes, ok.Load())
	}
	if st.Generation == 0 {
		t.Fatalf("the breaker never moved: %+v", st)
	}
	if st.Rejected != uint64(rejected.Load()) {
		t.Fatalf("Rejected %d, Run returned ErrOpen %d times", st.Rejected, rejected.Load())
	}
}

func TestStringers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ got, want string }{
		{policy.Closed.String(), "closed"}, {policy.HalfOpen.String(), "half-open"}, {policy.Open.String(), "open"},
		{policy.State(7).String(), "State(7)"},
		{policy.Exponential.String(), "exponential"}, {policy.Constant.String(), "constant"},
		{policy.Linear.String(), "linear"}, {policy.CustomKind.String(), "custom"},
		{policy.BackoffKind(9).String(), "BackoffKind(9)"},
		{policy.EventBreakerOpened.String(), "breaker-opened"}, {policy.EventBreakerHalfOpen.String(), "breaker-half-open"},
		{policy.EventBreakerClosed.String(), "breaker-closed"}, {policy.EventRetryScheduled.String(), "retry-scheduled"},
		{policy.EventBudgetExhausted.String(), "budget-exhausted"}, {policy.EventHedgeStarted.String(), "hedge-started"},
		{policy.EventAdmitRefused.String(), "admit-refused"}, {policy.EventRejected.String(), "rejected"},
		{policy.EventSlowCall.String(), "slow-call"}, {policy.EventBulkheadFull.String(), "bulkhead-full"},
		{(&policy.BulkheadError{Limit: 4}).Error(), "policy: bulkhead full (4 in flight)"},
		{policy.EventKind(0).String(), "EventKind(0)"},
		{(&policy.ExhaustedError{Attempts: 2, Err: errFail}).Error(), "policy: retry budget exhausted after 2 attempt(s): test: dependency failed"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestStatsSnapshot(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 3}, Clock: clk})
	ctx := context.Background()
	p, _ := g.Allow(ctx)
	clk.Advance(4 * time.Millisecond)
	p.Done(nil)
	for range 2 {
		p, _ := g.Allow(ctx)
		p.Done(errFail)
	}
	st := g.Stats()
	// Failures are attempt durations too: two instant ones pull the 4ms
	// estimate down a little.
	if st.Latency <= 3*time.Millisecond || st.Latency >= 4*time.Millisecond {
		t.Fatalf("Latency = %v", st.Latency)
	}
	want := policy.Stats{State: policy.Closed, Successes: 1, Failures: 2, ConsecutiveFailures: 2, Tokens: 10, Latency: st.Latency}
	if st != want {
		t.Fatalf("Stats = %+v\nwant    %+v", st, want)
	}
	p, _ = g.Allow(ctx)
	p.Done(errFail)
	_, _ = g.Allow(ctx)
	st = g.Stats()
	if st.State != policy.Open || st.RetryAfter != 5*time.Second || st.Rejected != 1 || st.Generation != 1 || st.ConsecutiveFailures != 0 {
		t.Fatalf("open Stats = %+v", st)
	}
}

func TestHotPathsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	noTimeout := policy.Default()
	noTimeout.AttemptTimeout = 0
	g := mustNew(t, noTimeout)
	ok := func(context.Context) error { return nil }
	if n := testing.AllocsPerRun(1000, func() { _ = g.Run(ctx, ok) }); n != 0 {
		t.Errorf("Run success path: %v allocs", n)
	}
	// With an AttemptTimeout (Default), attempts share their ctx until one
	// asks for Done: a handler that does not, or only checks Err, costs
	// nothing. One that asks for Done builds the standard context behind
	// its ctx (context.WithDeadline: its timer, channel and record), and the
	// next attempt needs a ctx of its own.
	timed := mustNew(t, policy.Default())
	checksErr := func(ctx context.Context) error { return ctx.Err() }
	if n := testing.AllocsPerRun(1000, func() { _ = timed.Run(ctx, ok) }); n != 0 {
		t.Errorf("Run success path with an AttemptTimeout: %v allocs", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = timed.Run(ctx, checksErr) }); n != 0 {
		t.Errorf("Run success path with an AttemptTimeout, handler checking Err: %v allocs", n)
	}
	waits := func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
			return nil
		}
	}
	t.Logf("Run success path with an AttemptTimeout, handler asking for Done: %v allocs",
		testing.AllocsPerRun(1000, func() { _ = timed.Run(ctx, waits) }))
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := g.Allow(ctx)
		p.Done(nil)
	}); n != 0 {
		t.Errorf("Allow+Done: %v allocs", n)
	}
	p := policy.Default()
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour}
	open := mustNew(t, p)
	_ = open.Run(ctx, func(context.Context) error { return errFail })
	if n := testing.AllocsPerRun(1000, func() {
		if err := open.Run(ctx, ok); err == nil {
			t.Fatal("open breaker ran the handler")
		}
	}); n != 0 {
		t.Errorf("Run rejection path: %v allocs", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = open.Allow(ctx) }); n != 0 {
		t.Errorf("Allow rejection: %v allocs", n)
	}
}

// TestEngineHelpers: the accessors a two-step engine uses.
func TestEngineHelpers(t *testing.T) {
	t.Parallel()
	type key struct{}
	errNo := errors.New("not now")
	var seen []int
	g := mustNew(t, policy.Policy{
		BeforeAttempt: func(ctx context.Context, attempt int) error {
			if ctx.Value(key{}) != "v" {
				return errors.New("wrong ctx")
			}
			seen = append(seen, attempt)
			if attempt > 1 {
				return errNo
			}
			return nil
		},
		Latency: policy.Latency{SampleEvery: 1},
		Clock:   newFakeClock(),
	})
	ctx := context.WithValue(context.Background(), key{}, "v")
	if err := g.BeforeAttempt(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.BeforeAttempt(ctx, 2); err != errNo || len(seen) != 2 || seen[1] != 2 {
		t.Fatalf("BeforeAttempt = %v, saw %v", err, seen)
	}
	if err := mustNew(t, policy.Policy{}).BeforeAttempt(ctx, 1); err != nil {
		t.Fatalf("BeforeAttempt without a hook = %v", err)
	}

	clk := newFakeClock()
	h := mustNew(t, policy.Policy{Latency: policy.Latency{SampleEvery: 1}, Clock: clk})
	if h.Latency() != 0 {
		t.Fatal("a latency before any attempt")
	}
	for range 10 {
		p, _ := h.Allow(ctx)
		clk.Advance(3 * time.Millisecond)
		p.Done(nil)
	}
	if l := h.Latency(); l != 3*time.Millisecond || l != h.Stats().Latency {
		t.Fatalf("Latency() = %v, Stats().Latency = %v; want 3ms", l, h.Stats().Latency)
	}
}
