package policy_test

import (
	"context"
	"errors"
	"fmt"
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
	d := g.NextRetry(2, errFail, 0)
	if !d.Retry || d.Delay != time.Millisecond || gotAttempt != 2 || gotErr != errFail {
		t.Fatalf("NextRetry = %+v; custom saw %d, %v", d, gotAttempt, gotErr)
	}
}

func TestNextRetryDecisions(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	// A handler whose own downstream guard refused it: its error wraps
	// ErrOpen, but it is the handler's error, not this guard's refusal.
	downstreamOpen := fmt.Errorf("inventory: %w", policy.ErrOpen)
	tests := []struct {
		name     string
		breaker  *policy.Breaker
		budget   *policy.Budget
		trip     bool // open this guard's breaker first
		attempt  int
		err      error
		want     policy.RetryDecision
		retries  uint64 // Stats.Retries after
		rejected uint64 // Stats.Rejected after
	}{
		{name: "retry", attempt: 1, err: errFail, want: policy.RetryDecision{Retry: true, Delay: ms}, retries: 1},
		{name: "retry before the last attempt", attempt: 2, err: errFail, want: policy.RetryDecision{Retry: true, Delay: ms}, retries: 1},
		{name: "attempts used up", attempt: 3, err: errFail, want: policy.RetryDecision{Stop: policy.StopAttempts}},
		{name: "permanent", attempt: 1, err: policy.Permanent(errFail), want: policy.RetryDecision{Stop: policy.StopPermanent}},
		{name: "permanent on the last attempt", attempt: 3, err: policy.Permanent(errFail), want: policy.RetryDecision{Stop: policy.StopPermanent}},
		{name: "no error", attempt: 1, err: nil, want: policy.RetryDecision{}},
		{name: "budget refused", budget: &policy.Budget{MaxTokens: 0.5, MinPerSecond: -1}, attempt: 1, err: errFail,
			want: policy.RetryDecision{Stop: policy.StopBudget}},
		{name: "own breaker open past the backoff", breaker: &policy.Breaker{ConsecutiveFailures: 1}, trip: true, attempt: 1, err: errFail,
			want: policy.RetryDecision{Stop: policy.StopOpen}, rejected: 1},
		{name: "handler error wrapping ErrOpen is retried", breaker: &policy.Breaker{}, attempt: 1, err: downstreamOpen,
			want: policy.RetryDecision{Retry: true, Delay: ms}, retries: 1},
		{name: "handler error wrapping ErrOpen uses up attempts", breaker: &policy.Breaker{}, attempt: 3, err: downstreamOpen,
			want: policy.RetryDecision{Stop: policy.StopAttempts}},
		{name: "permanent handler error wrapping ErrOpen", breaker: &policy.Breaker{}, attempt: 1, err: policy.Permanent(downstreamOpen),
			want: policy.RetryDecision{Stop: policy.StopPermanent}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			budget := tt.budget
			if budget == nil {
				budget = &policy.Budget{Disabled: true}
			}
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{
				Breaker: tt.breaker,
				Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: ms}},
				Budget:  budget,
				Clock:   clk,
			})
			if tt.trip {
				p, _ := g.Allow(context.Background())
				p.Done(errFail)
			}
			if got := g.NextRetry(tt.attempt, tt.err, 0); got != tt.want {
				t.Fatalf("NextRetry = %+v, want %+v", got, tt.want)
			}
			if st := g.Stats(); st.Retries != tt.retries || st.Rejected != tt.rejected {
				t.Fatalf("Retries %d, Rejected %d; want %d, %d", st.Retries, st.Rejected, tt.retries, tt.rejected)
			}
		})
	}
}

// TestRunHandlerErrorWrappingErrOpen: a handler whose error wraps ErrOpen
// (from a guard of its own) is retried like any other error and its error
// is returned: it is not this guard's refusal, whose breaker stays closed.
func TestRunHandlerErrorWrappingErrOpen(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{
			Breaker: &policy.Breaker{ConsecutiveFailures: 10},
			Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
		})
		downstream := fmt.Errorf("inventory: %w", policy.ErrOpen)
		calls := 0
		err := g.Run(context.Background(), func(context.Context) error { calls++; return downstream })
		var oe *policy.OpenError
		if err != downstream || calls != 3 || errors.As(err, &oe) {
			t.Fatalf("Run = %v after %d calls, want the handler's error after 3", err, calls)
		}
		if st := g.Stats(); st.State != policy.Closed || st.Rejected != 0 || st.Failures != 3 || st.Retries != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestStopReasonString(t *testing.T) {
	t.Parallel()
	for s, want := range map[policy.StopReason]string{
		policy.StopNone: "none", policy.StopPermanent: "permanent", policy.StopAttempts: "attempts",
		policy.StopOpen: "open", policy.StopBudget: "budget", 9: "StopReason(9)",
	} {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", s, got, want)
		}
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
	if d := g.NextRetry(1, errFail, 0); d != (policy.RetryDecision{Stop: policy.StopOpen}) {
		t.Fatalf("NextRetry with an open breaker = %+v, want StopOpen", d)
	}
	if st := g.Stats(); st.Tokens != 1 || st.Retries != 0 {
		t.Fatalf("a refused retry spent a token: %+v", st)
	}
	clk.Advance(950 * time.Millisecond) // open for 50ms more, less than the backoff
	if d := g.NextRetry(1, errFail, 0); !d.Retry || d.Delay != 100*time.Millisecond {
		t.Fatalf("NextRetry near the end of the open period = %+v", d)
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
