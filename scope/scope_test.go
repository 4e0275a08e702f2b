package scope_test

// The scope's behaviour tests, one table each; long because the table, its
// pins and its sweeps are one concern (see scope.go).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// tripTemplate is a policy whose breaker opens on the first failure and
// stays open for an hour of the fake clock.
func tripTemplate(clk policy.Clock) policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour},
		Clock:   clk,
	}
}

func trip(t *testing.T, g *policy.Guard) {
	t.Helper()
	p, err := g.Allow(context.Background())
	if err != nil {
		t.Fatalf("Allow: %v", err)
	}
	p.Done(errors.New("boom"))
	if st := g.State(); st != policy.Open {
		t.Fatalf("breaker state %v after a failure, want open", st)
	}
}

// evictions collects OnEvict calls.
type evictions struct {
	mu   sync.Mutex
	keys []string
}

func (ev *evictions) hook(k string) {
	ev.mu.Lock()
	ev.keys = append(ev.keys, k)
	ev.mu.Unlock()
}

func (ev *evictions) take() []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	k := ev.keys
	ev.keys = nil
	slices.Sort(k)
	return k
}

func key(i int) string { return fmt.Sprintf("k%04d", i) }

func TestNewRejectsInvalidOptions(t *testing.T) {
	t.Parallel()
	bad := policy.Default()
	bad.Retry.MaxAttempts = -1
	tests := []struct {
		name     string
		template policy.Policy
		opts     scope.Options[string]
		wantErr  error // the panic value must match it, if set
	}{
		{name: "negative MaxKeys", template: policy.Default(), opts: scope.Options[string]{MaxKeys: -1}},
		{name: "negative HardCeiling", template: policy.Default(), opts: scope.Options[string]{HardCeiling: -1}},
		{name: "HardCeiling below MaxKeys", template: policy.Default(), opts: scope.Options[string]{MaxKeys: 10, HardCeiling: 9}},
		{name: "invalid template", template: bad, wantErr: policy.ErrInvalidPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("New did not panic")
				}
				if tt.wantErr != nil {
					if err, ok := r.(error); !ok || !errors.Is(err, tt.wantErr) {
						t.Fatalf("panic value %v, want an error matching %v", r, tt.wantErr)
					}
				}
			}()
			scope.New(tt.template, tt.opts)
		})
	}
}

func TestForReturnsOneGuardPerKey(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[string]{})
	a, b := s.For("a"), s.For("b")
	if a == nil || b == nil || a == b {
		t.Fatalf("For returned %p and %p, want two distinct guards", a, b)
	}
	if s.For("a") != a {
		t.Fatal("a second lookup of a returned another guard")
	}
	if !s.LockFree("a") {
		t.Fatal("a is not found by the lock-free probe")
	}
	st := s.Stats()
	if st.Size != 2 || st.Misses != 2 || st.Hits != 1 {
		t.Fatalf("stats %+v, want size 2, misses 2, hits 1", st)
	}
}

func TestHitAllocatesNothing(t *testing.T) {
	s := scope.New(policy.Default(), scope.Options[string]{})
	s.For("tenant")
	if n := testing.AllocsPerRun(1000, func() { s.For("tenant") }); n != 0 {
		t.Fatalf("For on a hit allocates %v times", n)
	}
	if n := testing.AllocsPerRun(1000, func() { s.Pin("tenant"); s.Unpin("tenant") }); n != 0 {
		t.Fatalf("Pin+Unpin on a hit allocates %v times", n)
	}
}

// TestTableGrowsForProtectedKeys fills a scope with open breakers, which
// sweeps keep below the ceiling: the table grows past its first size and
// every key stays reachable without a lock.
func TestTableGrowsForProtectedKeys(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	s := scope.New(tripTemplate(clk), scope.Options[int]{MaxKeys: 16})
	first := s.TableSize()
	for i := range 60 {
		trip(t, s.For(i))
	}
	s.Quiesce()
	if s.TableSize() <= first {
		t.Fatalf("table size %d, still %d with %d keys", s.TableSize(), first, s.Len())
	}
	for i := range 60 {
		if !s.LockFree(i) {
			t.Fatalf("key %d not found by the lock-free probe", i)
		}
	}
	if st := s.Stats(); st.Evictions != 0 || st.Size != 60 {
		t.Fatalf("stats %+v, want 60 keys, no eviction", st)
	}
}

