package policy_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// TestRunAttemptTimeout: each attempt's ctx ends at min(AttemptTimeout,
// what is left of the Deadline); an attempt its timeout ends is a failure,
// counted by the breaker and retried.
func TestRunAttemptTimeout(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name      string
		attempt   time.Duration // AttemptTimeout
		deadline  time.Duration // Deadline
		breaker   *policy.Breaker
		deadlines []time.Duration // each attempt's ctx deadline, from the start
		took      time.Duration   // Run's duration
		openErr   bool            // Run returns an OpenError
		joined    bool            // Run's error joins the Deadline's
	}{
		// AttemptTimeout 128ms: each attempt's deadline is AttemptTimeout
		// plus the 1ms (AttemptTimeout/128) within which later attempts may
		// share its ctx.
		{name: "attempt timeout only", attempt: 128 * ms,
			deadlines: []time.Duration{129 * ms, 268 * ms, 407 * ms}, took: 407 * ms},
		{name: "deadline cuts the last attempt", attempt: 128 * ms, deadline: 300 * ms,
			deadlines: []time.Duration{129 * ms, 268 * ms, 300 * ms}, took: 300 * ms, joined: true},
		{name: "deadline only: one attempt", deadline: 250 * ms,
			deadlines: []time.Duration{250 * ms}, took: 250 * ms},
		{name: "deadline shorter than the attempt timeout", attempt: time.Second, deadline: 150 * ms,
			deadlines: []time.Duration{150 * ms}, took: 150 * ms},
		{name: "one timeout trips the breaker", attempt: 128 * ms, breaker: &policy.Breaker{ConsecutiveFailures: 5},
			deadlines: []time.Duration{129 * ms}, took: 129 * ms, openErr: true},
		{name: "timeouts as ordinary failures trip the breaker", attempt: 128 * ms, breaker: &policy.Breaker{ConsecutiveFailures: 2, TimeoutFailures: 1},
			deadlines: []time.Duration{129 * ms, 268 * ms}, took: 268 * ms, openErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				g := mustNew(t, policy.Policy{
					Breaker:        tt.breaker,
					Retry:          policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: 10 * ms}},
					Budget:         &policy.Budget{Disabled: true},
					Deadline:       tt.deadline,
					AttemptTimeout: tt.attempt,
				})
				if g.AttemptTimeout() != tt.attempt || g.Deadline() != tt.deadline {
					t.Fatalf("accessors %v, %v", g.AttemptTimeout(), g.Deadline())
				}
				start := time.Now()
				var got []time.Duration
				err := g.Run(context.Background(), func(ctx context.Context) error {
					dl, ok := ctx.Deadline()
					if !ok {
						t.Error("attempt ctx without a deadline")
					}
					got = append(got, dl.Sub(start))
					<-ctx.Done() // a hanging dependency
					return ctx.Err()
				})
				if len(got) != len(tt.deadlines) {
					t.Fatalf("attempt deadlines %v, want %v", got, tt.deadlines)
				}
				for i := range got {
					if got[i] != tt.deadlines[i] {
						t.Fatalf("attempt deadlines %v, want %v", got, tt.deadlines)
					}
				}
				if took := time.Since(start); took != tt.took {
					t.Fatalf("Run took %v, want %v", took, tt.took)
				}
				var oe *policy.OpenError
				if errors.As(err, &oe) != tt.openErr || !errors.Is(err, context.DeadlineExceeded) && !tt.openErr {
					t.Fatalf("Run = %v", err)
				}
				if !tt.openErr && !errors.Is(err, policy.ErrAttemptTimeout) && tt.deadline == 0 {
					t.Fatalf("Run = %v, want an attempt timeout", err)
				}
				if st := g.Stats(); st.Failures != uint64(len(tt.deadlines)) {
					t.Fatalf("%d failures counted, want %d (a timed-out attempt is a failure)", st.Failures, len(tt.deadlines))
				}
			})
		})
	}
}

// TestRunAttemptTimeoutIgnored: an attempt that ignores its ctx and
// succeeds after its timeout is a success (the work was done).
func TestRunAttemptTimeoutIgnored(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{AttemptTimeout: 10 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 3}})
		calls := 0
		err := g.Run(context.Background(), func(context.Context) error {
			calls++
			time.Sleep(time.Second)
			return nil
		})
		if err != nil || calls != 1 {
			t.Fatalf("Run = %v after %d calls", err, calls)
		}
	})
}

