package policy_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

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
		d := g.NextRetry(1, errFail, 0)
		if !d.Retry && d.Stop != policy.StopBudget {
			t.Fatalf("refusal %+v, want StopBudget", d)
		}
		return d.Retry
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
					if !g.NextRetry(1, errFail, 0).Retry {
						break
					}
				}
				clk.Advance(tt.advance)
			}
			got := 0
			for got < 100 {
				if !g.NextRetry(1, errFail, 0).Retry {
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
		if g.NextRetry(1, errFail, 0).Retry {
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
		if d := off.NextRetry(1, errFail, 0); !d.Retry {
			t.Fatalf("retry %d refused with the budget disabled: %+v", i, d)
		}
	}
	// Two guards from one policy: A spending its tokens leaves B's alone.
	p := policy.Policy{Retry: policy.Retry{MaxAttempts: 2}, Budget: &policy.Budget{MaxTokens: 2, MinPerSecond: -1}}
	a, b := mustNew(t, p), mustNew(t, p)
	for range 5 {
		_ = a.NextRetry(1, errFail, 0)
	}
	if a.Stats().Tokens != 0 || b.Stats().Tokens != 2 {
		t.Fatalf("tokens a=%v b=%v, want 0 and 2", a.Stats().Tokens, b.Stats().Tokens)
	}
}

// TestSuccessesRepayAfterRacingFailures: a success reads the consecutive
// count and the spent budget only while the guard owes (a failure or a
// retry since it last found both at zero). Failures, retries and successes
// from many goroutines at once must never leave a debt unnoticed: a run of
// successes afterwards brings the count to zero and the bucket back to full.
func TestSuccessesRepayAfterRacingFailures(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1 << 30},
		Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
		Budget:  &policy.Budget{Ratio: 0.5, MaxTokens: 4, MinPerSecond: -1},
	})
	ctx := context.Background()
	for round := range 50 {
		done := make(chan struct{})
		for w := range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := range 200 {
					p, err := g.Allow(ctx)
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					switch (i + w + round) % 5 {
					case 0:
						p.Done(errFail)
					case 1:
						p.Done(nil)
						g.NextRetry(1, errFail, 0)
					default:
						p.Done(nil)
					}
				}
			}()
		}
		for range 4 {
			<-done
		}
		for range 16 { // 16 successes earn 8 tokens: more than the bucket holds
			p, _ := g.Allow(ctx)
			p.Done(nil)
		}
		if s := g.Stats(); s.ConsecutiveFailures != 0 || s.Tokens != 4 {
			t.Fatalf("round %d: after a run of successes ConsecutiveFailures = %d, Tokens = %v; want 0 and 4", round, s.ConsecutiveFailures, s.Tokens)
		}
	}
}