// TestEvictionKeepsProbeSequences evicts keys from crowded clusters (many
// keys in a small table) and checks that every survivor is still found by
// the lock-free probe: deletion shifts clusters back without holes.
func TestEvictionKeepsProbeSequences(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		s := scope.New(policy.Default(), scope.Options[int]{MaxKeys: 8, HardCeiling: 8})
		r := rand.New(rand.NewPCG(uint64(round), 1))
		live := map[int]bool{}
		for i := range 2000 {
			k := int(r.Uint32N(64))
			s.For(k)
			live[k] = true
			if i%97 == 0 {
				s.SweepNow()
			}
			n := 0
			for k := range 64 {
				if s.LockFree(k) {
					n++
				}
			}
			if n != s.Len() {
				t.Fatalf("round %d step %d: lock-free probe finds %d keys, Len %d", round, i, n, s.Len())
			}
		}
	}
}

func TestCapRespectedAfterSweeps(t *testing.T) {
	t.Parallel()
	const maxKeys = 64
	ev := new(evictions)
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: maxKeys, OnEvict: ev.hook})
	bound := 4*maxKeys + maxKeys // default HardCeiling + MaxKeys
	high := 0
	for i := range 5000 {
		s.For(key(i))
		high = max(high, s.Len())
		if s.Len() > bound {
			t.Fatalf("Len %d exceeds HardCeiling+MaxKeys %d after %d keys", s.Len(), bound, i+1)
		}
	}
	// The lookups did the sweeping: the scope stayed near its cap.
	if high > maxKeys+maxKeys/2 {
		t.Errorf("Len peaked at %d with MaxKeys %d: sweeps did not keep up", high, maxKeys)
	}
	s.SweepNow()
	st := s.Stats()
	if st.Size > maxKeys {
		t.Fatalf("Len %d after a sweep, want at most %d", st.Size, maxKeys)
	}
	if st.Sweeps == 0 || st.Evictions != 5000-uint64(st.Size) {
		t.Fatalf("stats %+v: want evictions = 5000 - size", st)
	}
	if got := len(ev.take()); uint64(got) != st.Evictions {
		t.Fatalf("OnEvict called %d times for %d evictions", got, st.Evictions)
	}
}

func TestRecentlySeenKeysSurvive(t *testing.T) {
	t.Parallel()
	ev := new(evictions)
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: 100, OnEvict: ev.hook})
	guards := map[string]*policy.Guard{}
	for i := range 100 {
		guards[key(i)] = s.For(key(i))
	}
	s.SweepNow() // all were seen since the start
	if s.Len() != 100 || len(ev.take()) != 0 {
		t.Fatalf("first sweep evicted keys seen since the previous one (Len %d)", s.Len())
	}
	for i := range 10 {
		s.For(key(i))
	}
	s.SweepNow()
	var want []string
	for i := 10; i < 100; i++ {
		want = append(want, key(i))
	}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want keys 10..99", got)
	}
	for i := range 10 {
		if s.For(key(i)) != guards[key(i)] {
			t.Fatalf("%s was seen and survived, but its guard changed", key(i))
		}
	}
	if s.Len() != 10 {
		t.Fatalf("Len %d, want 10", s.Len())
	}
}

func TestSeenKeysBeyondCapAreTrimmed(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: 64, HardCeiling: 1000})
	// Insert more keys than MaxKeys without letting a lookup sweep: they
	// are all seen, and a sweep must still bring the scope to its cap.
	for i := range 200 {
		s.For(key(i))
	}
	s.SweepNow()
	if n := s.Len(); n > 64 {
		t.Fatalf("Len %d after a sweep of 200 seen keys, want at most 64", n)
	}
}

func TestOpenBreakersSurviveUnderCeiling(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	ev := new(evictions)
	s := scope.New(tripTemplate(clk), scope.Options[string]{MaxKeys: 8, HardCeiling: 16, OnEvict: ev.hook})
	open := map[string]*policy.Guard{}
	for i := range 4 {
		g := s.For(key(i))
		trip(t, g)
		open[key(i)] = g
	}
	for i := 4; i < 8; i++ {
		s.For(key(i))
	}
	s.SweepNow()
	s.SweepNow() // nothing was seen since the first sweep
	evicted := ev.take()
	for i := 4; i < 8; i++ {
		if !slices.Contains(evicted, key(i)) {
			t.Fatalf("closed unseen key %s was not evicted (evicted %v)", key(i), evicted)
		}
	}
	if s.Len() != 4 {
		t.Fatalf("Len %d, want the 4 open breakers", s.Len())
	}
	for k, g := range open {
		if s.For(k) != g {
			t.Fatalf("open breaker %s was evicted: protection reset", k)
		}
	}
	// Half-open breakers are protected too.
	clk.ns.Add(int64(2 * time.Hour))
	s.SweepNow()
	s.SweepNow()
	for k, g := range open {
		if g.State() != policy.HalfOpen || s.For(k) != g {
			t.Fatalf("half-open breaker %s was evicted", k)
		}
	}
}

