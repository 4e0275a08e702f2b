package consumer

import (
	"errors"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ringfence/ringfence/policy"
)

// ErrNoTenant: the message carries no tenant key. Such a message is
// dead-lettered under the reserved "no tenant" bucket, never dropped.
var ErrNoTenant = errors.New("consumer: message has no tenant key")

// TenantFunc extracts the tenant key from a message. The key may be any
// bytes. Return an error wrapping ErrNoTenant when there is none, or another
// error when the key is unusable; either way the message goes to the
// "no tenant" dead-letter bucket with the error as its reason. An empty key
// counts as none.
//
// The returned string may share memory with the message (the extractors
// below do, so that a known tenant costs no allocation): the engine copies
// it before it keeps it. A TenantFunc is called with no engine lock held.
type TenantFunc func(m *Message) (string, error)

// FromHeader takes the tenant from the first header named name.
func FromHeader(name string) TenantFunc {
	return func(m *Message) (string, error) {
		v, ok := m.Header(name)
		if !ok || len(v) == 0 {
			return "", ErrNoTenant
		}
		return bytesView(v), nil
	}
}

// FromKey takes the tenant from the message key.
func FromKey() TenantFunc {
	return func(m *Message) (string, error) {
		if len(m.Key) == 0 {
			return "", ErrNoTenant
		}
		return bytesView(m.Key), nil
	}
}

// bytesView is a string sharing b's memory. Valid only while b is not
// changed; the engine clones it before keeping it (see tenantLocked).
func bytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// tenant is the engine's state of one tenant across its partitions. The
// no-tenant bucket is a tenant value too, kept apart by its none flag (it
// is never in the tenants map, whatever key a message carries).
type tenant struct {
	// The first line holds what a message of a tenant whose lane must be
	// found or made reads (the tenant table's key comparison, lanes,
	// onIdle) and what taking its lane reads (guardP, inflight): with many
	// tenants each of them is a cache miss, and fields spread over more
	// lines are more misses (TestTenantLayout checks the layout,
	// BenchmarkEngine at 100,000 tenants guards the gain).
	key string // owned copy: in keyBuf if it fits (see ownKey)
	// lanes counts the tenant's lanes; onIdle marks it listed in
	// Consumer.idle (no lane, nothing in flight). Guarded by
	// Consumer.tmu.
	lanes  int32
	onIdle bool
	// gone: forgotten (out of the tenants map). A job of a lane dropped
	// while it ran may end after that (zombieDone): such a tenant is never
	// listed again. Guarded by Consumer.tmu.
	gone bool
	none bool // the reserved bucket of messages without a usable key
	// keyBuf holds a short key, so that a new tenant is one allocation,
	// not two (BenchmarkEngine at many tenants guards this). Never written
	// once key points into it: the key is handed out in events and stats.
	keyBuf [tenantKeyBuf]byte
	// guardP is set once, outside every engine lock (scope.Pin may run
	// the scope's Shape hook), by the first goroutine that needs it (once).
	guardP   atomic.Pointer[policy.Guard]
	inflight atomic.Int32 // messages of this tenant being handled (bulkhead)
	// idleSeq counts the times it was listed idle: the idle list's entry
	// that carries the current count is its live one (see idleList).
	// Guarded by Consumer.tmu.
	idleSeq uint32

	// The second line holds what the rest of a lane's turn reads or
	// writes: its guard's handle, its control, its counts of handled
	// messages and blocked lanes, and its breaker's open time.
	//
	// gd is the guard's handle the engine calls through (guardP points to
	// it, unless Shape panicked): a second handle on the scope's guard of
	// the key (policy.Guard.ShareTo), so that a call reads this line, which
	// the turn reads anyway, rather than the scope's entry, another miss
	// before the guard's state with many tenants (BenchmarkEngine at
	// 100,000 tenants guards the gain).
	gd policy.Guard
	// ctl is its operators' control (nil: none), an entry of the table
	// SetControls publishes: read once per lane scheduling. Stored under
	// Consumer.tmu.
	ctl      atomic.Pointer[Control]
	handled  atomic.Uint64
	nblocked atomic.Int32 // len(blocked), readable without bmu
	// openSince is the engine clock when the engine first found its
	// breaker not closed since it last closed (a park), or zero (see
	// noteOpen).
	openSince atomic.Int64
	// dwell counts its settles by time since produce: a settle adds to
	// its sum and a bucket (the line prefetch loads).
	dwell dwellHist
	// scoped is the scope's handle of the guard that gd shares, for the
	// invariants' check that the scope still holds it.
	scoped *policy.Guard

	// zombies counts in-flight slots held by jobs of lanes dropped while
	// they ran (a revoked partition): released when those jobs finish.
	zombies atomic.Int32
	once    sync.Once

	bmu     sync.Mutex // guards blocked
	blocked []*lane    // lanes waiting for the bulkhead, FIFO

	failed, dead, retried      atomic.Uint64
	spilled, refed, unwritable atomic.Uint64
	spillDone                  atomic.Uint64 // spilled messages settled after re-feed (or dropped as copies)
	parked                     atomic.Int64  // messages parked now
	spillLanes                 atomic.Int32  // lanes in spill mode now
	// dlqDownAt is the engine clock (at least 1) when the tenant's DLQ
	// began to refuse its dead letters: a write failed, not for good (see
	// dlq.ErrUnwritable), and none has succeeded since. 0 while the DLQ
	// takes them. dlqFails counts its failed dead-letter writes.
	dlqDownAt atomic.Int64
	dlqFails  atomic.Uint64
	// Pads the tenant to a whole number of lines: its size class is then
	// a multiple of 64 bytes and every tenant starts a line, so the first
	// line above is one line (TestTenantLayout).
	_ [tenantPad]byte
}

