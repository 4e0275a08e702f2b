package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// A judge round makes several attempts under one permit; Restart times the
// permit's outcome as the last of them, so a round that takes long in all
// is not one slow call.
func TestPermitRestartTimesTheLastAttempt(t *testing.T) {
	for _, restart := range []bool{false, true} {
		clk := newFakeClock()
		g, err := policy.New(policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1, SlowCall: policy.SlowCall{Threshold: 100 * time.Millisecond}}, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		p, err := g.Allow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second) // earlier attempts of the round
		if restart {
			p.Restart()
		}
		clk.Advance(10 * time.Millisecond) // the last attempt
		p.Done(nil)
		s := g.Stats()
		if restart && (s.SlowCalls != 0 || s.State != policy.Closed) {
			t.Fatalf("restarted permit: %d slow calls, breaker %v; want none, closed", s.SlowCalls, s.State)
		}
		if !restart && (s.SlowCalls != 1 || s.State != policy.Open) {
			t.Fatalf("permit held for 1s: %d slow calls, breaker %v; want 1, open", s.SlowCalls, s.State)
		}
	}
	var ended policy.Permit
	ended.Restart() // an ended (zero) permit: nothing to do, no panic
}
