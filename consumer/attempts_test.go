package consumer_test

// Attempts: each attempt's timeout, the round's deadline, and panics.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// A panic is recovered, counted as a failure, and the message is retried;
// the process survives.
func TestHandlerPanicIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	produce(h, "A", 0, 0)
	produce(h, "A", 0, 1)
	var calls atomic.Int64
	var panics atomic.Int64
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "A/0/000000" && calls.Add(1) == 1 {
				panic("nil map write")
			}
			rec.Add("A", string(m.Value))
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventPanicked {
				panics.Add(1)
			}
		},
	})
	consumertest.Eventually(t, "both handled", func() bool { return rec.Distinct() == 2 })
	if s := e.c.Stats(); s.Panics != 1 || s.Failed != 1 || panics.Load() != 1 {
		t.Fatalf("panics %d failed %d events %d", s.Panics, s.Failed, panics.Load())
	}
	if h.S.Total() != 0 {
		t.Fatal("a panic that succeeded on retry was dead-lettered")
	}
}

// Deadline means the same in the engine as in Guard.Run: the time budget
// of a round of attempts; AttemptTimeout bounds each attempt.
func TestAttemptTimeoutAndDeadline(t *testing.T) {
	t.Run("AttemptTimeout ends a hanging call", func(t *testing.T) {
		var calls atomic.Int64
		src := newGenSource(1, func(int) *consumer.Message { return tenantMsg("a", "hang") })
		p := policy.Policy{AttemptTimeout: 30 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}}}
		var errs sync.Map
		startWith(t, consumer.Config{
			Scope: scope.New(p, scope.Options[string]{}),
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if calls.Add(1) <= 2 {
					<-ctx.Done()
					errs.Store(calls.Load(), ctx.Err())
					return ctx.Err()
				}
				return nil
			}),
		}, src)
		consumertest.Eventually(t, "a third call after two timed out", func() bool { return calls.Load() >= 3 })
		if err, _ := errs.Load(int64(1)); !errors.Is(err.(error), context.DeadlineExceeded) {
			t.Fatalf("the hanging call ended with %v, want DeadlineExceeded", err)
		}
	})
	// Only running out AttemptTimeout is a hang (weighed as
	// Breaker.TimeoutFailures, by default tripping the breaker at once);
	// running out what is left of the Deadline is an ordinary failure, or a
	// tenant's ordinary deadline would trip its breaker at the first expiry
	// and park it for the open timeout.
	t.Run("running out the Deadline is not a hang", func(t *testing.T) {
		sink := consumertest.NewSink()
		src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("a", []string{"slow", "ok"}[i]) })
		p := policy.Policy{
			Deadline: 20 * time.Millisecond,
			Breaker:  &policy.Breaker{ConsecutiveFailures: 5, OpenTimeout: time.Hour},
			Retry:    policy.Retry{MaxAttempts: 1},
		}
		sc := scope.New(p, scope.Options[string]{})
		startWith(t, consumer.Config{
			Scope: sc,
			DLQ:   sink,
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if string(m.Value) == "slow" {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}),
		}, src)
		// With the deadline taken for a hang the breaker opens for an hour
		// and neither message settles.
		consumertest.Eventually(t, "slow dead-lettered", func() bool { return len(sink.Records("a", false)) == 1 })
		if st := sc.For("a").State(); st != policy.Closed {
			t.Fatalf("breaker %v after one deadline expiry, want closed", st)
		}
	})
	t.Run("Deadline is the round's budget", func(t *testing.T) {
		sink := consumertest.NewSink()
		var calls atomic.Int64
		src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("a", []string{"bad", "good"}[i]) })
		// 100 attempts allowed, 40ms apart, but only 100ms for the round: it
		// ends (and is judged) after about three.
		p := policy.Policy{Deadline: 100 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 100, Backoff: policy.Backoff{Kind: policy.Constant, Base: 40 * time.Millisecond}}}
		startWith(t, consumer.Config{
			Scope: scope.New(p, scope.Options[string]{}),
			DLQ:   sink,
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if string(m.Value) == "bad" {
					calls.Add(1)
					return errors.New("bad")
				}
				return nil
			}),
		}, src)
		consumertest.Eventually(t, "bad dead-lettered", func() bool { return len(sink.Records("a", false)) == 1 })
		if n := calls.Load(); n > 6 {
			t.Fatalf("%d attempts within a 100ms deadline at 40ms apart", n)
		}
	})
}