func TestOpenBreakersEvictedBeyondCeiling(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	s := scope.New(tripTemplate(clk), scope.Options[string]{MaxKeys: 4, HardCeiling: 10})
	for i := range 40 {
		trip(t, s.For(key(i)))
		if n := s.Len(); n > 14 {
			t.Fatalf("Len %d beyond HardCeiling+MaxKeys", n)
		}
	}
	s.SweepNow()
	if n := s.Len(); n > 10 {
		t.Fatalf("Len %d after a sweep, want at most HardCeiling 10", n)
	}
}

func TestPinnedKeysSurvive(t *testing.T) {
	t.Parallel()
	ev := new(evictions)
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: 4, HardCeiling: 8, OnEvict: ev.hook})
	g := s.Pin("parked")
	s.Pin("parked") // pins are counted
	if s.For("parked") != g {
		t.Fatal("Pin and For returned different guards")
	}
	if st := s.Stats(); st.Pinned != 1 {
		t.Fatalf("Pinned %d, want 1 key", st.Pinned)
	}
	for i := range 20 {
		s.For(key(i))
	}
	s.SweepNow()
	s.SweepNow()
	if s.For("parked") != g {
		t.Fatal("pinned key was evicted")
	}
	s.Unpin("parked")
	s.SweepNow()
	s.SweepNow()
	if s.For("parked") != g {
		t.Fatal("key with one pin left was evicted")
	}
	s.Unpin("parked")
	s.Unpin("parked") // extra Unpin: no-op
	if st := s.Stats(); st.Pinned != 0 {
		t.Fatalf("Pinned %d after unpinning, want 0", st.Pinned)
	}
	ev.take()
	s.SweepNow()
	s.SweepNow()
	if got := ev.take(); !slices.Contains(got, "parked") {
		t.Fatalf("unpinned, unseen key not evicted (evicted %v)", got)
	}
	if s.For("parked") == g {
		t.Fatal("evicted key came back with its old guard")
	}
}

func TestPinnedKeysEvictedBeyondCeiling(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[string]{MaxKeys: 4, HardCeiling: 10})
	for i := range 30 {
		s.Pin(key(i))
	}
	s.SweepNow()
	st := s.Stats()
	if st.Size > 10 || st.Pinned != st.Size {
		t.Fatalf("stats %+v, want at most 10 keys, all pinned", st)
	}
	for i := range 30 {
		s.Unpin(key(i)) // of evicted keys: no-op
	}
	if st := s.Stats(); st.Pinned != 0 {
		t.Fatalf("Pinned %d after unpinning everything", st.Pinned)
	}
}

func TestEvictedKeyComesBackFresh(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	var shapes atomic.Int64
	s := scope.New(tripTemplate(clk), scope.Options[string]{
		MaxKeys: 4,
		Shape: func(string) policy.Policy {
			shapes.Add(1)
			return tripTemplate(clk)
		},
	})
	old := s.For("t")
	// An open breaker survives; close it first by moving past the open
	// period and succeeding a probe, so eviction is allowed.
	trip(t, old)
	clk.ns.Add(int64(2 * time.Hour))
	p, err := old.Allow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p.Done(nil)
	s.SweepNow()
	s.SweepNow()
	fresh := s.For("t")
	if fresh == old {
		t.Fatal("evicted key got its old guard back")
	}
	if st := fresh.State(); st != policy.Closed {
		t.Fatalf("fresh guard state %v", st)
	}
	if n := shapes.Load(); n != 2 {
		t.Fatalf("Shape ran %d times over two key lives, want 2", n)
	}
}

