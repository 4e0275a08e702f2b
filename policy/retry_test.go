package policy_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name    string
		backoff policy.Backoff
		attempt int
		prev    time.Duration
		lo, hi  time.Duration // inclusive bounds of every sample
	}{
		{"exponential first retry in [Base, 3*Base]", policy.Backoff{Base: 10 * ms, Max: time.Second}, 1, 0, 10 * ms, 30 * ms},
		{"exponential decorrelated from prev", policy.Backoff{Base: 10 * ms, Max: time.Second}, 2, 100 * ms, 10 * ms, 300 * ms},
		{"exponential prev below Base counts as Base", policy.Backoff{Base: 10 * ms, Max: time.Second}, 2, ms, 10 * ms, 30 * ms},
		{"exponential capped at Max", policy.Backoff{Base: 10 * ms, Max: 50 * ms}, 5, 40 * ms, 10 * ms, 50 * ms},
		{"exponential prev above Max", policy.Backoff{Base: 10 * ms, Max: 50 * ms}, 5, time.Hour, 10 * ms, 50 * ms},
		{"exponential huge Max does not overflow", policy.Backoff{Base: ms, Max: math.MaxInt64}, 9, math.MaxInt64 / 2, ms, math.MaxInt64},
		{"exponential Base equals Max", policy.Backoff{Base: 7 * ms, Max: 7 * ms}, 3, 7 * ms, 7 * ms, 7 * ms},
		{"exponential defaults", policy.Backoff{}, 1, 0, 50 * ms, 150 * ms},
		{"constant", policy.Backoff{Kind: policy.Constant, Base: 20 * ms}, 7, time.Hour, 20 * ms, 20 * ms},
		{"constant Base above the default Max", policy.Backoff{Kind: policy.Constant, Base: 10 * time.Second}, 2, 0, 10 * time.Second, 10 * time.Second},
		{"linear attempt 1", policy.Backoff{Kind: policy.Linear, Base: 20 * ms, Max: time.Second}, 1, 0, 20 * ms, 20 * ms},
		{"linear attempt 4", policy.Backoff{Kind: policy.Linear, Base: 20 * ms, Max: time.Second}, 4, 0, 80 * ms, 80 * ms},
		{"linear capped", policy.Backoff{Kind: policy.Linear, Base: 20 * ms, Max: 50 * ms}, 4, 0, 50 * ms, 50 * ms},
		{"linear overflow capped", policy.Backoff{Kind: policy.Linear, Base: time.Hour, Max: 2 * time.Hour}, math.MaxInt32 * 4, 0, 2 * time.Hour, 2 * time.Hour},
		{"custom", policy.Backoff{Custom: func(a int, err error) time.Duration { return time.Duration(a) * ms }, Max: time.Second}, 3, 0, 3 * ms, 3 * ms},
		{"custom capped at Max", policy.Backoff{Kind: policy.CustomKind, Custom: func(int, error) time.Duration { return time.Hour }, Max: time.Second}, 3, 0, time.Second, time.Second},
		{"custom negative is zero", policy.Backoff{Custom: func(int, error) time.Duration { return -time.Hour }}, 1, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 3, Backoff: tt.backoff}})
			seen := map[time.Duration]bool{}
			for range 2000 {
				d := g.Backoff(tt.attempt, errFail, tt.prev)
				if d < tt.lo || d > tt.hi {
					t.Fatalf("Backoff = %v, want within [%v, %v]", d, tt.lo, tt.hi)
				}
				seen[d] = true
			}
			// Jitter must actually spread over the range.
			if tt.hi-tt.lo > time.Millisecond && len(seen) < 100 {
				t.Fatalf("only %d distinct waits over [%v, %v]", len(seen), tt.lo, tt.hi)
			}
		})
	}
}

func TestBackoffCustomGetsAttemptAndError(t *testing.T) {
	t.Parallel()
	var gotAttempt int
	var gotErr error
	g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 5, Backoff: policy.Backoff{
		Custom: func(a int, err error) time.Duration { gotAttempt, gotErr = a, err; return time.Millisecond },
	}}, Budget: &policy.Budget{Disabled: true}})
	d, err := g.NextRetry(2, errFail, 0)
	if err != nil || d != time.Millisecond || gotAttempt != 2 || gotErr != errFail {
		t.Fatalf("NextRetry = %v, %v; custom saw %d, %v", d, err, gotAttempt, gotErr)
	}
}