// tenantPad pads a tenant to 448 bytes (see TestTenantLayout).
const tenantPad = 32

// guard returns the tenant's guard, pinning it in the scope on first use.
// Called with no engine lock held.
func (c *Consumer) guard(t *tenant) *policy.Guard {
	if g := t.guardP.Load(); g != nil {
		return g
	}
	t.once.Do(func() {
		var g *policy.Guard
		func() {
			defer func() {
				if r := recover(); r != nil {
					// A Shape hook that panics: the tenant runs on the
					// template policy instead, and says so.
					c.log.Error("consumer: the scope's Shape panicked; tenant uses the default policy", "tenant", t.key, "panic", r)
					g = c.fallback
				}
			}()
			g = c.scope.Pin(t.key)
			t.scoped = g
			g.ShareTo(&t.gd)
			g = &t.gd
		}()
		t.guardP.Store(g)
		// Before any permit: the operators' override, then the fleet's
		// seed (a guard forced either way ignores it).
		c.forceGuard(t, g)
		c.seedGuard(t, g)
	})
	return t.guardP.Load()
}

// peekGuard returns the tenant's guard if it was built, for reporting.
func (t *tenant) peekGuard() *policy.Guard { return t.guardP.Load() }

// prefetch loads the lines a turn of t's lane will write that take does
// not read, with many tenants cold: its guard's (policy.Guard.Prefetch)
// and its dwell counts'. Called by take before its first atomic write (the
// bulkhead's compare-and-swap, which waits for every load before it), so
// that those misses overlap with each other and with the tenant's own
// rather than come one after another in the turn, each behind an atomic
// add (BenchmarkEngine at 100,000 tenants guards the gain). A tenant whose
// guard is not built yet has a zero gd: it loads the dwell line only.
func (t *tenant) prefetch() {
	t.dwell.sum.Load()
	t.gd.Prefetch()
}

// tryAcquire takes a bulkhead slot if the tenant has fewer than limit
// messages in flight.
func (t *tenant) tryAcquire(limit int32) bool {
	for {
		n := t.inflight.Load()
		if n >= limit {
			return false
		}
		if t.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// block queues l until the tenant has a free slot. Called with l's shard
// lock held (lock order: shard.mu, then tenant.bmu).
func (t *tenant) block(l *lane) {
	t.bmu.Lock()
	t.blocked = append(t.blocked, l)
	t.nblocked.Add(1)
	t.bmu.Unlock()
}

// unblockOne pops the oldest blocked lane, if any. The lane may have been
// dropped or unblocked meanwhile: its state is guarded by its shard's mu,
// which is not held here, so the caller checks it under that lock (see
// unblock). Called with no shard lock held.
func (t *tenant) unblockOne() *lane {
	t.bmu.Lock()
	defer t.bmu.Unlock()
	if len(t.blocked) == 0 {
		return nil
	}
	l := t.blocked[0]
	t.blocked[0] = nil
	t.blocked = t.blocked[1:]
	if len(t.blocked) == 0 {
		t.blocked = nil
	}
	t.nblocked.Add(-1)
	return l
}

// tenantLocked returns the tenant of key, whose hash is h (keyHash),
// making it on first sight (a forgotten tenant's key gets a fresh one);
// the lane count it returns the tenant with is incremented, so that it is
// not forgotten meanwhile. key may share memory with a message: it is
// cloned when kept. Called with tmu held.
func (c *Consumer) tenantLocked(key string, h uint64) *tenant {
	t := c.tenants.get(key, h)
	switch {
	case t == nil:
		t = new(tenant)
		t.ownKey(key)
		if ct := c.controlOf(t.key); ct != nil {
			t.ctl.Store(ct)
		}
		c.tenants.put(t, h)
		c.ntenants.Add(1)
	case t.onIdle:
		c.idle.remove(t)
	}
	t.lanes++
	return t
}

// holdNoTenant returns the no-tenant bucket, its lane count incremented
// for a new lane of it.
func (c *Consumer) holdNoTenant() *tenant {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	c.noTenant.lanes++
	return c.noTenant
}

// tenantKeyBuf is the longest key a tenant keeps inline: typical ids (a
// UUID's 16 bytes, a decimal account number) fit.
const tenantKeyBuf = 24

// ownKey sets t.key to a copy of key that t owns. Called once, before t is
// shared.
func (t *tenant) ownKey(key string) {
	if len(key) > len(t.keyBuf) {
		t.key = string([]byte(key))
		return
	}
	n := copy(t.keyBuf[:], key)
	t.key = unsafe.String(&t.keyBuf[0], n)
}

// releaseTenant drops a lane's hold on t; t may be idle then, and the
// tenant idle longest forgotten (see idleIfDone). It returns the forgotten
// tenant, whose scope pin the caller releases with no lock held (unpin).
func (c *Consumer) releaseTenant(t *tenant) (forgotten *tenant) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	return c.releaseLocked(t)
}

// releaseLocked is releaseTenant with tmu held.
func (c *Consumer) releaseLocked(t *tenant) (forgotten *tenant) {
	t.lanes--
	return c.idleIfDone(t)
}

// unpin releases the scope pin of a forgotten tenant. Called with no lock.
func (c *Consumer) unpin(t *tenant) {
	if t == nil || t.none {
		return
	}
	// Make sure no later guard() pins again: run the once if it never ran.
	pinned := true
	t.once.Do(func() { pinned = false })
	if pinned && t.guardP.Load() != c.fallback {
		c.scope.Unpin(t.key)
	}
}