// TestEvictedGuardHeldByCallerIsIsolated holds a guard across its key's
// eviction. The scope reuses the evicted guard's state for the next new key;
// calls through the old guard must reach neither that key's guard nor the
// guard its own key gets back.
func TestEvictedGuardHeldByCallerIsIsolated(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	s := scope.New(tripTemplate(clk), scope.Options[string]{MaxKeys: 1})
	held := s.For("a")
	s.SweepNow()
	s.SweepNow() // "a" unseen for a whole sweep: evicted
	if _, ok := s.Peek("a"); ok {
		t.Fatal("a was not evicted")
	}
	b := s.For("b") // built on a's old state
	trip(t, held)   // the holder keeps using a's evicted guard
	if st := b.Stats(); st.State != policy.Closed || st.Failures != 0 {
		t.Fatalf("b's guard saw calls made through a's evicted guard: %+v", st)
	}
	a := s.For("a")
	if a == held || a.State() != policy.Closed {
		t.Fatalf("a came back as the held guard (%v) or not fresh (%v)", a == held, a.State())
	}
	if held.State() != policy.Open {
		t.Fatalf("the held guard state %v, want open: it keeps working", held.State())
	}
}

func TestShapeRunsOncePerKeyLifeUnderRaces(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := map[string]int{}
	s := scope.New(policy.Default(), scope.Options[string]{
		MaxKeys: 10_000,
		Shape: func(k string) policy.Policy {
			mu.Lock()
			calls[k]++
			mu.Unlock()
			return policy.Default()
		},
	})
	const racers, keys = 8, 200
	got := make([][keys]*policy.Guard, racers)
	var start, done sync.WaitGroup
	start.Add(1)
	for r := range racers {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			for i := range keys {
				if r%2 == 0 {
					got[r][i] = s.For(key(i))
				} else {
					got[r][i] = s.Pin(key(i))
					s.Unpin(key(i))
				}
			}
		}()
	}
	start.Done()
	done.Wait()
	for i := range keys {
		if calls[key(i)] != 1 {
			t.Fatalf("Shape ran %d times for %s", calls[key(i)], key(i))
		}
		for r := 1; r < racers; r++ {
			if got[r][i] != got[0][i] {
				t.Fatalf("racers got different guards for %s", key(i))
			}
		}
	}
}

func TestInvalidShapeFallsBackToTemplate(t *testing.T) {
	t.Parallel()
	template := policy.Default()
	template.Deadline = time.Second
	var gotKey string
	var gotErr error
	s := scope.New(template, scope.Options[string]{
		Shape: func(k string) policy.Policy {
			p := template
			p.Deadline = -1
			return p
		},
		OnShapeError: func(k string, err error) { gotKey, gotErr = k, err },
	})
	g := s.For("bad")
	if g.Policy().Deadline != time.Second {
		t.Fatalf("deadline %v, want the template's 1s", g.Policy().Deadline)
	}
	if gotKey != "bad" || !errors.Is(gotErr, policy.ErrInvalidPolicy) {
		t.Fatalf("OnShapeError(%q, %v), want (bad, ErrInvalidPolicy)", gotKey, gotErr)
	}
	if st := s.Stats(); st.ShapeErrors != 1 {
		t.Fatalf("ShapeErrors %d, want 1", st.ShapeErrors)
	}
}

func TestShapePanicLeavesNoEntry(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	fail.Store(true)
	s := scope.New(policy.Default(), scope.Options[string]{
		Shape: func(string) policy.Policy {
			if fail.Load() {
				panic("shape failed")
			}
			return policy.Default()
		},
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("For did not pass Shape's panic on")
			}
		}()
		s.For("k")
	}()
	fail.Store(false)
	g := s.For("k")
	if g == nil || s.For("k") != g {
		t.Fatal("key unusable after a Shape panic")
	}
	if st := s.Stats(); st.Size != 1 || st.Misses != 1 {
		t.Fatalf("stats %+v after a Shape panic and a build, want one key, one miss", st)
	}
}

func TestOnEventCarriesKey(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	var mu sync.Mutex
	var got []string
	var inner atomic.Int64
	template := tripTemplate(clk)
	template.OnEvent = func(policy.Event) { inner.Add(1) }
	s := scope.New(template, scope.Options[string]{
		OnEvent: func(k string, e policy.Event) {
			mu.Lock()
			got = append(got, k+":"+e.Kind.String())
			mu.Unlock()
		},
	})
	trip(t, s.For("acme"))
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(got, "acme:breaker-opened") {
		t.Fatalf("events %v, want acme:breaker-opened", got)
	}
	if inner.Load() == 0 {
		t.Fatal("the template's own OnEvent was not called")
	}
}

