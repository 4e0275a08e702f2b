package policy_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// dirty drives g through everything a life leaves behind: successes, a
// latency estimate, spent retry tokens, a trip.
func dirty(t *testing.T, g *policy.Guard, clk *fakeClock) {
	t.Helper()
	ctx := context.Background()
	for range 5 {
		if err := g.Run(ctx, func(context.Context) error { clk.Advance(time.Millisecond); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 2; i++ {
		if d := g.NextRetry(i, errFail, 0); !d.Retry {
			t.Fatalf("NextRetry %d: %+v", i, d)
		}
	}
	for g.State() != policy.Open {
		p, err := g.Allow(ctx)
		if err != nil {
			t.Fatalf("Allow before the trip: %v", err)
		}
		p.Done(errFail)
	}
}

func recyclerPolicy(clk *fakeClock) policy.Policy {
	p := policy.Default()
	p.Clock = clk
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: time.Hour}
	return p
}

// newRecycled returns a fake clock, a policy on it that trips after 3
// consecutive failures, and a Recycler.
func newRecycled(t *testing.T) (*fakeClock, *policy.Compiled, *policy.Recycler) {
	t.Helper()
	clk := newFakeClock()
	c, err := policy.Compile(recyclerPolicy(clk))
	if err != nil {
		t.Fatal(err)
	}
	return clk, c, policy.NewRecycler(4)
}

func TestRecycledGuardStartsFresh(t *testing.T) {
	clk, c, rc := newRecycled(t)
	old := rc.New(c, nil)
	dirty(t, old, clk)
	rc.Retire(old)

	g := rc.New(c, nil) // on old's state: the only one the recycler holds
	fresh := c.New()
	if got, want := g.Stats(), fresh.Stats(); got != want {
		t.Fatalf("recycled guard stats %+v, want a fresh guard's %+v", got, want)
	}
	// It trips after exactly ConsecutiveFailures failures again, like a new
	// guard: the consecutive count and the window start empty.
	for i := 1; i <= 3; i++ {
		p, err := g.Allow(context.Background())
		if err != nil {
			t.Fatalf("failure %d refused: %v", i, err)
		}
		p.Done(errFail)
		if want := i == 3; (g.State() == policy.Open) != want {
			t.Fatalf("after %d failures state %v", i, g.State())
		}
	}
}

func TestRetiredGuardCannotReachItsOldState(t *testing.T) {
	clk, c, rc := newRecycled(t)
	old := rc.New(c, nil)
	rc.Retire(old)
	g := rc.New(c, nil) // reuses old's state

	// Failures through the retired guard trip its own fresh state only.
	dirty(t, old, clk)
	if st := g.Stats(); st != c.New().Stats() {
		t.Fatalf("the guard on the recycled state saw the retired guard's calls: %+v", st)
	}
	if old.State() != policy.Open {
		t.Fatalf("retired guard state %v, want open (it keeps working on its own state)", old.State())
	}
	if !g.Closed() || old.Closed() {
		t.Fatalf("Closed: recycled %v, retired %v", g.Closed(), old.Closed())
	}
	rc.Retire(old) // already retired: nothing happens
	if g.Stats().State != policy.Closed {
		t.Fatal("a second Retire of the old guard reached the new one")
	}
}

func TestStateInUseIsNotReused(t *testing.T) {
	_, c, rc := newRecycled(t)
	old := rc.New(c, nil)
	p, err := old.Allow(context.Background()) // a call in progress
	if err != nil {
		t.Fatal(err)
	}
	rc.Retire(old)
	g := rc.New(c, nil)
	p.Done(errFail) // lands on the old state, which g must not have
	if st := g.Stats(); st.Failures != 0 {
		t.Fatalf("outcome of a permit from before the retire reached the next guard: %+v", st)
	}
	// Same with a Run in progress while its guard is retired.
	h := rc.New(c, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- h.Run(context.Background(), func(context.Context) error {
			close(entered)
			<-release
			return policy.Permanent(errFail) // one attempt
		})
	}()
	<-entered
	rc.Retire(h)
	next := rc.New(c, nil)
	close(release)
	if err := <-done; !errors.Is(err, errFail) {
		t.Fatalf("Run: %v", err)
	}
	if st := next.Stats(); st.Failures != 0 || st.ConsecutiveFailures != 0 {
		t.Fatalf("a Run that began before the retire reached the next guard: %+v", st)
	}
}

func TestRecyclerForeignAndBound(t *testing.T) {
	c, err := policy.Compile(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	a, b := policy.NewRecycler(1), policy.NewRecycler(1)
	plain := c.New()
	a.Retire(plain) // not a's: ignored
	if err := plain.Run(context.Background(), okFn); err != nil || plain.Stats().Successes != 1 {
		t.Fatalf("plain guard after a foreign Retire: %v, %+v", err, plain.Stats())
	}
	g := b.New(c, nil)
	a.Retire(g) // b's guard: ignored by a
	if err := g.Run(context.Background(), okFn); err != nil || g.Stats().Successes != 1 {
		t.Fatalf("guard after another recycler's Retire: %v, %+v", err, g.Stats())
	}
	// A recycled New allocates only the handle.
	rc := policy.NewRecycler(1)
	h := rc.New(c, nil)
	if n := testing.AllocsPerRun(100, func() {
		rc.Retire(h)
		h = rc.New(c, nil)
	}); n != 1 {
		t.Fatalf("Retire+New allocates %v times, want 1 (the Guard)", n)
	}
}

// TestRecyclerIsolationUnderChurn runs guards on several goroutines while
// others retire them and build new ones on the recycled states. Each guard
// counts the successes run through it; a guard's Stats may show fewer (a
// retired guard restarts on a fresh state) but never more: more would be
// another guard's calls leaking into its state.
func TestRecyclerIsolationUnderChurn(t *testing.T) {
	c, err := policy.Compile(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	rc := policy.NewRecycler(8)
	type slot struct {
		mu sync.Mutex
		g  *policy.Guard
		n  *atomic.Int64
	}
	slots := make([]slot, 16)
	for i := range slots {
		slots[i].g, slots[i].n = rc.New(c, nil), new(atomic.Int64)
	}
	check := func(g *policy.Guard, n *atomic.Int64) {
		if got := g.Stats().Successes; got > uint64(n.Load()) {
			t.Errorf("guard shows %d successes, only %d were run through it", got, n.Load())
		}
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 20000 {
				s := &slots[rng.IntN(len(slots))]
				s.mu.Lock()
				g, n := s.g, s.n
				s.mu.Unlock()
				n.Add(1) // before the call: Stats may be read mid-call
				if err := g.Run(context.Background(), okFn); err != nil {
					t.Error(err)
					return
				}
				check(g, n)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, 1))
		for range 20000 {
			s := &slots[rng.IntN(len(slots))]
			s.mu.Lock()
			old := s.g
			s.g, s.n = rc.New(c, nil), new(atomic.Int64)
			s.mu.Unlock()
			rc.Retire(old)
		}
	}()
	wg.Wait()
	for i := range slots {
		check(slots[i].g, slots[i].n)
	}
}

// TestRetiredGuardReadsFresh: the accessors that read a state without
// counting in report a fresh state for a retired guard, never the state's
// new owner.
func TestRetiredGuardReadsFresh(t *testing.T) {
	clk := newFakeClock()
	p := recyclerPolicy(clk)
	p.Latency.SampleEvery = 1
	p.Bulkhead = policy.Bulkhead{MaxConcurrent: 4, Adaptive: true}
	p.Breaker = nil // slow calls would open it
	c, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	rc := policy.NewRecycler(1)
	old := rc.New(c, nil)
	rc.Retire(old)
	g := rc.New(c, nil) // on old's state
	for range 50 {
		pm, _ := g.Allow(context.Background())
		clk.Advance(time.Millisecond)
		pm.Done(nil)
	}
	for range 50 {
		pm, _ := g.Allow(context.Background())
		clk.Advance(time.Second)
		pm.Done(nil)
	}
	if g.Latency() == 0 || g.Concurrency(0) == 4 {
		t.Fatalf("the new owner's state did not move: latency %v, concurrency %d", g.Latency(), g.Concurrency(0))
	}
	if old.Latency() != 0 || old.Concurrency(0) != 4 || !old.Closed() {
		t.Fatalf("retired guard reads its old state: latency %v, concurrency %d", old.Latency(), old.Concurrency(0))
	}
}

// TestPrefetch: Prefetch changes nothing a guard reports, on a zero Guard,
// a live one and a retired one.
func TestPrefetch(t *testing.T) {
	var zero policy.Guard
	zero.Prefetch()

	clk, c, rc := newRecycled(t)
	h := rc.New(c, nil)
	dirty(t, h, clk)
	before := h.Stats()
	h.Prefetch()
	if got := h.Stats(); got != before || h.State() != policy.Open {
		t.Fatalf("Prefetch changed the guard: %+v, then %+v (%v)", before, got, h.State())
	}
	rc.Retire(h)
	h.Prefetch()
	if !h.Closed() || h.Stats() != c.New().Stats() {
		t.Fatalf("a retired guard reads its old state after Prefetch: %+v", h.Stats())
	}
}

func TestShareTo(t *testing.T) {
	clk, c, rc := newRecycled(t)
	h := rc.New(c, nil)
	var d policy.Guard
	h.ShareTo(&d)

	// One guard behind two handles: a trip through d is h's, a success
	// through h is counted by d.
	dirty(t, &d, clk)
	if h.State() != policy.Open || h.Closed() {
		t.Fatalf("the trip through the shared handle left h %v", h.State())
	}
	if got, want := h.Stats(), d.Stats(); got != want {
		t.Fatalf("the handles' stats differ: h %+v, shared %+v", got, want)
	}

	// Retired: each handle moves to a fresh state of its own, and the key
	// that reuses the old state sees neither.
	rc.Retire(h)
	g := rc.New(c, nil) // on h's old state
	if !d.Closed() || d.Stats() != c.New().Stats() {
		t.Fatalf("the shared handle still reads the retired state: %+v", d.Stats())
	}
	dirty(t, &d, clk)
	if h.State() != policy.Closed {
		t.Fatalf("a trip through the shared handle after retirement reached h: %v", h.State())
	}
	if g.Stats() != c.New().Stats() {
		t.Fatalf("the state's next guard saw the shared handle's calls: %+v", g.Stats())
	}
}
