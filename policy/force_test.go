package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func forcePolicy(clk policy.Clock, rec *recorder) policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 2, OpenTimeout: time.Second, MaxOpenTimeout: 8 * time.Second},
		Clock:   clk,
		OnEvent: rec.event,
	}
}

// failN records n failed attempts, ignoring refusals.
func failN(g *policy.Guard, n int) {
	for range n {
		if p, err := g.Allow(context.Background()); err == nil {
			p.Done(errFail)
		}
	}
}

func TestForceOpenHoldsUntilCleared(t *testing.T) {
	clk, rec := newFakeClock(), &recorder{}
	g := mustNew(t, forcePolicy(clk, rec))
	g.Force(policy.OverrideOpen)
	if g.State() != policy.Open || g.Forced() != policy.OverrideOpen {
		t.Fatalf("state %v forced %v, want open, open", g.State(), g.Forced())
	}
	clk.Advance(time.Hour) // far past any open period: still no probe
	_, err := g.Allow(context.Background())
	var oe *policy.OpenError
	if !errors.As(err, &oe) || oe.RetryAfter() != 8*time.Second || g.RetryAfter() != 8*time.Second {
		t.Fatalf("Allow while forced open: %v, want an OpenError retrying after MaxOpenTimeout", err)
	}
	g.Force(policy.OverrideNone)
	p, err := g.Allow(context.Background())
	if err != nil || !p.Probe() {
		t.Fatalf("after clearing: %v (probe %v), want a half-open probe", err, p.Probe())
	}
	if _, err := g.Allow(context.Background()); err == nil {
		t.Fatal("a second permit while the probe is out")
	}
	p.Done(nil)
	if g.State() != policy.Closed {
		t.Fatalf("state %v after the probe succeeded, want closed", g.State())
	}
	evs := rec.events()
	if len(evs) == 0 || evs[0].Kind != policy.EventBreakerOpened || !evs[0].Forced {
		t.Fatalf("first event %+v, want a forced breaker-opened", evs)
	}
}

func TestForceClosedNeverOpens(t *testing.T) {
	clk, rec := newFakeClock(), &recorder{}
	g := mustNew(t, forcePolicy(clk, rec))
	failN(g, 2)
	if g.State() != policy.Open {
		t.Fatalf("state %v after 2 failures, want open", g.State())
	}
	g.Force(policy.OverrideClosed)
	if g.State() != policy.Closed {
		t.Fatalf("state %v after forcing closed", g.State())
	}
	failN(g, 10)
	if g.State() != policy.Closed {
		t.Fatalf("state %v after failures while forced closed", g.State())
	}
	if st := g.Stats(); st.Failures != 12 {
		t.Fatalf("failures %d, want 12 (still counted)", st.Failures)
	}
	g.Trip(clk.Now().Add(time.Minute))
	if g.State() != policy.Closed {
		t.Fatal("Trip opened a breaker forced closed")
	}
	g.Force(policy.OverrideNone)
	failN(g, 2)
	if g.State() != policy.Open {
		t.Fatalf("state %v after the override was cleared and 2 failures, want open", g.State())
	}
	var forced int
	for _, e := range rec.events() {
		if e.Forced {
			forced++
			if e.Kind != policy.EventBreakerClosed {
				t.Fatalf("forced event %v, want breaker-closed", e.Kind)
			}
		}
	}
	if forced != 1 {
		t.Fatalf("%d forced events, want 1", forced)
	}
}

func TestTripOpensUntilThenOneProbe(t *testing.T) {
	clk, rec := newFakeClock(), &recorder{}
	g := mustNew(t, forcePolicy(clk, rec))
	until := clk.Now().Add(30 * time.Second)
	g.Trip(until)
	if g.State() != policy.Open || g.RetryAfter() != 30*time.Second {
		t.Fatalf("state %v retry-after %v, want open for 30s", g.State(), g.RetryAfter())
	}
	clk.Advance(30*time.Second - time.Nanosecond)
	if _, err := g.Allow(context.Background()); err == nil {
		t.Fatal("permit before until")
	}
	clk.Advance(time.Nanosecond)
	p, err := g.Allow(context.Background())
	if err != nil || !p.Probe() {
		t.Fatalf("at until: %v, want a probe", err)
	}
	if _, err := g.Allow(context.Background()); err == nil {
		t.Fatal("a second permit while the probe is out")
	}
	p.Done(errFail)
	if d := g.RetryAfter(); d != 2*time.Second {
		t.Fatalf("retry-after %v after a failed probe, want 2s (Trip counts as a trip)", d)
	}
	// A time in the past, or before the current open period ends, changes nothing.
	g.Trip(clk.Now().Add(-time.Second))
	g.Trip(clk.Now().Add(time.Second))
	if d := g.RetryAfter(); d != 2*time.Second {
		t.Fatalf("retry-after %v after stale trips, want 2s", d)
	}
	if evs := rec.events(); len(evs) == 0 || !evs[0].Forced || evs[0].Delay != 30*time.Second {
		t.Fatalf("events %+v, want a forced open of 30s first", evs)
	}
}