func TestNextRetryDecisions(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{
		Retry:  policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
		Budget: &policy.Budget{Disabled: true},
	})
	if g.MaxAttempts() != 3 {
		t.Fatalf("MaxAttempts = %d", g.MaxAttempts())
	}
	if d, err := g.NextRetry(1, errFail, 0); err != nil || d != time.Millisecond {
		t.Fatalf("attempt 1: %v, %v", d, err)
	}
	if d, err := g.NextRetry(2, errFail, 0); err != nil || d != time.Millisecond {
		t.Fatalf("attempt 2: %v, %v", d, err)
	}
	if _, err := g.NextRetry(3, errFail, 0); err != errFail {
		t.Fatalf("last attempt: %v, want the attempt's error", err)
	}
	perm := policy.Permanent(errFail)
	if _, err := g.NextRetry(1, perm, 0); err != perm {
		t.Fatalf("permanent: %v", err)
	}
	if st := g.Stats(); st.Retries != 2 {
		t.Fatalf("Retries = %d, want 2", st.Retries)
	}
}

func TestNextRetryOpenBreakerParks(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Second},
		Retry:   policy.Retry{MaxAttempts: 5, Backoff: policy.Backoff{Kind: policy.Constant, Base: 100 * time.Millisecond}},
		Budget:  &policy.Budget{MaxTokens: 1, MinPerSecond: -1},
		Clock:   clk,
	})
	p, _ := g.Allow(context.Background())
	p.Done(errFail)
	_, err := g.NextRetry(1, errFail, 0)
	if !errors.Is(err, policy.ErrOpen) {
		t.Fatalf("NextRetry with an open breaker = %v, want ErrOpen", err)
	}
	if st := g.Stats(); st.Tokens != 1 || st.Retries != 0 {
		t.Fatalf("a refused retry spent a token: %+v", st)
	}
	clk.Advance(950 * time.Millisecond) // open for 50ms more, less than the backoff
	if d, err := g.NextRetry(1, errFail, 0); err != nil || d != 100*time.Millisecond {
		t.Fatalf("NextRetry near the end of the open period = %v, %v", d, err)
	}
}

func TestBudgetArithmetic(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var rec recorder
	g := mustNew(t, policy.Policy{
		Retry:   policy.Retry{MaxAttempts: 100, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
		Budget:  &policy.Budget{Ratio: 0.25, MaxTokens: 3, MinPerSecond: -1},
		Clock:   clk,
		OnEvent: rec.event,
	})
	ctx := context.Background()
	succeed := func(n int) {
		for range n {
			p, _ := g.Allow(ctx)
			p.Done(nil)
		}
	}
	retry := func() bool {
		_, err := g.NextRetry(1, errFail, 0)
		if err != nil {
			var ee *policy.ExhaustedError
			if !errors.As(err, &ee) || !errors.Is(err, policy.ErrBudgetExhausted) || !errors.Is(err, errFail) || ee.Attempts != 1 {
				t.Fatalf("refusal %v, want an ExhaustedError wrapping the failure", err)
			}
			return false
		}
		return true
	}
	tokens := func(want float64) {
		t.Helper()
		if got := g.Stats().Tokens; math.Abs(got-want) > 1e-9 {
			t.Fatalf("Tokens = %v, want %v", got, want)
		}
	}
	tokens(3) // starts full
	for i := range 3 {
		if !retry() {
			t.Fatalf("retry %d refused with tokens left", i)
		}
	}
	tokens(0)
	if retry() {
		t.Fatal("retry allowed with an empty bucket and no floor")
	}
	succeed(3) // 0.75 tokens: not a whole one
	tokens(0.75)
	if retry() {
		t.Fatal("retry allowed with 0.75 tokens")
	}
	succeed(1)
	tokens(1)
	if !retry() {
		t.Fatal("retry refused with one token")
	}
	succeed(100) // capped at MaxTokens
	tokens(3)
	var kinds []policy.EventKind
	for _, e := range rec.events() {
		kinds = append(kinds, e.Kind)
	}
	var exhausted, scheduled int
	for _, k := range kinds {
		switch k {
		case policy.EventBudgetExhausted:
			exhausted++
		case policy.EventRetryScheduled:
			scheduled++
		}
	}
	if exhausted != 2 || scheduled != 4 {
		t.Fatalf("events: %d exhausted, %d scheduled; want 2 and 4", exhausted, scheduled)
	}
}

func TestBudgetFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		perSec  float64
		advance time.Duration
		want    int // retries allowed after the advance
	}{
		{"full at start: one second's worth", 2, 0, 2},
		{"half a second at 2/s", 2, 500 * time.Millisecond, 1},
		{"refill capped at one second", 2, time.Hour, 2},
		{"below 1/s: capped at one retry", 0.5, time.Hour, 1},
		{"below 1/s: partial refill is not a retry", 0.5, time.Second, 0},
		{"below 1/s: full refill", 0.5, 2 * time.Second, 1},
		{"default floor is 1/s", 0, time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{
				Retry:  policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
				Budget: &policy.Budget{MaxTokens: 0.5, MinPerSecond: tt.perSec},
				Clock:  clk,
			})
			if tt.advance > 0 { // drain the floor first, then let it refill
				for {
					if _, err := g.NextRetry(1, errFail, 0); err != nil {
						break
					}
				}
				clk.Advance(tt.advance)
			}
			got := 0
			for got < 100 {
				if _, err := g.NextRetry(1, errFail, 0); err != nil {
					break
				}
				got++
			}
			if got != tt.want {
				t.Fatalf("%d retries from the floor, want %d", got, tt.want)
			}
		})
	}
}

