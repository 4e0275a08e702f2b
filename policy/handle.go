package policy

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Guard is one instance of a [Policy]: it owns a circuit breaker, a retry
// budget and a latency estimate, and runs work through them with [Guard.Run]
// or the two-step [Guard.Allow] and [Permit.Done].
//
// A Guard is safe for concurrent use. The closed-breaker success path takes
// no lock, allocates nothing and reads the clock only for a latency sample:
// it loads the packed state word and updates a few atomics, which are
// padded and sharded so that cores do not contend. Failures, state changes
// and the budget floor take a mutex. A Guard takes about 1.2 KiB.
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
	g.counts[sh].active.Add(1)
	if g.life.Load() == h.gen {
		return g, sh
	}
	g.counts[sh].active.Add(-1)
	return h.detach(g), 0
}

// exit ends a call counted in by enter.
func (g *guard) exit(sh uint8) {
	if g.pool != nil {
		g.counts[sh].active.Add(-1)
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
// Policy, for engines that run attempts themselves.
func (h *Guard) Deadline() time.Duration { return h.r.deadline }

// MaxAttempts returns the resolved maximum number of attempts.
func (h *Guard) MaxAttempts() int { return h.r.maxAttempts }

// Backoff returns the wait after the given failed attempt (from 1). prev is
// the previous wait, used by decorrelated jitter (0 before the first retry).
// It spends nothing.
func (h *Guard) Backoff(attempt int, err error, prev time.Duration) time.Duration {
	return h.r.backoffFor(attempt, err, prev)
}

// State returns the breaker state. A breaker whose open period has ended
// reports HalfOpen. Without a breaker it is always Closed.
func (h *Guard) State() State {
	g, sh := h.enter(rand.Uint32())
	st := g.breakerState()
	g.exit(sh)
	return st
}

// Closed reports whether the breaker is closed (always, without a breaker).
// It is State() == Closed without reading the clock, for code that scans
// many guards: an open breaker whose open period has ended is not closed.
func (h *Guard) Closed() bool {
	// One load, then a check that it was of h's own life: a state is reset
	// (and its state word stored) only after Retire moved life on.
	g := h.st.Load()
	st, _ := unpack(g.state.Load())
	if g.pool != nil && g.life.Load() != h.gen {
		return true // retired: its next call runs on a fresh, closed state
	}
	return st == Closed
}

// RetryAfter returns how long until the breaker admits a probe: zero unless
// the breaker is open.
func (h *Guard) RetryAfter() time.Duration {
	g, sh := h.enter(rand.Uint32())
	d := g.retryAfter()
	g.exit(sh)
	return d
}

// Stats returns a snapshot of the guard's counters and estimates.
func (h *Guard) Stats() Stats {
	g, sh := h.enter(rand.Uint32())
	s := g.stats()
	g.exit(sh)
	return s
}

// Allow is the first step of two-step use: it asks the Admit hook and the
// breaker whether an attempt may start now, without running anything. On
// refusal the error is an [*AdmitError] or an [*OpenError] whose RetryAfter
// says how long until a probe is admitted.
func (h *Guard) Allow(ctx context.Context) (Permit, error) {
	r := rand.Uint32()
	g, sh := h.enter(r)
	var p Permit
	if err := g.allow(ctx, &p, r); err != nil {
		g.exit(sh)
		return Permit{}, err
	}
	// The permit's shard is r's, the same as sh on a recycled state.
	p.counted = g.pool != nil
	return p, nil
}

// NextRetry is the retry decision of the executor, exposed for engines that
// schedule their own attempts. Given the attempt that just failed (from 1),
// its error, and the previous backoff (0 before the first retry), it returns
// the wait before the next attempt, or a non-nil error when there must be no
// retry: err itself when it is permanent or the attempts are used up, an
// [*OpenError] when the breaker will still be open after the wait (park
// rather than retry), or an [*ExhaustedError] when the budget refused. Only a
// scheduled retry spends a budget token; it emits EventRetryScheduled,
// EventRejected or EventBudgetExhausted accordingly.
func (h *Guard) NextRetry(attempt int, err error, prev time.Duration) RetryDecision {
	g, sh := h.enter(rand.Uint32())
	d, stop := g.nextRetry(context.Background(), attempt, err, prev)
	g.exit(sh)
	switch {
	case stop == nil:
		return RetryDecision{Retry: true, Delay: d}
	case IsPermanent(err):
		return RetryDecision{Stop: StopPermanent}
	case stop == err:
		return RetryDecision{Stop: StopAttempts}
	}
	if oe, ok := stop.(*OpenError); ok && oe != nil {
		return RetryDecision{Stop: StopOpen}
	}
	if _, ok := stop.(*ExhaustedError); ok {
		return RetryDecision{Stop: StopBudget}
	}
	return RetryDecision{Stop: StopAttempts}
}

// Run runs fn through the guard: Admit, then for each attempt the breaker
// permit, BeforeAttempt, the attempt (under the Deadline, if any), the
// outcome recorded, and the retry decision with budget and backoff. It
// returns nil on the first success, or the error that ended the work:
//
//   - the last attempt's error (permanent, or the attempts are used up);
//   - an [*OpenError] when the breaker refused an attempt, or opened and
//     will still be open after the backoff (no token is spent then);
//   - an [*ExhaustedError] when the retry budget refused a retry;
//   - an [*AdmitError] when Admit refused, or BeforeAttempt's error;
//   - the last attempt's error joined with ctx's error when ctx ended during
//     an attempt or a backoff (a backoff is interrupted at once), or with
//     [context.DeadlineExceeded] when the next backoff would outlive the
//     deadline.
//
// A panic in fn is recorded as a failure and re-raised.
func (h *Guard) Run(ctx context.Context, fn func(context.Context) error) error {
	r := rand.Uint32()
	g, sh := h.enter(r)
	err := g.run(ctx, fn, r)
	g.exit(sh) // skipped if fn panics: the state is then never reused
	return err
}

// A Recycler keeps the states of retired guards and builds later guards on
// them, so that a keyed collection whose keys come and go (a scope under
// tenant churn) does not allocate a guard's 1.2 KiB of state per new key:
// a recycled guard costs one 32-byte allocation. A Recycler is safe for
// concurrent use; its guards may be of different Compiled policies.
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
