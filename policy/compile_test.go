package policy_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

func TestCompileRejectsInvalidPolicy(t *testing.T) {
	p := policy.Default()
	p.Retry.MaxAttempts = -1
	c, err := policy.Compile(p)
	var ipe *policy.InvalidPolicyError
	if c != nil || !errors.Is(err, policy.ErrInvalidPolicy) || !errors.As(err, &ipe) || ipe.Field != "Retry.MaxAttempts" {
		t.Fatalf("Compile = %v, %v; want nil and an error naming Retry.MaxAttempts", c, err)
	}
}

// TestCompiledGuardsShareThePolicyNotTheState: guards of one Compiled have
// the same policy and independent breakers, and the policy is a copy taken
// at Compile.
func TestCompiledGuardsShareThePolicyNotTheState(t *testing.T) {
	clk := newFakeClock()
	p := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Minute},
		Retry:   policy.Retry{MaxAttempts: 2},
		Clock:   clk,
	}
	c, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Breaker.ConsecutiveFailures = 99 // after Compile: changes nothing
	a, b := c.New(), c.New()
	if a == b {
		t.Fatal("New returned the same guard twice")
	}
	pm, err := a.Allow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pm.Done(errors.New("boom"))
	if a.State() != policy.Open || b.State() != policy.Closed {
		t.Fatalf("states %v and %v after one guard failed, want open and closed", a.State(), b.State())
	}
	for name, got := range map[string]policy.Policy{"Compiled.Policy": c.Policy(), "Guard.Policy": b.Policy()} {
		if got.Breaker.ConsecutiveFailures != 1 || got.Retry.MaxAttempts != 2 {
			t.Fatalf("%s = %+v, want the policy as compiled", name, got)
		}
		got.Breaker.ConsecutiveFailures = 7 // a copy: changes nothing
	}
	if c.Policy().Breaker.ConsecutiveFailures != 1 {
		t.Fatal("changing a returned Policy changed the compiled one")
	}
}

// TestNewWithEventsHook: the per-guard hook sees its guard's events after
// the policy's OnEvent, and no other guard's.
func TestNewWithEventsHook(t *testing.T) {
	var mu sync.Mutex
	var log []string
	add := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
	p := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Minute},
		Clock:   newFakeClock(),
		OnEvent: func(e policy.Event) { add("policy " + e.Kind.String()) },
	}
	c, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	hooked := c.NewWithEvents(func(e policy.Event) { add(fmt.Sprintf("hook %v %v", e.Kind, e.State)) })
	plain := c.New()
	for _, g := range []*policy.Guard{plain, hooked} {
		pm, err := g.Allow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pm.Done(errors.New("boom"))
	}
	want := []string{
		"policy " + policy.EventBreakerOpened.String(),
		"policy " + policy.EventBreakerOpened.String(),
		fmt.Sprintf("hook %v %v", policy.EventBreakerOpened, policy.Open),
	}
	if fmt.Sprint(log) != fmt.Sprint(want) {
		t.Fatalf("events %q, want %q", log, want)
	}
}

func TestCompiledNewAllocatesOnce(t *testing.T) {
	c, err := policy.Compile(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { c.New() }); n != 1 {
		t.Fatalf("Compiled.New allocates %v times, want 1 (the guard)", n)
	}
}
