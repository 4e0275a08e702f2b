package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func batchPolicy() policy.Policy {
	return policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: time.Hour}}
}

// A batch's successes reach the guard's counters at End; its failures,
// and the breaker they trip, act at once.
func TestBatchCountsAtEndDecidesAtOnce(t *testing.T) {
	c, err := policy.Compile(batchPolicy())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		g    *policy.Guard
	}{
		{"own state", c.New()},
		{"recycled state", policy.NewRecycler(4).New(c, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := tc.g.Batch()
			for range 5 {
				p, err := b.Allow(ctx)
				if err != nil {
					t.Fatal(err)
				}
				p.Done(nil)
			}
			if s := tc.g.Stats(); s.Successes != 0 {
				t.Fatalf("successes %d before End, want them counted at End", s.Successes)
			}
			boom := errors.New("boom")
			for i := range 3 {
				p, err := b.Allow(ctx)
				if err != nil {
					t.Fatalf("attempt %d refused before the breaker tripped: %v", i, err)
				}
				p.Done(boom)
			}
			if s := tc.g.Stats(); s.Failures != 3 || s.State != policy.Open {
				t.Fatalf("after 3 failures in the batch: %d failures, state %v; want 3, open at once", s.Failures, s.State)
			}
			if _, err := b.Allow(ctx); !errors.As(err, new(*policy.OpenError)) {
				t.Fatalf("Allow on the open breaker in the batch: %v, want an OpenError", err)
			}
			if _, err := tc.g.Allow(ctx); err == nil {
				t.Fatal("the guard's own Allow admitted an attempt on the open breaker")
			}
			b.End()
			b.End() // a second End does nothing
			if s := tc.g.Stats(); s.Successes != 5 || s.Failures != 3 || s.Rejected != 2 {
				t.Fatalf("after End: %+v; want 5 successes, 3 failures, 2 rejections", s)
			}
		})
	}
}

// A batch keeps its guard's recycled state from reuse: a key evicted and
// its state retired while a batch runs on it must not hand that state to a
// new guard, whose counts the batch would then corrupt.
func TestBatchHoldsRecycledState(t *testing.T) {
	c, err := policy.Compile(batchPolicy())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rc := policy.NewRecycler(4)
	old := rc.New(c, nil)
	b := old.Batch()
	rc.Retire(old)
	fresh := rc.New(c, nil) // would reuse old's state if it were free
	for range 3 {
		p, err := b.Allow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(errors.New("boom")) // trips the batch's breaker
	}
	b.End()
	if s := fresh.Stats(); s.Failures != 0 || s.State != policy.Closed {
		t.Fatalf("a new guard saw the retired batch's outcomes: %+v", s)
	}
	if p, err := fresh.Allow(ctx); err != nil {
		t.Fatalf("the new guard refused: %v", err)
	} else {
		p.Done(nil)
	}
}

// The zero Batch is ended: End does nothing, and Allow says so rather than
// admitting an attempt on no guard.
func TestBatchEnded(t *testing.T) {
	var b policy.Batch
	b.End()
	if _, err := b.Allow(context.Background()); !errors.Is(err, policy.ErrBatchEnded) {
		t.Fatalf("Allow on the zero Batch: %v, want ErrBatchEnded", err)
	}
	g, err := policy.New(batchPolicy())
	if err != nil {
		t.Fatal(err)
	}
	b = g.Batch()
	b.End()
	if _, err := b.Allow(context.Background()); !errors.Is(err, policy.ErrBatchEnded) {
		t.Fatalf("Allow after End: %v, want ErrBatchEnded", err)
	}
}
