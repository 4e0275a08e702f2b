package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// attemptCtx is the ctx of attempts under Policy.AttemptTimeout: it ends at
// its deadline, when its parent ends (the Deadline's ctx or the caller's),
// or when the last attempt using it ends.
//
// context.WithTimeout would do, but it arms a timer for every attempt
// (several allocations, many times the rest of a successful Run). An
// attemptCtx builds that context only when someone first asks for Done, or
// for Err once the answer is not nil; until then Deadline answers from the
// deadline, Value from the parent and Err from the parent and the time. An
// attempt that never asks cannot be told to stop anyway. Once built, every
// method answers from the built context, so its children, Cause and
// AfterFunc are the standard library's.
//
// Run shares one attemptCtx between the attempts of a guard that start with
// the same parent within AttemptTimeout>>shareSlack of the first (see
// guard.attemptCtx), so that a handler that never asks for Done costs no
// allocation. The ctx is never reset or reused for another parent or
// deadline: its state only moves forward (live, then ended), so a handler
// that keeps it sees a context that behaves as one, never one that comes
// back to life. Its users count tells when the last attempt using it has
// ended: a built ctx is cancelled then, and an unbuilt one is closed to new
// attempts as soon as anyone looks at it with no attempt inside, so a ctx an
// attempt kept is ended by the time it can tell.
type attemptCtx struct {
	parent   context.Context
	deadline time.Time // made + AttemptTimeout + the sharing span
	made     int64     // when made, in ns since the guard's epoch (system clock)
	// madeCoarse is the coarse clock when made, or -1 if it could not be
	// trusted then (idle, or not this goroutine's time: a testing/synctest
	// bubble has its own).
	madeCoarse int64
	madeReal   time.Time // when made, with an injected Clock
	// users is the number of attempts using the ctx, times two, plus one
	// once it is closed: then it ends (if built) and takes no new attempt.
	users atomic.Int64
	inner atomic.Pointer[builtCtx]
	mu    sync.Mutex // held to build inner
}

type builtCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// shareSlack sets the sharing span, AttemptTimeout>>shareSlack (under 1%):
// a shared ctx's deadline is its first attempt's plus that span, so that no
// later attempt sharing it ends early, and none more than that late.
const shareSlack = 7

// coarseStale is how stale a fresh coarse clock is assumed to be at most.
// A start read from it may be that much early, so an attempt that reads it
// shares a ctx only within the span less coarseStale (none with an
// AttemptTimeout under 128*coarseStale: those read the exact clock). Only a
// process starved of CPU for longer than the span could make an attempt
// end early, by no more than the starvation.
const coarseStale = 4 * coarseTick

// attemptCtx returns the ctx of the attempt p has just been permitted,
// counted in: the caller must call leave when the attempt ends. It is the
// guard's last one if that has the same parent, is still open, and was made
// within the sharing span before this attempt; otherwise a new one (which
// becomes the guard's last).
//
// The start is the one p read, or the coarse clock (one atomic load): one
// read of the exact clock costs more than the rest of a successful attempt.
// Timers are real time (or a testing/synctest bubble's), whatever
// Policy.Clock says: with an injected Clock the start is time.Now.
func (g *guard) attemptCtx(parent context.Context, p *Permit) *attemptCtx {
	if c := g.actx.Load(); c != nil && sameCtx(c.parent, parent) && g.recent(c, p) && c.join() {
		return c
	}
	return g.newAttemptCtx(parent)
}

// recent reports whether the attempt p has just been permitted starts
// within the sharing span of c's making.
func (g *guard) recent(c *attemptCtx, p *Permit) bool {
	span := int64(g.r.attemptTimeout >> shareSlack)
	if !g.r.systemClock {
		return time.Since(c.madeReal) <= time.Duration(span)
	}
	if c.madeCoarse >= 0 && span > int64(coarseStale) {
		if p.clock == clockCoarse {
			return p.start-c.madeCoarse <= span-int64(coarseStale)
		}
		if p.clock != clockExact {
			if v, fresh := coarseNow(); fresh {
				return v-c.madeCoarse <= span-int64(coarseStale)
			}
		}
	}
	start := p.start
	if p.clock != clockExact {
		start = int64(time.Since(g.epoch))
	}
	return start-c.made <= span
}

