package policy_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// op is one step of a breaker scenario.
type op int

const (
	opOK     op = iota // Allow, then Done(nil)
	opFail             // Allow, then Done(errFail)
	opSkip             // Allow, then Done(errSkip), an excluded error
	opPerm             // Allow, then Done(Permanent(errFail))
	opReject           // Allow must be refused with ErrOpen
	opWait             // advance the clock by d
)

type step struct {
	op    op
	n     int           // repeat count; 0 means 1
	d     time.Duration // opWait
	state policy.State  // State() after the step
	after time.Duration // RetryAfter() after the step, when checkAfter
	check bool          // check RetryAfter
}

func ok(n int, s policy.State) step   { return step{op: opOK, n: n, state: s} }
func fail(n int, s policy.State) step { return step{op: opFail, n: n, state: s} }
func skip(n int, s policy.State) step { return step{op: opSkip, n: n, state: s} }
func perm(n int, s policy.State) step { return step{op: opPerm, n: n, state: s} }
func reject(s policy.State) step      { return step{op: opReject, state: s} }
func wait(d time.Duration, s policy.State) step {
	return step{op: opWait, d: d, state: s}
}
func after(retryAfter time.Duration, s policy.State) step {
	return step{op: opWait, state: s, after: retryAfter, check: true}
}

func runSteps(t *testing.T, b policy.Breaker, steps []step) *policy.Guard {
	t.Helper()
	clk := newFakeClock()
	if b.Exclude == nil {
		b.Exclude = func(err error) bool { return errors.Is(err, errSkip) }
	}
	g := mustNew(t, policy.Policy{Breaker: &b, Clock: clk})
	ctx := context.Background()
	for i, s := range steps {
		for range max(s.n, 1) {
			switch s.op {
			case opWait:
				clk.Advance(s.d)
			case opReject:
				_, err := g.Allow(ctx)
				var oe *policy.OpenError
				if !errors.Is(err, policy.ErrOpen) || !errors.As(err, &oe) {
					t.Fatalf("step %d: Allow = %v, want ErrOpen", i, err)
				}
			default:
				p, err := g.Allow(ctx)
				if err != nil {
					t.Fatalf("step %d: Allow refused: %v", i, err)
				}
				switch s.op {
				case opOK:
					p.Done(nil)
				case opFail:
					p.Done(errFail)
				case opSkip:
					p.Done(errSkip)
				case opPerm:
					p.Done(policy.Permanent(errFail))
				}
			}
		}
		if got := g.State(); got != s.state {
			t.Fatalf("step %d: State() = %v, want %v", i, got, s.state)
		}
		if s.check {
			if got := g.RetryAfter(); got != s.after {
				t.Fatalf("step %d: RetryAfter() = %v, want %v", i, got, s.after)
			}
		}
	}
	return g
}

