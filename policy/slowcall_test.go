package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

const ms = time.Millisecond

// call makes one attempt of duration d through the two-step form and
// reports whether Allow admitted it.
func call(g *policy.Guard, clk *fakeClock, d time.Duration, err error) bool {
	p, aerr := g.Allow(context.Background())
	if aerr != nil {
		return false
	}
	clk.Advance(d)
	p.Done(err)
	return true
}

// TestSlowCallBreaker: a success slower than the threshold is a failure to
// the breaker, by every rule, and a success everywhere else.
func TestSlowCallBreaker(t *testing.T) {
	t.Parallel()
	fixed := policy.SlowCall{Threshold: 100 * ms}
	type step struct {
		d     time.Duration
		err   error
		n     int
		state policy.State // after
	}
	tests := []struct {
		name    string
		breaker *policy.Breaker
		steps   []step
		slow    uint64 // Stats.SlowCalls at the end
		succ    uint64 // Stats.Successes at the end
	}{
		{"consecutive slow calls trip", &policy.Breaker{ConsecutiveFailures: 3, SlowCall: fixed},
			[]step{{d: 150 * ms, n: 2, state: policy.Closed}, {d: 150 * ms, n: 1, state: policy.Open}}, 3, 3},
		{"at the threshold is not slow", &policy.Breaker{ConsecutiveFailures: 1, SlowCall: fixed},
			[]step{{d: 100 * ms, n: 5, state: policy.Closed}}, 0, 5},
		{"a fast success resets the count", &policy.Breaker{ConsecutiveFailures: 3, SlowCall: fixed},
			[]step{{d: 150 * ms, n: 2}, {d: ms}, {d: 150 * ms, n: 2}, {d: 150 * ms, state: policy.Open}}, 5, 6},
		{"slow calls and failures count together", &policy.Breaker{ConsecutiveFailures: 3, SlowCall: fixed},
			[]step{{d: 150 * ms}, {d: ms, err: errFail}, {d: 150 * ms, state: policy.Open}}, 2, 2},
		{"ratio rule", &policy.Breaker{FailureRatio: 0.5, MinRequests: 4, SlowCall: fixed},
			[]step{{d: ms, n: 2}, {d: 150 * ms}, {d: 150 * ms, state: policy.Open}}, 2, 4},
		{"slow probe reopens", &policy.Breaker{ConsecutiveFailures: 1, SlowCall: fixed},
			[]step{{d: 150 * ms, state: policy.Open}, {d: 5 * time.Second, n: 0, state: policy.HalfOpen}, {d: 150 * ms, state: policy.Open}}, 2, 2},
		{"fast probe closes", &policy.Breaker{ConsecutiveFailures: 1, SlowCall: fixed},
			[]step{{d: 150 * ms, state: policy.Open}, {d: 5 * time.Second, n: 0, state: policy.HalfOpen}, {d: ms, state: policy.Closed}}, 1, 2},
		{"disabled", &policy.Breaker{ConsecutiveFailures: 1, SlowCall: policy.SlowCall{Disabled: true, Threshold: 100 * ms}},
			[]step{{d: time.Hour, n: 5, state: policy.Closed}}, 0, 5},
		{"no breaker, no slow calls", nil,
			[]step{{d: time.Hour, n: 5, state: policy.Closed}}, 0, 5},
		{"an excluded error is not a slow call", &policy.Breaker{ConsecutiveFailures: 1, SlowCall: fixed},
			[]step{{d: time.Hour, err: context.Canceled, state: policy.Closed}}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{Breaker: tt.breaker, Clock: clk})
			for i, s := range tt.steps {
				if s.n == 0 && s.d >= time.Second && s.err == nil && s.state == policy.HalfOpen {
					clk.Advance(s.d) // a wait, not a call
				} else {
					for range max(s.n, 1) {
						if !call(g, clk, s.d, s.err) {
							t.Fatalf("step %d: refused", i)
						}
					}
				}
				if s.state != policy.Closed || i == len(tt.steps)-1 {
					if got := g.State(); got != s.state {
						t.Fatalf("step %d: state %v, want %v", i, got, s.state)
					}
				}
			}
			if st := g.Stats(); st.SlowCalls != tt.slow || st.Successes != tt.succ {
				t.Fatalf("SlowCalls %d, Successes %d; want %d, %d", st.SlowCalls, st.Successes, tt.slow, tt.succ)
			}
		})
	}
}