// newAttemptCtx makes an attempt ctx starting now and makes it the guard's
// last, counted in for the caller.
func (g *guard) newAttemptCtx(parent context.Context) *attemptCtx {
	timeout := g.r.attemptTimeout + g.r.attemptTimeout>>shareSlack
	c := &attemptCtx{parent: parent, madeCoarse: -1}
	if g.r.systemClock {
		v, fresh := coarseNow()
		c.made = int64(time.Since(g.epoch))
		// The coarse clock is trusted for this ctx if it reads the same
		// time as the exact one (give or take its staleness): not in a
		// bubble, whose exact clock is its own.
		if lag := int64(time.Since(coarseBase)) - v; fresh && lag >= 0 && lag <= int64(coarseStale) {
			c.madeCoarse = v
		}
		c.deadline = g.epoch.Add(time.Duration(c.made) + timeout)
	} else {
		c.madeReal = time.Now()
		c.deadline = c.madeReal.Add(timeout)
	}
	c.users.Store(2)
	g.actx.Store(c)
	return c
}

// sameCtx reports whether a and b are the same context: the same dynamic
// type and the same pointer. Comparing them with == would panic on a
// context of a type that is not comparable.
func sameCtx(a, b context.Context) bool {
	type iface struct{ tab, data unsafe.Pointer }
	return *(*iface)(unsafe.Pointer(&a)) == *(*iface)(unsafe.Pointer(&b))
}

// AttemptContext returns the ctx of one attempt: a child of ctx that ends
// after AttemptTimeout (and with ctx), and its cancel function, which the
// caller must call when the attempt ends. With no AttemptTimeout it returns
// ctx itself and a no-op. For engines that run attempts themselves; unlike
// Run's, the ctx is the attempt's own and its deadline exact. It costs two
// allocations, and no timer until the attempt asks for Done.
func (h *Guard) AttemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if h.r.attemptTimeout <= 0 {
		return ctx, func() {}
	}
	c := &attemptCtx{parent: ctx, deadline: time.Now().Add(h.r.attemptTimeout), madeCoarse: -1}
	c.users.Store(2)
	return c, c.close
}

func (c *attemptCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *attemptCtx) Done() <-chan struct{} { return c.built().Done() }

// Err answers without building the context while it is live: nil, unless
// the parent ended, the deadline passed or no attempt uses it any more.
// Any other answer builds it, so that later answers (and Cause) agree.
func (c *attemptCtx) Err() error {
	if b := c.inner.Load(); b != nil {
		return b.ctx.Err()
	}
	if s := c.users.Load(); s >= 2 && s&1 == 0 && c.parent.Err() == nil && time.Now().Before(c.deadline) {
		return nil
	}
	return c.built().Err()
}

func (c *attemptCtx) Value(key any) any {
	if b := c.inner.Load(); b != nil {
		return b.ctx.Value(key)
	}
	// context.Cause and the standard contexts ask for their nearest
	// cancelCtx with a key of type *int: build, so that they find ours.
	if _, ok := key.(*int); ok {
		return c.built().Value(key)
	}
	return c.parent.Value(key)
}

// built returns the standard context behind c, building it on first use.
func (c *attemptCtx) built() context.Context {
	if b := c.inner.Load(); b != nil {
		return b.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.inner.Load(); b != nil {
		return b.ctx
	}
	ctx, cancel := context.WithDeadline(c.parent, c.deadline)
	c.inner.Store(&builtCtx{ctx: ctx, cancel: cancel})
	// leave and close write users before they load inner, and this loads
	// users after storing inner: one of the two sees the other and
	// cancels. A ctx no attempt uses is closed here, so that none joins it.
	if s := c.users.Load(); s&1 != 0 || s == 0 && c.users.CompareAndSwap(0, 1) {
		cancel()
	}
	return ctx
}

// join counts one more attempt in, unless c is closed.
func (c *attemptCtx) join() bool {
	for {
		s := c.users.Load()
		if s&1 != 0 {
			return false
		}
		if c.users.CompareAndSwap(s, s+2) {
			return true
		}
	}
}

// leave counts an attempt out. The last one out ends a built ctx (and
// closes it); an unbuilt one stays open for the guard's next attempts. It
// takes no lock: it runs after every attempt.
func (c *attemptCtx) leave() {
	if c.users.Add(-2) == 0 {
		if b := c.inner.Load(); b != nil && c.users.CompareAndSwap(0, 1) {
			b.cancel()
		}
	}
}

// close ends c whoever uses it (AttemptContext's cancel).
func (c *attemptCtx) close() {
	c.users.Or(1)
	if b := c.inner.Load(); b != nil {
		b.cancel()
	}
}

func (c *attemptCtx) String() string { return "policy.attemptCtx" }

// timedOut reports whether the attempt ran out its own AttemptTimeout (not
// an earlier deadline of its parent, the caller's or the Deadline's).
func (c *attemptCtx) timedOut() bool {
	if d, ok := c.parent.Deadline(); ok && !d.After(c.deadline) {
		return false
	}
	return !time.Now().Before(c.deadline)
}