func TestBudgetFloorAccruesUnderFrequentCalls(t *testing.T) {
	t.Parallel()
	// Refused retries every 100µs must not keep resetting the refill.
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Retry:  policy.Retry{MaxAttempts: 2},
		Budget: &policy.Budget{MaxTokens: 0.5, MinPerSecond: 1},
		Clock:  clk,
	})
	allowed := 0
	for range 20001 { // two seconds, both ends included
		if _, err := g.NextRetry(1, errFail, 0); err == nil {
			allowed++
		}
		clk.Advance(100 * time.Microsecond)
	}
	if allowed != 3 { // the initial one, then one per second
		t.Fatalf("%d floor retries over 2s at 1/s, want 3", allowed)
	}
}

func TestBudgetDisabledAndPerGuard(t *testing.T) {
	t.Parallel()
	off := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 2}, Budget: &policy.Budget{Disabled: true}})
	for i := range 1000 {
		if _, err := off.NextRetry(1, errFail, 0); err != nil {
			t.Fatalf("retry %d refused with the budget disabled: %v", i, err)
		}
	}
	// Two guards from one policy: A spending its tokens leaves B's alone.
	p := policy.Policy{Retry: policy.Retry{MaxAttempts: 2}, Budget: &policy.Budget{MaxTokens: 2, MinPerSecond: -1}}
	a, b := mustNew(t, p), mustNew(t, p)
	for range 5 {
		_, _ = a.NextRetry(1, errFail, 0)
	}
	if a.Stats().Tokens != 0 || b.Stats().Tokens != 2 {
		t.Fatalf("tokens a=%v b=%v, want 0 and 2", a.Stats().Tokens, b.Stats().Tokens)
	}
}

func TestRunRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 4,
			Backoff: policy.Backoff{Kind: policy.Linear, Base: 10 * time.Millisecond}}})
		calls := 0
		start := time.Now()
		err := g.Run(context.Background(), func(context.Context) error {
			calls++
			if calls < 3 {
				return errFail
			}
			return nil
		})
		if err != nil || calls != 3 {
			t.Fatalf("Run = %v after %d calls", err, calls)
		}
		if got := time.Since(start); got != 30*time.Millisecond { // 10ms + 20ms, fake time
			t.Fatalf("waited %v, want 30ms of backoff", got)
		}
	})
}

func TestRunPermanentNotRetried(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 5}})
	calls := 0
	err := g.Run(context.Background(), func(context.Context) error { calls++; return policy.Permanent(errFail) })
	if calls != 1 || !policy.IsPermanent(err) || !errors.Is(err, errFail) {
		t.Fatalf("Run = %v after %d calls", err, calls)
	}
	if err.Error() != errFail.Error() {
		t.Fatalf("PermanentError text %q", err.Error())
	}
	if policy.Permanent(nil) != nil || policy.IsPermanent(errFail) {
		t.Fatal("Permanent(nil) or IsPermanent of a plain error")
	}
}

func TestRunExhaustsAttempts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 3}})
		calls := 0
		err := g.Run(context.Background(), func(context.Context) error { calls++; return errFail })
		if err != errFail || calls != 3 {
			t.Fatalf("Run = %v after %d calls, want errFail after 3", err, calls)
		}
	})
}

