package scope_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// A second Done on a permit of a scope's guard must not drive the guard's
// in-use count negative: if it did, a permit still out would no longer keep
// the state from being recycled, the state would serve another key, and the
// old tenant's late failure would open the new tenant's breaker. Done and
// Release are idempotent: every repeated call below does nothing.
func TestDoubleDoneCannotReachAnotherTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	boom := errors.New("boom")
	tests := []struct {
		name   string
		repeat func(p *policy.Permit) // ends the permit twice, somehow
	}{
		{"Done after Done", func(p *policy.Permit) { p.Done(nil); p.Done(nil) }},
		{"Release after Done", func(p *policy.Permit) { p.Done(nil); p.Release() }},
		{"Done after Release", func(p *policy.Permit) { p.Release(); p.Done(nil) }},
		{"Release after Release", func(p *policy.Permit) { p.Release(); p.Release() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := scope.New(tripTemplate(new(fakeClock)), scope.Options[string]{MaxKeys: 1})
			a := s.For("a")
			first, err := a.Allow(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tt.repeat(&first)
			out, err := a.Allow(ctx) // still out while "a" is evicted
			if err != nil {
				t.Fatal(err)
			}
			s.SweepNow()
			s.SweepNow() // "a" unseen for a whole sweep: evicted, its guard retired
			if _, ok := s.Peek("a"); ok {
				t.Fatal("a was not evicted")
			}
			b := s.For("b") // must not be built on a's state: a permit is out on it
			out.Done(boom)  // a's late failure
			if st := b.Stats(); st.State != policy.Closed || st.Failures != 0 {
				t.Fatalf("a's late failure reached b's breaker: %+v", st)
			}
			out.Done(boom) // and again: nothing
			if st := b.Stats(); st.State != policy.Closed || st.Failures != 0 {
				t.Fatalf("a second Done reached b's breaker: %+v", st)
			}
		})
	}
}

// TestShapeSetsBulkhead: a tenant's bulkhead and weight come from Shape,
// like the rest of its policy.
func TestShapeSetsBulkhead(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[string]{
		Shape: func(tenant string) policy.Policy {
			p := policy.Default()
			if tenant == "premium" {
				p.Bulkhead = policy.Bulkhead{MaxConcurrent: 8, Weight: 4}
			}
			return p
		},
	})
	const engineDefault = 2
	tests := []struct {
		tenant              string
		concurrency, weight int
	}{
		{"premium", 8, 4},
		{"standard", engineDefault, 1},
	}
	for _, tt := range tests {
		g := s.For(tt.tenant)
		if c, w := g.Concurrency(engineDefault), g.Weight(); c != tt.concurrency || w != tt.weight {
			t.Errorf("%s: Concurrency %d, Weight %d; want %d, %d", tt.tenant, c, w, tt.concurrency, tt.weight)
		}
	}
}