// TestSlowCallRunSucceeds: Run returns the slow call's success; the breaker
// counts it, and the events say so.
func TestSlowCallRunSucceeds(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var rec recorder
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, SlowCall: policy.SlowCall{Threshold: 100 * ms}},
		Clock:   clk,
		OnEvent: rec.event,
	})
	err := g.Run(context.Background(), func(context.Context) error { clk.Advance(250 * ms); return nil })
	if err != nil {
		t.Fatalf("Run = %v, want the slow call's success", err)
	}
	st := g.Stats()
	if st.State != policy.Open || st.SlowCalls != 1 || st.Successes != 1 || st.Failures != 0 || st.SlowThreshold != 100*ms {
		t.Fatalf("stats %+v", st)
	}
	evs := rec.events()
	if len(evs) != 2 || evs[0].Kind != policy.EventSlowCall || evs[0].Delay != 250*ms || !errors.Is(evs[0].Err, policy.ErrSlowCall) ||
		evs[1].Kind != policy.EventBreakerOpened || evs[1].Err != policy.ErrSlowCall {
		t.Fatalf("events %+v", evs)
	}
	if st.Tokens != 10 {
		t.Fatalf("tokens %v: a slow call earns none, and spends none", st.Tokens)
	}
}

// TestSlowCallDerivedThreshold: the default threshold is max(Floor,
// Factor x baseline), from the 33rd attempt on.
func TestSlowCallDerivedThreshold(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		slow     policy.SlowCall
		every    int // Latency.SampleEvery
		latency  time.Duration
		lo, hi   time.Duration // SlowThreshold after 200 attempts of latency
		nextSlow time.Duration // an attempt this long is slow
		nextOK   time.Duration // an attempt this long is not
	}{
		{"floor", policy.SlowCall{}, 0, ms, 100 * ms, 100 * ms, 101 * ms, 100 * ms},
		{"factor 5 of the baseline", policy.SlowCall{}, 0, 50 * ms, 220 * ms, 290 * ms, 300 * ms, 210 * ms},
		{"custom factor", policy.SlowCall{Factor: 2}, 0, 200 * ms, 350 * ms, 460 * ms, 470 * ms, 340 * ms},
		{"custom floor", policy.SlowCall{Floor: time.Second}, 0, 50 * ms, time.Second, time.Second, 1001 * ms, time.Second},
		{"every attempt a sample", policy.SlowCall{}, 1, 50 * ms, 220 * ms, 290 * ms, 300 * ms, 210 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1, SlowCall: tt.slow},
				Latency: policy.Latency{SampleEvery: tt.every}, Clock: clk})
			for i := range 200 {
				if i < 32 && g.Stats().SlowThreshold != 0 {
					t.Fatalf("a threshold after %d attempts, before the baseline warmed up", i)
				}
				call(g, clk, tt.latency, nil)
			}
			thr := g.Stats().SlowThreshold
			if thr < tt.lo || thr > tt.hi {
				t.Fatalf("SlowThreshold %v, want within [%v, %v]", thr, tt.lo, tt.hi)
			}
			call(g, clk, tt.nextOK, nil)
			if g.State() != policy.Closed {
				t.Fatalf("a %v call is slow at threshold %v", tt.nextOK, thr)
			}
			call(g, clk, tt.nextSlow, nil)
			if g.State() != policy.Open {
				t.Fatalf("a %v call is not slow at threshold %v", tt.nextSlow, thr)
			}
		})
	}
}

// TestSlowCallWarmUpLearnsAnySpeed: a dependency that is slow from the start
// is its own baseline, not a slow call.
func TestSlowCallWarmUpLearnsAnySpeed(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1}, Clock: clk})
	for range 100 {
		call(g, clk, 2*time.Second, nil)
	}
	if st := g.Stats(); st.State != policy.Closed || st.SlowCalls != 0 || st.SlowThreshold < 8*time.Second {
		t.Fatalf("stats %+v", st)
	}
}