func TestRunBudgetExhausted(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{
			Retry:  policy.Retry{MaxAttempts: 10, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
			Budget: &policy.Budget{MaxTokens: 2, MinPerSecond: -1},
		})
		calls := 0
		err := g.Run(context.Background(), func(context.Context) error { calls++; return errFail })
		var ee *policy.ExhaustedError
		if !errors.As(err, &ee) || ee.Attempts != 3 || calls != 3 || !errors.Is(err, errFail) {
			t.Fatalf("Run = %v after %d calls, want exhausted after 3", err, calls)
		}
	})
}

func TestRunDeadlineAcrossAttempts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{
			Deadline: 100 * time.Millisecond,
			Retry:    policy.Retry{MaxAttempts: 100, Backoff: policy.Backoff{Kind: policy.Constant, Base: 30 * time.Millisecond}},
			Budget:   &policy.Budget{Disabled: true},
		})
		start := time.Now()
		var deadlines []time.Duration
		err := g.Run(context.Background(), func(ctx context.Context) error {
			dl, _ := ctx.Deadline()
			deadlines = append(deadlines, dl.Sub(start))
			time.Sleep(10 * time.Millisecond)
			return errFail
		})
		// Attempts end at 10, 50, 90ms; a 30ms wait from 90ms would pass 100ms.
		if len(deadlines) != 3 {
			t.Fatalf("%d attempts, want 3", len(deadlines))
		}
		for i, d := range deadlines {
			if d != 100*time.Millisecond {
				t.Fatalf("attempt %d saw deadline +%v, want one deadline for all attempts (+100ms)", i+1, d)
			}
		}
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errFail) {
			t.Fatalf("Run = %v, want the failure joined with DeadlineExceeded", err)
		}
		if got := time.Since(start); got != 90*time.Millisecond {
			t.Fatalf("Run took %v, want 90ms (no wait that outlives the deadline)", got)
		}
	})
}

func TestRunDeadlineEndsAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{Deadline: 50 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 5}})
		start := time.Now()
		calls := 0
		err := g.Run(context.Background(), func(ctx context.Context) error {
			calls++
			<-ctx.Done()
			return ctx.Err()
		})
		if calls != 1 || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("Run = %v after %d calls and %v", err, calls, time.Since(start))
		}
		// A handler that ignores ctx: its error comes back joined with ctx's.
		err = g.Run(context.Background(), func(ctx context.Context) error {
			time.Sleep(time.Second)
			return errFail
		})
		if !errors.Is(err, errFail) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestRunCancelInterruptsBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{Retry: policy.Retry{MaxAttempts: 3,
			Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Hour, Max: time.Hour}}})
		ctx, cancel := context.WithCancel(context.Background())
		var calls atomic.Int32
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			done <- g.Run(ctx, func(context.Context) error { calls.Add(1); return errFail })
		}()
		synctest.Wait() // Run is now blocked in its 1h backoff
		if calls.Load() != 1 {
			t.Fatalf("%d calls before the backoff", calls.Load())
		}
		cancel()
		err := <-done
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("cancel took %v of (fake) time to interrupt the backoff", waited)
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, errFail) || calls.Load() != 1 {
			t.Fatalf("Run = %v after %d calls", err, calls.Load())
		}
	})
}

func TestRunCanceledBeforeStart(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := g.Run(ctx, func(context.Context) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Fatalf("Run on a done ctx = %v, called=%v", err, called)
	}
}

func TestRunBreakerOpensMidRetry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		g := mustNew(t, policy.Policy{
			Breaker: &policy.Breaker{ConsecutiveFailures: 2},
			Retry:   policy.Retry{MaxAttempts: 5, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
			OnEvent: rec.event,
		})
		calls := 0
		start := time.Now()
		err := g.Run(context.Background(), func(context.Context) error { calls++; return errFail })
		var oe *policy.OpenError
		if !errors.As(err, &oe) || calls != 2 {
			t.Fatalf("Run = %v after %d calls, want ErrOpen after 2", err, calls)
		}
		if time.Since(start) != time.Millisecond {
			t.Fatalf("waited %v; only the first backoff should run", time.Since(start))
		}
		want := []string{"retry-scheduled", "breaker-opened", "rejected"}
		if got := rec.lines(); !equalLines(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		// Once open, Run refuses at once without calling fn.
		if err := g.Run(context.Background(), func(context.Context) error { calls++; return nil }); !errors.Is(err, policy.ErrOpen) || calls != 2 {
			t.Fatalf("Run on an open breaker = %v", err)
		}
	})
}