// TestAttemptContext checks the attempt ctx against the context contract:
// values from the parent, no error until it ends, DeadlineExceeded at its
// deadline (also for children and context.Cause), Canceled once the
// attempt is over, and the parent ending it.
func TestAttemptContext(t *testing.T) {
	t.Parallel()
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, policy.Policy{AttemptTimeout: 100 * time.Millisecond})
		parent := context.WithValue(context.Background(), key{}, "v")

		// Deadline and values before anything asks for Done.
		start := time.Now()
		ctx, cancel := g.AttemptContext(parent)
		if dl, ok := ctx.Deadline(); !ok || dl.Sub(start) != 100*time.Millisecond {
			t.Fatalf("Deadline = %v, %v", dl, ok)
		}
		if ctx.Value(key{}) != "v" || ctx.Err() != nil {
			t.Fatalf("Value %v, Err %v", ctx.Value(key{}), ctx.Err())
		}
		child, stop := context.WithCancel(ctx)
		defer stop()
		<-ctx.Done()
		if time.Since(start) != 100*time.Millisecond || ctx.Err() != context.DeadlineExceeded {
			t.Fatalf("ended after %v with %v", time.Since(start), ctx.Err())
		}
		<-child.Done()
		if child.Err() != context.DeadlineExceeded || context.Cause(child) != context.DeadlineExceeded || context.Cause(ctx) != context.DeadlineExceeded {
			t.Fatalf("child %v, causes %v, %v", child.Err(), context.Cause(child), context.Cause(ctx))
		}
		if ctx.Value(key{}) != "v" {
			t.Fatal("value lost once built")
		}
		cancel()
		cancel()

		// Ended by the attempt, before and after anything asked for Done.
		for _, early := range []bool{true, false} {
			ctx, cancel := g.AttemptContext(parent)
			if early {
				_ = ctx.Done()
			}
			cancel()
			select {
			case <-ctx.Done():
			default:
				t.Fatalf("early=%v: not done after cancel", early)
			}
			if ctx.Err() != context.Canceled {
				t.Fatalf("early=%v: Err %v after cancel", early, ctx.Err())
			}
		}

		// Ended by its parent.
		pctx, pcancel := context.WithCancel(parent)
		ctx, cancel = g.AttemptContext(pctx)
		defer cancel()
		done := ctx.Done()
		pcancel()
		<-done
		if ctx.Err() != context.Canceled {
			t.Fatalf("Err %v after the parent was canceled", ctx.Err())
		}

		// A parent deadline earlier than the attempt's wins.
		pctx, pcancel = context.WithTimeout(parent, 30*time.Millisecond)
		defer pcancel()
		start = time.Now()
		ctx, cancel = g.AttemptContext(pctx)
		defer cancel()
		if dl, _ := ctx.Deadline(); dl.Sub(start) != 30*time.Millisecond {
			t.Fatalf("Deadline %v after start, want the parent's 30ms", dl.Sub(start))
		}
	})
	// No AttemptTimeout: the ctx itself.
	g := mustNew(t, policy.Policy{})
	ctx := context.Background()
	got, cancel := g.AttemptContext(ctx)
	cancel()
	if got != ctx {
		t.Fatal("AttemptContext without an AttemptTimeout wrapped the ctx")
	}
}

// TestAttemptTimeoutCanceledExcluded: a caller giving up (Canceled) is
// still excluded from the breaker; only the deadline counts.
func TestAttemptTimeoutCanceledExcluded(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, AttemptTimeout: time.Hour, Clock: newFakeClock()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, _ := g.Allow(context.Background())
	p.Done(ctx.Err())
	if st := g.Stats(); st.Failures != 0 || st.State != policy.Closed {
		t.Fatalf("Canceled counted: %+v", st)
	}
}

func TestDefaultAttemptTimeout(t *testing.T) {
	t.Parallel()
	if d := policy.Default().AttemptTimeout; d != 10*time.Second {
		t.Fatalf("Default().AttemptTimeout = %v, want 10s", d)
	}
	if d := (policy.Policy{}).AttemptTimeout; d != 0 {
		t.Fatalf("zero Policy's AttemptTimeout = %v", d)
	}
}

func TestAttemptTimedOut(t *testing.T) {
	if policy.AttemptTimedOut(nil) != nil {
		t.Fatal("AttemptTimedOut(nil) is not nil")
	}
	err := policy.AttemptTimedOut(context.DeadlineExceeded)
	if !errors.Is(err, policy.ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not match both ErrAttemptTimeout and its cause", err)
	}
	if again := policy.AttemptTimedOut(err); again != err {
		t.Fatal("marking twice wraps twice")
	}
	if _, err := policy.New(policy.Policy{Breaker: &policy.Breaker{TimeoutFailures: -1}}); !errors.Is(err, policy.ErrInvalidPolicy) {
		t.Fatalf("negative TimeoutFailures: %v", err)
	}
	// Two-step: an engine reports a timeout with AttemptTimedOut; with the
	// default weight one trips the breaker.
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 5}})
	p, err := g.Allow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p.Done(policy.AttemptTimedOut(context.DeadlineExceeded))
	if st := g.State(); st != policy.Open {
		t.Fatalf("after one timed-out attempt the breaker is %v, want open", st)
	}
}