func TestRangeSeesEveryKey(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[string]{})
	for i := range 20 {
		s.For(key(i))
	}
	seen := map[string]bool{}
	s.Range(func(k string, g *policy.Guard) bool {
		if g != s.For(k) {
			t.Errorf("Range gave %s a guard For does not", k)
		}
		seen[k] = true
		return true
	})
	if len(seen) != 20 {
		t.Fatalf("Range saw %d keys, want 20", len(seen))
	}
	n := 0
	s.Range(func(string, *policy.Guard) bool { n++; return n < 3 })
	if n != 3 {
		t.Fatalf("Range went on after fn returned false (%d calls)", n)
	}
}

// TestConcurrentLookupsAndSweeps hammers a small scope from many goroutines
// (For, Pin/Unpin, Range, Stats) so that inserts and sweeps run all the
// time; run it with -race.
func TestConcurrentLookupsAndSweeps(t *testing.T) {
	t.Parallel()
	const maxKeys, universe, workers = 32, 400, 6
	var shapes atomic.Int64
	s := scope.New(policy.Default(), scope.Options[int]{
		MaxKeys: maxKeys,
		Shape:   func(int) policy.Policy { shapes.Add(1); return policy.Default() },
	})
	bound := 5 * maxKeys
	var wg sync.WaitGroup
	var over atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 20_000 {
				k := int(r.Uint32N(universe))
				switch {
				case w == 0 && i%100 == 0:
					s.Range(func(int, *policy.Guard) bool { return true })
					_ = s.Stats()
				case i%10 == 0:
					if s.Pin(k) == nil {
						panic("nil guard")
					}
					s.Unpin(k)
				default:
					if s.For(k) == nil {
						panic("nil guard")
					}
				}
				if s.Len() > bound {
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if over.Load() != 0 {
		t.Fatalf("Len exceeded HardCeiling+MaxKeys %d times", over.Load())
	}
	s.Quiesce()
	st := s.Stats()
	if st.Pinned != 0 {
		t.Fatalf("Pinned %d after balanced Pin/Unpin", st.Pinned)
	}
	if uint64(shapes.Load()) != st.Misses {
		t.Fatalf("Shape ran %d times for %d misses", shapes.Load(), st.Misses)
	}
	if st.Misses-st.Evictions != uint64(st.Size) {
		t.Fatalf("stats %+v: misses - evictions != size", st)
	}
	s.SweepNow()
	s.SweepNow()
	if n := s.Len(); n != 0 {
		t.Fatalf("Len %d after two sweeps with no lookups, want 0", n)
	}
}

// waitFor polls cond until it holds, failing the test after 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHardBoundHoldsWhenSweepsCannotRun(t *testing.T) {
	t.Parallel()
	const maxKeys, ceiling = 8, 16
	s := scope.New(policy.Default(), scope.Options[int]{MaxKeys: maxKeys, HardCeiling: ceiling})
	release := s.HoldSweeps()
	var high, inserted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			s.For(i)
			inserted.Add(1)
			if n := int64(s.Len()); n > high.Load() {
				high.Store(n)
			}
		}
	}()
	// With no sweep work possible, new keys pile up to the bound, and the
	// lookup of the next one waits for the sweep.
	waitFor(t, "the scope to reach HardCeiling+MaxKeys", func() bool { return s.Len() == ceiling+maxKeys })
	if n := inserted.Load(); n != ceiling+maxKeys-1 && n != ceiling+maxKeys {
		t.Fatalf("%d lookups done with the scope at its bound", n)
	}
	release()
	<-done
	if h := high.Load(); h > ceiling+maxKeys {
		t.Fatalf("Len reached %d, beyond HardCeiling+MaxKeys %d", h, ceiling+maxKeys)
	}
}