func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	const (
		C = policy.Closed
		H = policy.HalfOpen
		O = policy.Open
	)
	ratio := policy.Breaker{FailureRatio: 0.5, MinRequests: 10, Window: 10 * time.Second}
	tests := []struct {
		name    string
		breaker policy.Breaker
		steps   []step
	}{
		{"closed stays closed below the consecutive threshold", policy.Breaker{},
			[]step{fail(4, C), after(0, C), ok(1, C)}},
		{"closed to open on the 5th consecutive failure (default)", policy.Breaker{},
			[]step{fail(4, C), fail(1, O), after(5*time.Second, O), reject(O)}},
		{"a success resets the consecutive count", policy.Breaker{ConsecutiveFailures: 3},
			[]step{fail(2, C), ok(1, C), fail(2, C), fail(1, O)}},
		{"excluded errors count as neither", policy.Breaker{ConsecutiveFailures: 3},
			[]step{skip(10, C), fail(2, C), skip(5, C), fail(1, O)}},
		{"open rejects until the open period ends, then half-open", policy.Breaker{ConsecutiveFailures: 1},
			[]step{fail(1, O), reject(O), wait(5*time.Second-1, O), after(1, O), reject(O),
				wait(1, H), after(0, H)}},
		{"half-open probe success closes", policy.Breaker{ConsecutiveFailures: 1},
			[]step{fail(1, O), wait(5*time.Second, H), ok(1, C), ok(3, C)}},
		{"half-open probe failure reopens with a doubled period", policy.Breaker{ConsecutiveFailures: 1},
			[]step{fail(1, O), wait(5*time.Second, H), fail(1, O), after(10*time.Second, O),
				wait(10*time.Second-1, O), wait(1, H)}},
		{"open period grows to the cap and stays there",
			policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Second, MaxOpenTimeout: 3 * time.Second},
			[]step{fail(1, O), after(time.Second, O), wait(time.Second, H),
				fail(1, O), after(2*time.Second, O), wait(2*time.Second, H),
				fail(1, O), after(3*time.Second, O), wait(3*time.Second, H),
				fail(1, O), after(3*time.Second, O), wait(3*time.Second, H)}},
		{"closing resets the open period",
			policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Second},
			[]step{fail(1, O), wait(time.Second, H), fail(1, O), after(2*time.Second, O),
				wait(2*time.Second, H), ok(1, C), fail(1, O), after(time.Second, O)}},
		{"half-open needs every probe to succeed", policy.Breaker{ConsecutiveFailures: 1, HalfOpenProbes: 3},
			[]step{fail(1, O), wait(5*time.Second, H), ok(2, H), ok(1, C)}},
		{"half-open failure after some successes reopens", policy.Breaker{ConsecutiveFailures: 1, HalfOpenProbes: 3},
			[]step{fail(1, O), wait(5*time.Second, H), ok(2, H), fail(1, O)}},
		{"excluded probe frees its slot", policy.Breaker{ConsecutiveFailures: 1},
			[]step{fail(1, O), wait(5*time.Second, H), skip(3, H), ok(1, C)}},
		{"permanent errors count as neither (the work's fault)", policy.Breaker{ConsecutiveFailures: 3},
			[]step{perm(10, C), fail(2, C), perm(5, C), fail(1, O)}},
		{"a permanent probe frees its slot", policy.Breaker{ConsecutiveFailures: 1},
			[]step{fail(1, O), wait(5*time.Second, H), perm(3, H), ok(1, C)}},
		{"ratio: permanent errors are not outcomes", ratio,
			[]step{perm(30, C), ok(5, C), fail(4, C), fail(1, O)}}, // 5/10
		{"CountPermanent: permanent errors trip", policy.Breaker{ConsecutiveFailures: 3, CountPermanent: true},
			[]step{perm(2, C), perm(1, O)}},
		{"CountPermanent: a permanent probe reopens", policy.Breaker{ConsecutiveFailures: 1, CountPermanent: true},
			[]step{perm(1, O), wait(5*time.Second, H), perm(1, O), after(10*time.Second, O)}},
		{"ratio: below min throughput never trips", ratio,
			[]step{fail(9, C), fail(1, O)}},
		{"ratio: trips when the ratio is reached", ratio,
			[]step{ok(6, C), fail(4, C), fail(1, C), fail(1, O)}}, // 4/10, 5/11, 6/12
		{"ratio: consecutive rule off by default", ratio,
			[]step{ok(100, C), fail(50, C), fail(50, O)}}, // 99/200 closed, 100/200 trips
		{"ratio: old buckets leave the window", ratio,
			[]step{fail(9, C), wait(11*time.Second, C), fail(9, C), wait(11*time.Second, C), fail(9, C), ok(1, C)}},
		{"ratio: partly aged window", ratio,
			[]step{ok(10, C), wait(5*time.Second, C), fail(9, C), wait(5*time.Second, C), fail(1, O)}}, // 10 aged out: 10/10
		{"ratio and consecutive together",
			policy.Breaker{ConsecutiveFailures: 3, FailureRatio: 0.9, MinRequests: 100},
			[]step{ok(5, C), fail(2, C), fail(1, O)}},
		{"ratio: window cleared on close", policy.Breaker{FailureRatio: 0.5, MinRequests: 4, Window: 10 * time.Second},
			[]step{ok(1, C), fail(3, O), wait(5*time.Second, H), ok(1, C), fail(3, C), fail(1, O)}},
		{"ratio 1 trips only on all failures", policy.Breaker{FailureRatio: 1, MinRequests: 3},
			[]step{ok(1, C), fail(5, C), wait(20*time.Second, C), fail(3, O)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, tt.breaker, tt.steps)
		})
	}
}

