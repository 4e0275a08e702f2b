package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Guard is one instance of a [Policy]: it owns a circuit breaker, a retry
// budget, a latency estimate and a bulkhead, and runs work through them
// with [Guard.Run] or the two-step [Guard.Allow] and [Permit.Done].
//
// A Guard is safe for concurrent use. The closed-breaker success path takes
// no lock and reads the exact clock only for a latency sample (the
// slow-call check reads a coarse clock, one atomic load): it loads the
// packed state word and updates a few atomics, which are padded and sharded
// so that cores do not contend. It allocates nothing unless the policy has
// an AttemptTimeout (then one small context per attempt of Run). Failures,
// state changes and the budget floor take a mutex. A Guard takes about
// 1.2 KiB.
//
// A Guard built by a [Recycler] may have its state reused once it is
// retired; see [Recycler.Retire] for what a retired Guard does.
type Guard struct {
	st  atomic.Pointer[guard]
	gen uint64 // the life of st this Guard owns (recycled states)
	// The policy and hook of this Guard, which its state also holds: kept
	// here for Policy and for the fresh state a retired Guard moves to.
	r    *resolved
	hook func(Event)
}

// ShareTo makes dst, a zero Guard that was never used, a second handle on
// h's guard: calls through either run on one breaker, budget, latency
// estimate and bulkhead, and each handle's Stats count both. It is for an
// engine that keeps its own per-key state beside the guard (a consumer's
// tenant): a call through dst, a field of that state, reads no line of h,
// which with many keys is a cache miss a call. If h's state is retired (its
// key evicted, see [Recycler.Retire]), each handle moves to a fresh state
// of its own at its next call, as h alone would. Neither may be copied.
func (h *Guard) ShareTo(dst *Guard) {
	// r, hook and gen are written before st is first stored (attach) and
	// never after; st is read once, so dst owns the life h owned then.
	dst.r, dst.hook, dst.gen = h.r, h.hook, h.gen
	dst.st.Store(h.st.Load())
}

// attach makes g, a state no call is using, a fresh state of policy r and
// the state of h.
func (h *Guard) attach(g *guard, r *resolved, onEvent func(Event)) {
	g.init(r, onEvent)
	h.r, h.hook, h.gen = r, onEvent, g.life.Load()
	h.st.Store(g)
}

// enter returns the state a call through h runs on. For a recycled state it
// counts the call in (on shard sh) so that the state is not reused while the
// call runs, and if h has been retired it moves h to a fresh state of its
// own. The call ends with g.exit(sh).
//
// Why this is exact: a call increments active and then loads life; Retire
// stores life and the Recycler later loads every active count before reuse
// (all sequentially consistent). Either the call saw its own life, and then
// its increment precedes the reuse check, which refuses the state; or it saw
// a newer life and touches nothing but its own count.
func (h *Guard) enter(r uint32) (g *guard, sh uint8) {
	g = h.st.Load()
	if g.pool == nil {
		return g, 0
	}
	sh = uint8(r & (counterShards - 1))
	if checks(r) {
		countOn[int64](&g.counts[sh].active)
	} else {
		g.counts[sh].active.Add(1)
	}
	if g.life.Load() == h.gen {
		return g, sh
	}
	g.counts[sh].active.Add(-1)
	return h.detach(g), 0
}

// Prefetch loads the lines of h's state that a call from the calling
// goroutine reads and writes (the breaker's head, the latency estimate and
// the goroutine's counter shard), and nothing else, for an engine about to
// call h whose state is likely cold (one of many keys). The loads do not
// wait for each other, where the call's own accesses would wait for one
// miss after another: its first write is an atomic add, which waits for
// every load before it. Nothing on a zero Guard.
func (h *Guard) Prefetch() {
	g := h.st.Load()
	if g == nil {
		return
	}
	g.state.Load()
	g.lat.est.Load()
	g.counts[goroutineShard(shardSalt.v.Load())].active.Load()
}

// exit ends a call counted in by enter.
func (g *guard) exit(sh uint8) {
	if g.pool != nil {
		g.counts[sh&(counterShards-1)].active.Add(-1)
	}
}

