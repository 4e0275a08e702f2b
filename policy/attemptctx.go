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
// the same parent within shareSlack of each other (see guard.attemptCtx), so
// that a handler that never asks for Done costs no allocation: the ctx is
// never reset or reused for another parent or deadline, its state only moves
// forward (live, then ended), so a handler that keeps it sees a context that
// behaves as one, never one that comes back to life. Its users count tells
// when the last attempt using it has ended: a built ctx is cancelled then,
// and an unbuilt one is closed to new attempts as soon as anyone looks at
// it, so a ctx an attempt kept is ended by the time it can tell.
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
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

// shareSlack is the span, as a fraction of AttemptTimeout (a right shift),
// within which attempts of one guard starting with the same parent share an
// attemptCtx: a deadline is rounded up to a multiple of AttemptTimeout>>7,
// so an attempt may end that much late (under 1%), never early.
const shareSlack = 7

// attemptCtx returns the ctx of the attempt p has just been permitted,
// counted in: the caller must call leave when the attempt ends. It is the
// guard's last one if that has the same parent and the same rounded
// deadline and is still open, and a new one (which becomes the guard's
// last) otherwise.
//
// Timers are real time (or a testing/synctest bubble's), whatever
// Policy.Clock says, so with an injected Clock the start is time.Now. With
// the system clock it is the guard's epoch plus the monotonic time since:
// the exact start p read, if it did, or one monotonic clock read, about
// half of time.Now (which reads the wall clock too).
func (g *guard) attemptCtx(parent context.Context, p *Permit) *attemptCtx {
	var dl time.Time
	if g.r.systemClock {
		start := time.Duration(p.start)
		if p.clock != clockExact {
			start = time.Since(g.epoch)
		}
		dl = g.epoch.Add(roundUp(start+g.r.attemptTimeout, g.r.attemptTimeout>>shareSlack))
	} else {
		// An injected clock gives no real-time origin to round from: the
		// deadline is exact, shared only by attempts that start together.
		dl = time.Now().Add(g.r.attemptTimeout)
	}
	if c := g.actx.Load(); c != nil && c.deadline.Equal(dl) && sameCtx(c.parent, parent) && c.join() {
		return c
	}
	c := &attemptCtx{parent: parent, deadline: dl}
	c.users.Store(2)
	g.actx.Store(c)
	return c
}

// roundUp rounds d up to a multiple of q (q <= 0: d itself).
func roundUp(d, q time.Duration) time.Duration {
	if q <= 0 {
		return d
	}
	if r := d % q; r != 0 {
		d += q - r
	}
	return d
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
	c := &attemptCtx{parent: ctx, deadline: time.Now().Add(h.r.attemptTimeout)}
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