func TestBreakerStaleGenerationIgnored(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var rec recorder
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 2, HalfOpenProbes: 2},
		Clock:   clk, OnEvent: rec.event,
	})
	ctx := context.Background()
	allow := func() policy.Permit {
		t.Helper()
		p, err := g.Allow(ctx)
		if err != nil {
			t.Fatalf("Allow: %v", err)
		}
		return p
	}
	late := allow() // taken while closed, generation 0
	lateFail := allow()
	for range 2 {
		p := allow()
		p.Done(errFail)
	}
	if g.State() != policy.Open {
		t.Fatalf("state %v, want open", g.State())
	}
	late.Done(nil) // a success from before the trip must not close it
	if g.State() != policy.Open {
		t.Fatalf("stale success moved the breaker to %v", g.State())
	}
	clk.Advance(5 * time.Second)
	probe1 := allow()
	if !probe1.Probe() {
		t.Fatal("permit in half-open is not a probe")
	}
	lateFail.Done(errFail) // a stale failure must not reopen it
	if g.State() != policy.HalfOpen {
		t.Fatalf("stale failure moved the breaker to %v", g.State())
	}
	probe2 := allow()
	probe1.Done(errFail) // reopens (generation 2)
	if g.State() != policy.Open {
		t.Fatalf("state %v after a failed probe, want open", g.State())
	}
	probe2.Done(nil) // probe of the old half-open generation: ignored
	if g.State() != policy.Open {
		t.Fatalf("stale probe success moved the breaker to %v", g.State())
	}
	st := g.Stats()
	if st.Successes != 2 || st.Failures != 4 {
		t.Fatalf("stats successes=%d failures=%d, want 2 and 4 (stale outcomes are counted)", st.Successes, st.Failures)
	}
	if st.Generation != 3 {
		t.Fatalf("generation %d, want 3 (open, half-open, open)", st.Generation)
	}
	clk.Advance(10 * time.Second)
	a, b := allow(), allow()
	a.Done(nil)
	b.Done(nil)
	if g.State() != policy.Closed {
		t.Fatalf("state %v, want closed", g.State())
	}
	var kinds []string
	for _, e := range rec.events() {
		kinds = append(kinds, fmt.Sprintf("%v/%v", e.Kind, e.State))
	}
	want := []string{"breaker-opened/open", "breaker-half-open/half-open", "breaker-opened/open",
		"breaker-half-open/half-open", "breaker-closed/closed"}
	if !equalLines(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
}

func TestBreakerHalfOpenProbeBound(t *testing.T) {
	t.Parallel()
	for _, probes := range []int{1, 3} {
		t.Run(fmt.Sprint(probes), func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{
				Breaker: &policy.Breaker{ConsecutiveFailures: 1, HalfOpenProbes: probes},
				Clock:   clk,
			})
			ctx := context.Background()
			p, _ := g.Allow(ctx)
			p.Done(errFail)
			clk.Advance(5 * time.Second)

			// Many callers race for the probe slots; exactly `probes` win.
			var (
				mu      sync.Mutex
				granted []policy.Permit
				refused int
				wg      sync.WaitGroup
			)
			for range 16 {
				wg.Go(func() {
					p, err := g.Allow(ctx)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						var oe *policy.OpenError
						if !errors.As(err, &oe) || oe.State != policy.HalfOpen {
							t.Errorf("refusal %v, want a half-open OpenError", err)
						}
						if ra := oe.RetryAfter(); ra < time.Millisecond || ra > time.Second {
							t.Errorf("half-open RetryAfter %v, want within [1ms, 1s]", ra)
						}
						refused++
						return
					}
					granted = append(granted, p)
				})
			}
			wg.Wait()
			if len(granted) != probes || refused != 16-probes {
				t.Fatalf("granted %d refused %d, want %d and %d", len(granted), refused, probes, 16-probes)
			}
			// A released probe frees its slot; a success does not free one.
			granted[0].Release()
			p, err := g.Allow(ctx)
			if err != nil || !p.Probe() {
				t.Fatalf("after Release: Allow = %v, probe=%v", err, p.Probe())
			}
			granted[0] = p
			if probes > 1 {
				granted[1].Done(nil)
				if _, err := g.Allow(ctx); !errors.Is(err, policy.ErrOpen) {
					t.Fatalf("a probe success freed a slot: %v", err)
				}
			}
			for _, p := range granted {
				p.Done(nil)
			}
			if g.State() != policy.Closed {
				t.Fatalf("state %v after all probes succeeded", g.State())
			}
			if st := g.Stats(); st.Rejected < uint64(16-probes) {
				t.Fatalf("Rejected = %d, want at least %d", st.Rejected, 16-probes)
			}
		})
	}
}