// detach gives a retired h a fresh state of its own, never recycled.
func (h *Guard) detach(old *guard) *guard {
	n := &guard{}
	n.init(h.r, h.hook)
	if h.st.CompareAndSwap(old, n) {
		return n
	}
	return h.st.Load() // another call detached h first
}

// idle reports whether no call is counted in on g.
func (g *guard) idle() bool {
	var n int64
	for i := range g.counts {
		n += g.counts[i].active.Load()
	}
	return n == 0
}

// Policy returns the Policy this guard was built from, with copies of its
// Breaker and Budget taken by New: a template for a sibling guard.
func (h *Guard) Policy() Policy { return h.r.policy() }

// Deadline returns the policy's Deadline (zero: none) without copying the
// Policy, for engines that run attempts themselves: the total time of one
// unit of work across all its attempts and backoffs.
func (h *Guard) Deadline() time.Duration { return h.r.deadline }

// AttemptTimeout returns the policy's AttemptTimeout (zero: none), for
// engines that run attempts themselves (see also [Guard.AttemptContext]).
func (h *Guard) AttemptTimeout() time.Duration { return h.r.attemptTimeout }

// BeforeAttempt runs the policy's BeforeAttempt hook, if any (nil
// otherwise), so that an engine that runs attempts itself honours it as Run
// does: after the permit, before the attempt. On its error, release the
// permit and end the unit of work.
func (h *Guard) BeforeAttempt(ctx context.Context, attempt int) error {
	if h.r.before == nil {
		return nil
	}
	return h.r.before(ctx, attempt)
}

// Stats returns a snapshot of the guard's counters and estimates.
func (h *Guard) Stats() Stats {
	g, sh := h.enter(draw())
	s := g.stats()
	g.exit(sh)
	return s
}

// A Recycler keeps the states of retired guards and builds later guards on
// them, so that a keyed collection whose keys come and go (a scope under
// tenant churn) does not allocate a guard's 1.2 KiB of state per new key:
// a recycled guard costs one 32-byte allocation. A Recycler is safe for
// concurrent use; its guards may be of different Compiled policies.
//
// It is exported for keyed collections like scope.Scope, which live in
// another package; most users never need it: [New] and [Compiled.New]
// build guards that are never recycled.
type Recycler struct {
	mu   sync.Mutex
	free []*guard
	max  int
}

// NewRecycler returns a Recycler that keeps at most keep retired states
// (at least 1).
func NewRecycler(keep int) *Recycler {
	return &Recycler{max: max(keep, 1)}
}

// New is c.NewWithEvents(onEvent), on a retired state if one is free.
func (rc *Recycler) New(c *Compiled, onEvent func(Event)) *Guard {
	h := new(Guard)
	rc.Init(h, c, onEvent)
	return h
}

// Init is New building the guard in *h, which must be a zero Guard that was
// never used, typically a field of a larger per-key struct so that one
// allocation holds both. A Guard must not be copied.
func (rc *Recycler) Init(h *Guard, c *Compiled, onEvent func(Event)) {
	g := rc.take()
	if g == nil {
		g = &guard{pool: rc}
	}
	h.attach(g, c.r, onEvent)
}

// take pops a retired state that no call is using, or returns nil. A state
// still in use by a call through its retired Guard is left to the GC.
func (rc *Recycler) take() *guard {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for n := len(rc.free); n > 0; n = len(rc.free) {
		g := rc.free[n-1]
		rc.free[n-1] = nil
		rc.free = rc.free[:n-1]
		if g.idle() {
			g.warm()
			return g
		}
	}
	return nil
}

// Retire ends h's ownership of its state, which a later New of rc reuses
// once no call through h is in progress. Retiring is for a collection that
// drops h (a scope evicting its key); h stays safe to use afterwards: its
// next call moves it to a fresh state of its own (closed breaker, full
// budget, zero counters), so a caller still holding h can never affect the
// guard its old state now serves. Retire does nothing if h was not built by
// rc or is retired already.
func (rc *Recycler) Retire(h *Guard) {
	g := h.st.Load()
	if g.pool != rc || !g.life.CompareAndSwap(h.gen, h.gen+1) {
		return
	}
	rc.mu.Lock()
	if len(rc.free) < rc.max {
		rc.free = append(rc.free, g)
	}
	rc.mu.Unlock()
}
