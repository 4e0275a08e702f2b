package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// TestPermitEndsOnce: Done and Release end a permit once; any later Done or
// Release on it does nothing, and Probe is false once it has ended.
func TestPermitEndsOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		end  func(p *policy.Permit)
		want policy.Stats // Successes, Failures, ConsecutiveFailures
	}{
		{"Done(nil) twice", func(p *policy.Permit) { p.Done(nil); p.Done(nil) }, policy.Stats{Successes: 1}},
		{"Done(err) twice", func(p *policy.Permit) { p.Done(errFail); p.Done(errFail) }, policy.Stats{Failures: 1, ConsecutiveFailures: 1}},
		{"Done then Release", func(p *policy.Permit) { p.Done(errFail); p.Release() }, policy.Stats{Failures: 1, ConsecutiveFailures: 1}},
		{"Release then Done", func(p *policy.Permit) { p.Release(); p.Done(errFail) }, policy.Stats{}},
		{"Release twice", func(p *policy.Permit) { p.Release(); p.Release() }, policy.Stats{}},
	}
	for _, tt := range tests {
		for _, recycled := range []bool{false, true} {
			name := tt.name
			if recycled {
				name += " (recycled guard)"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c, err := policy.Compile(policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 5}, Clock: newFakeClock()})
				if err != nil {
					t.Fatal(err)
				}
				g := c.New()
				if recycled {
					g = policy.NewRecycler(1).New(c, nil)
				}
				p, err := g.Allow(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				tt.end(&p)
				if p != (policy.Permit{}) || p.Probe() {
					t.Fatalf("permit not zeroed after it ended: %+v", p)
				}
				st := g.Stats()
				got := policy.Stats{Successes: st.Successes, Failures: st.Failures, ConsecutiveFailures: st.ConsecutiveFailures}
				if got != tt.want {
					t.Fatalf("stats %+v, want %+v", got, tt.want)
				}
			})
		}
	}
}

// TestProbeEndsOnce: a probe released or ended twice frees its slot once
// and moves the breaker once.
func TestProbeEndsOnce(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) *policy.Guard {
		clk := newFakeClock()
		g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1, HalfOpenProbes: 2}, Clock: clk})
		p, _ := g.Allow(context.Background())
		p.Done(errFail)
		clk.Advance(5 * time.Second)
		return g
	}
	t.Run("Release twice frees one slot", func(t *testing.T) {
		t.Parallel()
		g := setup(t)
		a, _ := g.Allow(context.Background())
		b, _ := g.Allow(context.Background())
		if !a.Probe() || !b.Probe() {
			t.Fatal("permits in half-open are not probes")
		}
		a.Release()
		a.Release()
		if _, err := g.Allow(context.Background()); err != nil {
			t.Fatalf("the released slot: %v", err)
		}
		if _, err := g.Allow(context.Background()); err == nil {
			t.Fatal("a second Release freed a second slot")
		}
		b.Release()
	})
	t.Run("failed probe Done twice reopens once", func(t *testing.T) {
		t.Parallel()
		g := setup(t)
		a, _ := g.Allow(context.Background())
		gen := g.Stats().Generation
		a.Done(errFail)
		a.Done(errFail)
		if st := g.Stats(); st.State != policy.Open || st.Generation != gen+1 || st.Failures != 2 {
			t.Fatalf("after a probe's double Done: %+v (generation before %d)", st, gen)
		}
		if ra := g.RetryAfter(); ra != 10*time.Second { // one trip more, not two
			t.Fatalf("RetryAfter %v, want 10s", ra)
		}
	})
}