func TestOpenErrorRetryAfter(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: 3 * time.Second}, Clock: clk})
	p, _ := g.Allow(context.Background())
	p.Done(errFail)
	_, err := g.Allow(context.Background())
	var oe *policy.OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("Allow = %v, want *OpenError", err)
	}
	if oe.State != policy.Open || !oe.Until.Equal(clk.Now().Add(3*time.Second)) {
		t.Fatalf("OpenError state=%v until=%v", oe.State, oe.Until)
	}
	clk.Advance(time.Second)
	if got := oe.RetryAfter(); got != 2*time.Second {
		t.Fatalf("RetryAfter = %v, want 2s", got)
	}
	if got, want := oe.Error(), "policy: circuit breaker is open (retry after 2s)"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	clk.Advance(time.Hour)
	if got := oe.RetryAfter(); got != 0 {
		t.Fatalf("RetryAfter past the period = %v, want 0", got)
	}
	if (&policy.OpenError{State: policy.Open}).RetryAfter() != time.Millisecond {
		t.Fatal("a bare OpenError should suggest 1ms")
	}
}

func TestExcludeDefaultIsCanceled(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, Clock: clk})
	for range 3 {
		p, _ := g.Allow(context.Background())
		p.Done(fmt.Errorf("wrapped: %w", context.Canceled))
	}
	if st := g.Stats(); st.State != policy.Closed || st.Failures != 0 {
		t.Fatalf("canceled counted: %+v", st)
	}
	p, _ := g.Allow(context.Background())
	p.Done(context.DeadlineExceeded) // a timeout says the dependency is slow
	if g.State() != policy.Open {
		t.Fatalf("deadline exceeded not counted: %v", g.State())
	}
}

// TestPermanentIsAFailureInStats: the breaker does not count a permanent
// error, Stats does (the work failed).
func TestPermanentIsAFailureInStats(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, Clock: newFakeClock()})
	for range 3 {
		p, _ := g.Allow(context.Background())
		p.Done(fmt.Errorf("wrapped: %w", policy.Permanent(errFail)))
	}
	if st := g.Stats(); st.State != policy.Closed || st.Failures != 3 || st.ConsecutiveFailures != 0 {
		t.Fatalf("after 3 permanent failures: %+v", st)
	}
}

func TestNoBreaker(t *testing.T) {
	t.Parallel()
	g := mustNew(t, policy.Policy{})
	for range 100 {
		p, err := g.Allow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.Done(errFail)
	}
	if g.State() != policy.Closed || g.RetryAfter() != 0 {
		t.Fatalf("guard without a breaker is %v", g.State())
	}
	p, _ := g.Allow(context.Background())
	p.Done(context.Canceled) // excluded by default, breaker or not
	if st := g.Stats(); st.Failures != 100 {
		t.Fatalf("failures %d, want 100", st.Failures)
	}
	var zero policy.Permit
	zero.Done(nil) // must not panic
	zero.Release()
}

func TestClockSetBack(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{FailureRatio: 0.5, MinRequests: 2}, Clock: clk})
	clk.Advance(-time.Hour)
	for range 2 {
		p, err := g.Allow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.Done(errFail)
	}
	if g.State() != policy.Open {
		t.Fatalf("state %v", g.State())
	}
}

func TestAllowRejectedEvent(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var rec recorder
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, Clock: clk, OnEvent: rec.event})
	p, _ := g.Allow(context.Background())
	p.Done(errFail)
	_, err := g.Allow(context.Background())
	evs := rec.events()
	if len(evs) != 2 || evs[1].Kind != policy.EventRejected || evs[1].Err != err || evs[1].State != policy.Open {
		t.Fatalf("events %+v", evs)
	}
	if evs[0].Kind != policy.EventBreakerOpened || evs[0].Delay != 5*time.Second || evs[0].Err != errFail {
		t.Fatalf("opened event %+v", evs[0])
	}
}

func TestHugeSettings(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: math.MaxInt64},
		Budget:  &policy.Budget{MaxTokens: 1e300},
		Clock:   clk,
	})
	clk.Advance(time.Hour)
	p, _ := g.Allow(context.Background())
	p.Done(errFail)
	clk.Advance(100 * 365 * 24 * time.Hour)
	if g.State() != policy.Open || g.RetryAfter() <= 0 {
		t.Fatalf("an overflowing open period let the breaker out: %v %v", g.State(), g.RetryAfter())
	}
	if tok := g.Stats().Tokens; tok < 1e12 {
		t.Fatalf("huge MaxTokens: %v tokens", tok)
	}
}