// TestKeySeenBeforeItsEvictionSurvives: a sweep finds cold keys and evicts
// them over its later steps; a key looked up in between keeps its guard, and
// so does a key whose breaker opened in between.
func TestKeySeenBeforeItsEvictionSurvives(t *testing.T) {
	t.Parallel()
	clk := new(fakeClock)
	ev := new(evictions)
	s := scope.New(tripTemplate(clk), scope.Options[string]{MaxKeys: 8, OnEvict: ev.hook})
	guards := map[string]*policy.Guard{}
	for i := range 8 {
		guards[key(i)] = s.For(key(i))
	}
	s.SweepNow() // all seen: all kept, and the epoch moves on
	s.ScanOnly() // none seen since: all found cold, none evicted yet
	if n := s.Waiting(); n != 8 || s.Len() != 8 {
		t.Fatalf("%d cold keys waiting, Len %d; want 8 and 8", n, s.Len())
	}
	if s.For(key(3)) != guards[key(3)] { // looked up while waiting
		t.Fatal("a waiting key lost its guard before its eviction")
	}
	trip(t, guards[key(5)]) // breaker opened while waiting
	s.Quiesce()
	var want []string
	for i := range 8 {
		if i != 3 && i != 5 {
			want = append(want, key(i))
		}
	}
	if got := ev.take(); !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want %v", got, want)
	}
	for _, k := range []string{key(3), key(5)} {
		if g, ok := s.Peek(k); !ok || g != guards[k] {
			t.Fatalf("%s was evicted or got a new guard", k)
		}
	}
}

// TestSweepStepEvictsFewKeys: cold keys found together leave a few per
// step, not all in the step that found them, and all are gone once the
// sweep ends.
func TestSweepStepEvictsFewKeys(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[int]{MaxKeys: 64})
	for i := range 64 {
		s.For(i)
	}
	s.SweepNow()
	s.ScanOnly()
	for waiting := s.Waiting(); waiting > 0; {
		before := s.Len()
		s.Step()
		evicted := before - s.Len()
		if evicted < 1 || evicted > 1+waiting/9 {
			t.Fatalf("a step evicted %d keys with %d waiting", evicted, waiting)
		}
		waiting = s.Waiting()
	}
	if st := s.Stats(); st.Size != 0 || st.Evictions != 64 {
		t.Fatalf("stats %+v after the sweep, want every key evicted", st)
	}
}

// TestLookupWaitsForBuildInProgress: a lookup of a key whose Shape is still
// running on another goroutine waits for that build and gets its guard; if
// the build panics instead, the waiting lookup builds the key itself.
func TestLookupWaitsForBuildInProgress(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		entered, release := make(chan struct{}), make(chan struct{})
		var calls atomic.Int64
		s := scope.New(policy.Default(), scope.Options[string]{
			Shape: func(string) policy.Policy {
				if calls.Add(1) == 1 {
					close(entered)
					<-release
					if fail {
						panic("shape failed")
					}
				}
				return policy.Default()
			},
		})
		first := make(chan *policy.Guard, 1)
		go func() {
			defer func() {
				if recover() != nil {
					first <- nil
				}
			}()
			first <- s.For("k")
		}()
		<-entered
		second := make(chan *policy.Guard, 1)
		go func() { second <- s.For("k") }()
		select {
		case <-second:
			t.Fatalf("fail=%v: a lookup returned while the key's build was in progress", fail)
		case <-time.After(20 * time.Millisecond):
		}
		close(release)
		g1, g2 := <-first, <-second
		switch {
		case g2 == nil:
			t.Fatalf("fail=%v: the waiting lookup got no guard", fail)
		case !fail && g1 != g2:
			t.Fatal("the waiting lookup got another guard than the build it waited for")
		case fail && (g1 != nil || calls.Load() != 2):
			t.Fatalf("after a panicking build: first lookup %v, %d Shape calls; want nil and 2", g1, calls.Load())
		}
		if s.For("k") != g2 {
			t.Fatalf("fail=%v: the key's guard changed after the build", fail)
		}
	}
}

// TestNewKeySurvivesItsOwnStep: the lookup that inserts a key and then does
// a step of the sweep never evicts that key in that step, so the guard it
// returns is the key's (a failure recorded on it counts). With MaxKeys 4 a
// step scans the whole table, and every key is new: the seen keys a sweep
// keeps are full before it reaches many of them.
func TestNewKeySurvivesItsOwnStep(t *testing.T) {
	t.Parallel()
	s := scope.New(policy.Default(), scope.Options[int]{MaxKeys: 4})
	for i := range 5000 {
		g := s.For(i)
		if got, ok := s.Peek(i); !ok || got != g {
			t.Fatalf("key %d evicted by the lookup that inserted it (%d sweeps so far)", i, s.Stats().Sweeps)
		}
	}
}
