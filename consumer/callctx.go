package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// callCtx is the context of one handler call. context.WithTimeout costs
// about half a microsecond and four allocations here, more than the rest of
// the engine spends on a message, so each worker keeps one callCtx and the
// engine's housekeeping goroutine cancels it when its deadline passes (at
// the housekeeping tick's resolution). A callCtx whose Done channel or
// AfterFunc was never asked for cannot have been observed by anyone, and is
// reused for the worker's next call; one that was is cancelled when the
// handler returns (as net/http does with a request's context) and replaced.
type callCtx struct {
	parent context.Context // the engine's handler context
	c      *Consumer

	deadline atomic.Int64 // engine clock ns; 0: none. Meaningful while gen is odd
	// gen counts begins and ends: odd while a call runs (Stats counts the
	// workers in a call from it), and a late expiry of an earlier call must
	// not end this one.
	gen      atomic.Uint64
	expiring atomic.Bool // housekeeping is expiring a call (begin then waits for it on mu)
	expired  atomic.Bool // the attempt ran out its deadline (housekeeping ended it)
	// dirty: Done, AfterFunc or cancel was called since the last reset; a
	// clean context ends its call without taking mu.
	dirty atomic.Bool

	mu     sync.Mutex
	done   chan struct{} // made on first Done
	err    error
	afters map[*afterFunc]struct{}
	seen   bool // Done or AfterFunc was called: the ctx may be held
}

type afterFunc struct {
	once sync.Once
	f    func()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newCallCtx(c *Consumer) *callCtx { return &callCtx{parent: c.hctx, c: c} }

// Deadline reports the attempt's deadline, if it has one.
func (x *callCtx) Deadline() (time.Time, bool) {
	d := x.deadline.Load()
	if d == 0 {
		return x.parent.Deadline()
	}
	return x.c.epoch.Add(time.Duration(d)), true
}

func (x *callCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.seen = true
	x.dirty.Store(true)
	if x.done == nil {
		if x.err != nil {
			return closedChan
		}
		x.done = make(chan struct{})
	}
	return x.done
}

func (x *callCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

func (x *callCtx) Value(key any) any { return x.parent.Value(key) }

// AfterFunc makes context.AfterFunc and context.WithCancel on this context
// cheap (no goroutine watching Done).
func (x *callCtx) AfterFunc(f func()) (stop func() bool) {
	a := &afterFunc{f: f}
	x.mu.Lock()
	x.seen = true
	x.dirty.Store(true)
	if x.err != nil {
		x.mu.Unlock()
		a.once.Do(func() { go f() })
		return func() bool { return false }
	}
	if x.afters == nil {
		x.afters = make(map[*afterFunc]struct{})
	}
	x.afters[a] = struct{}{}
	x.mu.Unlock()
	return func() bool {
		stopped := false
		a.once.Do(func() { stopped = true })
		x.mu.Lock()
		delete(x.afters, a)
		x.mu.Unlock()
		return stopped
	}
}

// cancel ends the context with err (the first cause wins).
func (x *callCtx) cancel(err error) {
	x.mu.Lock()
	afters := x.cancelLocked(err)
	x.mu.Unlock()
	runAfters(afters)
}

// cancelLocked is cancel with mu held; the caller runs the returned
// AfterFunc callbacks once it released mu.
func (x *callCtx) cancelLocked(err error) map[*afterFunc]struct{} {
	if x.err != nil {
		return nil
	}
	x.err = err
	x.dirty.Store(true)
	if x.done != nil {
		close(x.done)
	}
	afters := x.afters
	x.afters = nil
	return afters
}

func runAfters(afters map[*afterFunc]struct{}) {
	for a := range afters {
		a.once.Do(func() { go a.f() })
	}
}

// begin arms the context for a call that must end by deadline (engine
// clock ns; 0: none).
func (x *callCtx) begin(deadline int64) {
	// The deadline is written before gen turns odd and stays while it is:
	// an expiry that reads gen, then the deadline, then the same gen again
	// read this call's deadline. Most calls keep the last one's (none, in a
	// policy without timeouts): a load spares a locked store.
	if x.deadline.Load() != deadline {
		x.deadline.Store(deadline)
	}
	x.gen.Add(1)
	// Sequentially consistent: either a running expiry saw the new gen and
	// gives up, or this sees expiring and waits for it below.
	if x.expiring.Load() || x.dirty.Load() {
		// An expiry of the last call that lost the race with its end.
		x.mu.Lock()
		if !x.seen {
			x.err = nil
			x.dirty.Store(false)
		}
		x.mu.Unlock()
	}
	if x.expired.Load() {
		x.expired.Store(false)
	}
	if x.c.hdone.Load() {
		x.cancel(x.parent.Err())
	}
}

// inCall reports whether a call is running on x.
func (x *callCtx) inCall() bool { return x.gen.Load()&1 == 1 }

// end finishes a call. It reports whether the context can be reused: it was
// not observed, so nobody can still be waiting on it.
func (x *callCtx) end() (reusable bool) {
	x.gen.Add(1) // even: no call; an expiry of this one now gives up
	if !x.dirty.Load() {
		return true // nobody asked for Done, nothing cancelled it
	}
	x.mu.Lock()
	seen := x.seen
	if !seen {
		x.err = nil
		x.dirty.Store(false)
	}
	x.mu.Unlock()
	if seen {
		x.cancel(context.Canceled)
	}
	return !seen
}

// expireIfDue cancels the call if its deadline passed (engine clock now).
func (x *callCtx) expireIfDue(now int64) {
	g := x.gen.Load()
	if g&1 == 0 {
		return // no call
	}
	if d := x.deadline.Load(); d == 0 || now < d || x.gen.Load() != g {
		return
	}
	x.expiring.Store(true)
	defer x.expiring.Store(false)
	x.mu.Lock()
	if x.gen.Load() != g {
		x.mu.Unlock()
		return // that call ended meanwhile
	}
	x.expired.Store(true)
	afters := x.cancelLocked(context.DeadlineExceeded)
	x.mu.Unlock()
	runAfters(afters)
}

var _ context.Context = (*callCtx)(nil)
