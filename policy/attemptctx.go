package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// attemptCtx is the ctx of one attempt under Policy.AttemptTimeout: it ends
// at start+AttemptTimeout, when its parent ends (the Deadline's ctx or the
// caller's), or when the attempt ends. context.WithTimeout would do, but it
// arms a timer for every attempt (several allocations, many times the rest
// of a successful Run); an attemptCtx is one allocation
// and builds that context only when fn first asks for Done or Err. An
// attempt that never asks cannot be told to stop anyway.
//
// Until then, Deadline answers from the start time and Value from the
// parent. Once built, every method answers from the built context, so its
// children, Cause and AfterFunc are the standard library's. (Before it is
// built, context.Cause of an attemptCtx reports its parent's cause: it ends
// unbuilt only when the attempt is over.)
type attemptCtx struct {
	parent   context.Context
	deadline time.Time // start + AttemptTimeout
	inner    atomic.Pointer[builtCtx]
	ended    atomic.Bool // the attempt is over
	mu       sync.Mutex  // held to build inner
}

type builtCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// newAttemptCtx returns the ctx of the attempt p has just been permitted.
// Timers are real time (or a testing/synctest bubble's), whatever
// Policy.Clock says, so with an injected Clock the start is time.Now. With
// the system clock it is the guard's epoch plus the monotonic time since:
// the exact start p read, if it did, or one monotonic clock read, about
// half of time.Now (which reads the wall clock too).
func (g *guard) newAttemptCtx(parent context.Context, p *Permit) *attemptCtx {
	if !g.r.systemClock {
		return &attemptCtx{parent: parent, deadline: time.Now().Add(g.r.attemptTimeout)}
	}
	start := time.Duration(p.start)
	if p.clock != clockExact {
		start = time.Since(g.epoch)
	}
	return &attemptCtx{parent: parent, deadline: g.epoch.Add(start + g.r.attemptTimeout)}
}

// AttemptContext returns the ctx of one attempt as Run makes it: a child of
// ctx that ends after AttemptTimeout (and with ctx), and its cancel
// function, which the caller must call when the attempt ends. With no
// AttemptTimeout it returns ctx itself and a no-op. For engines that run
// attempts themselves; it costs two allocations and no timer until the
// attempt asks for Done or Err.
func (h *Guard) AttemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if h.r.attemptTimeout <= 0 {
		return ctx, func() {}
	}
	c := &attemptCtx{parent: ctx, deadline: time.Now().Add(h.r.attemptTimeout)}
	return c, c.end
}

func (c *attemptCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *attemptCtx) Done() <-chan struct{} { return c.built().Done() }

func (c *attemptCtx) Err() error { return c.built().Err() }

func (c *attemptCtx) Value(key any) any {
	if b := c.inner.Load(); b != nil {
		return b.ctx.Value(key)
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
	// end stores ended before it loads inner, and this loads ended after
	// storing inner: one of the two sees the other and cancels.
	if c.ended.Load() {
		cancel()
	}
	return ctx
}

// end ends c: the attempt is over. It takes no lock: it runs after every
// attempt.
func (c *attemptCtx) end() {
	c.ended.Store(true)
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