// TestSlowCallDependencyTurnsSlow is the case slow calls are for: a
// dependency going from 1ms to 500ms trips the default breaker, the
// baseline does not learn the slowness while it is being caught, and a
// shift that lasts is accepted after minutes of slow probes (also when the
// breaker probes rarely).
func TestSlowCallDependencyTurnsSlow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		breaker policy.Breaker
		lo, hi  time.Duration // when the 500ms calls are accepted
	}{
		{"defaults", policy.Breaker{}, 5 * time.Minute, 10 * time.Minute},
		{"probes up to 10 minutes apart", policy.Breaker{MaxOpenTimeout: 10 * time.Minute}, 20 * time.Minute, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			g := mustNew(t, policy.Policy{Breaker: &tt.breaker, Clock: clk})
			for range 100 {
				call(g, clk, ms, nil)
			}
			for i := range 5 {
				if g.State() != policy.Closed {
					t.Fatalf("open after %d slow calls", i)
				}
				call(g, clk, 500*ms, nil)
			}
			if g.State() != policy.Open {
				t.Fatalf("5 calls of 500ms after 1ms: state %v, want open", g.State())
			}
			// Keep the dependency at 500ms: probe whenever the breaker lets
			// one through, until a probe is no longer slow.
			start := clk.Now()
			var accepted time.Duration
			for range 10_000 {
				if ra := g.RetryAfter(); ra > 0 {
					clk.Advance(ra)
				}
				before := g.Stats().SlowCalls
				if !call(g, clk, 500*ms, nil) {
					t.Fatal("a probe was refused after its open period")
				}
				elapsed := clk.Now().Sub(start)
				if elapsed < tt.lo*4/5 && g.Stats().SlowThreshold > 200*ms {
					t.Fatalf("the baseline chased the slowness: threshold %v after %v", g.Stats().SlowThreshold, elapsed)
				}
				if g.Stats().SlowCalls == before {
					accepted = elapsed
					break
				}
			}
			if accepted < tt.lo || accepted > tt.hi {
				t.Fatalf("500ms accepted after %v of slow probes, want within [%v, %v]", accepted, tt.lo, tt.hi)
			}
			if g.State() != policy.Closed {
				t.Fatalf("state %v after the accepted probe", g.State())
			}
		})
	}
}

// TestSlowCallBaselineDoesNotChaseUnderLoad: many slow calls at once (a
// busy tenant whose dependency turned slow, with a breaker that is slow to
// trip) do not teach the baseline the slowness: it drifts by time, not by
// the number of slow samples.
func TestSlowCallBaselineDoesNotChaseUnderLoad(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{Breaker: &policy.Breaker{ConsecutiveFailures: 1 << 30}, Clock: clk})
	for range 100 {
		call(g, clk, ms, nil)
	}
	ctx := context.Background()
	permits := make([]policy.Permit, 100)
	for batch := range 100 { // 100 calls of 500ms at once, 100 times: 50s
		for i := range permits {
			p, err := g.Allow(ctx)
			if err != nil {
				t.Fatal(err)
			}
			permits[i] = p
		}
		clk.Advance(500 * ms)
		for i := range permits {
			permits[i].Done(nil)
		}
		if st := g.Stats(); st.SlowCalls != uint64(100*(batch+1)) || st.SlowThreshold != 100*ms {
			t.Fatalf("batch %d: %d slow calls, threshold %v: the baseline learned the slowness", batch, st.SlowCalls, st.SlowThreshold)
		}
	}
}

// TestSlowCallJudgedBeforeItsSample: a slow call that is also a latency
// sample moves the baseline (a drift), but is judged by the threshold in
// force when it ended, not by the one it moved.
func TestSlowCallJudgedBeforeItsSample(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1 << 30, SlowCall: policy.SlowCall{Factor: 2}},
		Latency: policy.Latency{SampleEvery: 1},
		Clock:   clk,
	})
	feed(g, clk, 200*ms, 200) // threshold about 400ms
	call(g, clk, 470*ms, nil) // slow; the drift starts
	clk.Advance(30 * time.Second)
	call(g, clk, 470*ms, nil) // slow; its drift makes the threshold 470ms
	if st := g.Stats(); st.SlowCalls != 2 || st.SlowThreshold != 470*ms {
		t.Fatalf("%d slow calls, threshold %v; want 2 and 470ms", st.SlowCalls, st.SlowThreshold)
	}
	call(g, clk, 470*ms, nil) // now accepted
	if st := g.Stats(); st.SlowCalls != 2 {
		t.Fatalf("%d slow calls after the threshold moved to 470ms", st.SlowCalls)
	}
}

// TestSlowCallBaselineIgnoresFailures: the baseline is what a success
// takes; failures, timeouts included, do not move it.
func TestSlowCallBaselineIgnoresFailures(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	g := mustNew(t, policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1 << 30},
		Latency: policy.Latency{SampleEvery: 1},
		Clock:   clk,
	})
	feed(g, clk, ms, 100)
	for range 200 { // over half an hour of timeouts
		call(g, clk, 10*time.Second, context.DeadlineExceeded)
	}
	if st := g.Stats(); st.SlowThreshold != 100*ms || st.Failures != 200 {
		t.Fatalf("threshold %v after failures only (%d)", st.SlowThreshold, st.Failures)
	}
}
