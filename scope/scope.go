package scope

// This file is one concern, the keyed table (lookups, inserts, pins and
// sweeps share its invariants), kept together as otter keeps its cache: hence
// its length.

import (
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/ringfence/ringfence/policy"
)

// DefaultMaxKeys is the cap used when Options.MaxKeys is zero.
const DefaultMaxKeys = 1024

// Options configures a [Scope]. Zero fields mean the defaults written on each
// field. The hooks must be cheap and safe for concurrent use.
type Options[K comparable] struct {
	// MaxKeys is the number of keys the scope holds after a sweep (not
	// counting guards kept because they are protected, see HardCeiling).
	// Zero means [DefaultMaxKeys] (1024). Negative is invalid: New panics.
	// There is no unbounded mode.
	MaxKeys int

	// HardCeiling bounds protection: a sweep keeps guards whose breaker is
	// open or half-open, and pinned guards, only while the scope holds fewer
	// than HardCeiling keys; beyond it they are evicted like any other.
	// Zero means 4*MaxKeys. Negative, or below MaxKeys, is invalid: New
	// panics. Whatever the key stream, Len never exceeds HardCeiling+MaxKeys.
	HardCeiling int

	// Shape returns the policy of a key. It runs once per key life, when the
	// key is first seen or first seen again after its eviction, and its
	// result is cached in the guard: concurrent first lookups of a key share
	// one Shape call and one guard (the others wait for that build). Shape
	// may panic; the panic reaches the lookup that called it and the key
	// stays absent. Shape must not look up its own key (that lookup would
	// wait for this build). Nil means every key uses the template.
	// If the result is invalid, the key gets the template instead and the
	// error is passed to OnShapeError.
	Shape func(K) policy.Policy

	// OnShapeError receives the key and the [policy.ErrInvalidPolicy] error
	// of a Shape result that was replaced by the template. Nil means the
	// error is logged with log/slog at warning level.
	OnShapeError func(key K, err error)

	// OnEvent, if set, receives every guard event with its key. It is called
	// after the policy's own OnEvent, synchronously, by the goroutine that
	// caused the event.
	OnEvent func(key K, e policy.Event)

	// OnEvict, if set, is called with each evicted key just after the sweep
	// step that evicted it, by the lookup that did that step (outside any
	// lock of the scope: it may call the scope).
	OnEvict func(key K)
}

// Stats is a snapshot of a scope's counters.
type Stats struct {
	// Size is Len at the time of the snapshot.
	Size int
	// Hits counts lookups (For, Pin) that found a guard; Misses those that
	// built one.
	Hits, Misses uint64
	// Evictions counts guards dropped by sweeps.
	Evictions uint64
	// Pinned is the number of keys with at least one pin.
	Pinned int
	// ShapeErrors counts Shape results replaced by the template.
	ShapeErrors uint64
	// Sweeps counts completed sweeps.
	Sweeps uint64
}

// Scope holds one [policy.Guard] per key, bounded by Options.MaxKeys.
//
// Keys live in an open-addressing hash table of atomic pointers, at most
// half full: sized at New for MaxKeys and the keys added between sweeps, and
// doubled (up to the size for HardCeiling+MaxKeys) only if protected keys
// pile up. A lookup of a present key probes it without a lock and allocates
// nothing, so no lookup of a present key ever waits for a sweep. A new key
// is inserted under a mutex (its guard is built outside it). Sweeps are
// incremental: each lookup that inserts a key while a sweep runs scans a
// fixed number of table slots if no other goroutine is doing so, and evicts
// one of the cold keys found so far (more only while many wait) under the
// mutex (a few pointer stores each). A Scope
// owns no goroutine (it needs no Close); apart from a table doubling, what
// it allocates is the entry of each new key (64 bytes with a string key and
// its Guard handle;
// the guard's state is reused from an evicted key when one is free, and
// allocated otherwise). A sweep only
// progresses with such lookups: while every lookup hits, a started sweep
// stays pending (memory stays bounded).
//
// Eviction is approximate, after CLOCK: each lookup stamps its entry with the
// current sweep epoch, and a sweep keeps the keys stamped since the previous
// sweep started (at most MaxKeys of them), the protected keys (pinned, or
// breaker open or half-open) while under HardCeiling, and evicts the rest,
// except a key found cold that is looked up, or whose breaker opens, before
// its eviction.
// Between sweeps the scope may exceed MaxKeys, by about MaxKeys/4. A For
// that would take it to HardCeiling+MaxKeys finishes the sweep itself first
// (the only lookup that waits for a sweep; it cannot happen while lookups
// keep sweeping, and only a lookup of a new key could).
//
// A lookup racing with the eviction of its key may return the evicted guard;
// the next lookup gets a fresh one. An evicted guard still works, on a fresh
// state of its own from its next call (its old state serves a new key), so
// it never affects any key's guard. Callers should look the guard up for
// each unit of work rather than keep it.
//
// A Scope is safe for concurrent use.
type Scope[K comparable] struct {
	// Read by every lookup, written rarely (epoch once per sweep, tab when
	// the table grows): kept off the lines the slow path writes.
	tab   atomic.Pointer[table[K]]
	epoch atomic.Uint32 // current sweep epoch, stamped by lookups
	seed  maphash.Seed
	hits  *counter
	_     [64]byte

	compiled  *policy.Compiled // the template
	recycler  *policy.Recycler // states of evicted guards, for new keys
	opts      Options[K]
	maxKeys   int
	ceiling   int
	bound     int // HardCeiling + MaxKeys: inserts beyond it sweep inline
	maxSlots  int // table size for the bound
	evictions atomic.Uint64
	pinned    atomic.Int64
	shapeErrs atomic.Uint64
	sweeping  atomic.Bool // a sweep is in progress (written under sweepMu)
	sweeps    atomic.Uint64
	size      atomic.Int64 // written under mu

	// sweepMu serialises sweep work. Hits never take it; inserts only try
	// it, except an insert at the hard bound.
	sweepMu sync.Mutex
	sw      sweep[K] // (sweepMu)

	mu      sync.Mutex // held to change the table
	trigger int        // a sweep is due when size exceeds it (mu)
	misses  uint64     // (mu)

	// A lookup of a key whose guard another goroutine is building waits on
	// built (with buildMu) for the end of that build; waiters counts them so
	// that a build wakes them only if there are any.
	buildMu sync.Mutex
	built   sync.Cond
	waiters atomic.Int32
}

// table is an open-addressing hash table with linear probing. Slots are
// written only under Scope.mu; deletion shifts the rest of the cluster back
// (no tombstones), so a lock-free probe racing with it may miss a present
// key, and a miss is confirmed under the mutex before anything is built.
type table[K comparable] struct {
	slots []atomic.Pointer[entry[K]]
	mask  uint64
}

func newTable[K comparable](n int) *table[K] {
	return &table[K]{slots: make([]atomic.Pointer[entry[K]], n), mask: uint64(n - 1)}
}

// An entry's state word holds its pin count (the low bits), whether its
// guard is built, and whether it is dead: evicted by a sweep, or removed
// because its build panicked. A live entry's state is >= 0; lookups treat
// dead entries as absent.
const (
	deadBit  int32 = -1 << 31
	builtBit int32 = 1 << 30
	pinMask        = builtBit - 1
)

// entry is one key: 64 bytes for a string key, the one allocation of a key
// life (its guard's state is recycled).
type entry[K comparable] struct {
	hash  uint64
	key   K
	seen  atomic.Uint32 // epoch of the last lookup
	state atomic.Int32  // pin count | builtBit | deadBit
	g     policy.Guard
}

// guard returns the entry's guard, or nil while it is being built (or if its
// build panicked).
func (e *entry[K]) guard() *policy.Guard {
	if e.state.Load()&builtBit != 0 {
		return &e.g
	}
	return nil
}

// New returns a Scope whose guards are built from template, or from
// Options.Shape for each key. It panics if template is invalid (the panic
// value is the [policy.ErrInvalidPolicy] error) or if MaxKeys or
// HardCeiling is negative, or HardCeiling is below MaxKeys.
func New[K comparable](template policy.Policy, opts Options[K]) *Scope[K] {
	if opts.MaxKeys < 0 {
		panic(fmt.Sprintf("scope: Options.MaxKeys must not be negative, got %d (0 means %d)", opts.MaxKeys, DefaultMaxKeys))
	}
	maxKeys := opts.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeys
	}
	ceiling := opts.HardCeiling
	switch {
	case ceiling < 0:
		panic(fmt.Sprintf("scope: Options.HardCeiling must not be negative, got %d (0 means 4*MaxKeys)", ceiling))
	case ceiling == 0:
		ceiling = 4 * maxKeys
	case ceiling < maxKeys:
		panic(fmt.Sprintf("scope: Options.HardCeiling %d is below MaxKeys %d", ceiling, maxKeys))
	}
	compiled, err := policy.Compile(template)
	if err != nil {
		panic(fmt.Errorf("scope: invalid template: %w", err))
	}
	s := &Scope[K]{
		compiled: compiled,
		recycler: policy.NewRecycler(maxKeys),
		opts:     opts,
		maxKeys:  maxKeys,
		ceiling:  ceiling,
		bound:    ceiling + maxKeys,
		seed:     maphash.MakeSeed(),
		hits:     new(counter),
		trigger:  maxKeys,
	}
	// The table starts sized for the usual population (MaxKeys and the
	// keys added between sweeps) at most half full, and doubles, up to the
	// size for the hard bound, only if protected keys pile up.
	s.maxSlots = tableSize(s.bound)
	s.tab.Store(newTable[K](min(tableSize(maxKeys+maxKeys/4+1), s.maxSlots)))
	s.epoch.Store(1)
	s.built.L = &s.buildMu
	return s
}

// tableSize is the power of two that holds n keys at most half full.
func tableSize(n int) int {
	return 1 << bits.Len(uint(2*n-1))
}

// For returns the guard of key, building it on first sight (or first sight
// after its eviction). A lookup of a present key takes no lock and allocates
// nothing.
func (s *Scope[K]) For(key K) *policy.Guard {
	h := maphash.Comparable(s.seed, key)
	if e := s.find(key, h); e != nil {
		if g := e.guard(); g != nil {
			s.stamp(e)
			s.hits.add()
			return g
		}
	}
	g, _ := s.slow(key, h)
	return g
}

// stamp marks e as seen in the current epoch: a store only when the stamp
// changes, so hits on a hot key do not write its line.
func (s *Scope[K]) stamp(e *entry[K]) {
	if ep := s.epoch.Load(); e.seen.Load() != ep {
		e.seen.Store(ep)
	}
}

// find probes the table without a lock for the live entry of key. It may
// miss a present key that a concurrent eviction is shifting; callers confirm
// a miss under mu.
func (s *Scope[K]) find(key K, h uint64) *entry[K] {
	t := s.tab.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].Load()
		if e == nil {
			return nil
		}
		// A dead entry (evicted, not yet removed) is skipped: a live one
		// may follow it.
		if e.hash == h && e.key == key && e.state.Load() >= 0 {
			return e
		}
	}
}

// Pin is For, and also pins the key: a pinned guard is not evicted while the
// scope holds fewer than HardCeiling keys. Pins are counted; each Pin needs
// one [Scope.Unpin]. If a pinned key is evicted anyway (beyond the ceiling),
// its pins are dropped with it.
func (s *Scope[K]) Pin(key K) *policy.Guard {
	h := maphash.Comparable(s.seed, key)
	for {
		e := s.find(key, h)
		var g *policy.Guard
		if e != nil {
			g = e.guard()
		}
		if g != nil {
			s.stamp(e)
			s.hits.add()
		} else {
			g, e = s.slow(key, h)
		}
		if s.pin(e) {
			return g
		}
		// Evicted between the lookup and the pin: look again.
	}
}

func (s *Scope[K]) pin(e *entry[K]) bool {
	for {
		n := e.state.Load()
		if n < 0 {
			return false
		}
		if e.state.CompareAndSwap(n, n+1) {
			if n&pinMask == 0 {
				s.pinned.Add(1)
			}
			return true
		}
	}
}

// Unpin releases one pin of key. It does nothing if the key has no pin (for
// example because it was evicted beyond the ceiling).
func (s *Scope[K]) Unpin(key K) {
	e := s.lookup(key)
	if e == nil {
		return
	}
	for {
		n := e.state.Load()
		if n < 0 || n&pinMask == 0 {
			return
		}
		if e.state.CompareAndSwap(n, n-1) {
			if n&pinMask == 1 {
				s.pinned.Add(-1)
			}
			return
		}
	}
}

// Peek returns the guard of key if the scope holds one, without building
// it, counting a hit or marking the key as seen (so it does not keep the key
// from eviction). For reporting; use For to run work.
func (s *Scope[K]) Peek(key K) (*policy.Guard, bool) {
	if e := s.lookup(key); e != nil {
		if g := e.guard(); g != nil {
			return g, true
		}
	}
	return nil, false
}

// lookup finds the live entry of key without creating one or counting.
func (s *Scope[K]) lookup(key K) *entry[K] {
	h := maphash.Comparable(s.seed, key)
	if e := s.find(key, h); e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.find(key, h)
}

// slow is the lookup path for keys the lock-free probe did not find: it
// confirms the miss under mu and inserts a new entry. It returns the guard
// and its entry.
func (s *Scope[K]) slow(key K, h uint64) (*policy.Guard, *entry[K]) {
	for {
		s.mu.Lock()
		if e := s.find(key, h); e != nil {
			// Present after all: the probe raced with an eviction shifting
			// the table, or with the insert of this key.
			s.mu.Unlock()
			s.stamp(e)
			s.hits.add()
			g := e.guard()
			if g == nil {
				// Another goroutine is building it: wait for that build,
				// not for any sweep.
				s.waitBuild(e)
				if g = e.guard(); g == nil {
					continue
				}
			}
			return g, e
		}
		if int(s.size.Load()) >= s.bound {
			s.mu.Unlock()
			s.help(true, nil)
			continue
		}
		e := &entry[K]{hash: h, key: key}
		e.seen.Store(s.epoch.Load())
		s.insertLocked(e)
		s.misses++
		s.size.Add(1)
		due := int(s.size.Load()) > s.trigger
		s.mu.Unlock()

		g := s.build(e)
		if due || s.sweeping.Load() {
			s.help(false, e)
		}
		return g, e
	}
}

// waitBuild returns once the build of e has ended, with its guard built or
// the entry dead.
func (s *Scope[K]) waitBuild(e *entry[K]) {
	s.buildMu.Lock()
	s.waiters.Add(1)
	for st := e.state.Load(); st >= 0 && st&builtBit == 0; st = e.state.Load() {
		s.built.Wait()
	}
	s.waiters.Add(-1)
	s.buildMu.Unlock()
}

// endBuild wakes the lookups waiting for a build, once the build has set the
// entry's state. A waiter counts itself in before it reads the state, and
// the build reads the count after it wrote the state, so either the waiter
// sees the end of the build or the build sees the waiter.
func (s *Scope[K]) endBuild() {
	if s.waiters.Load() > 0 {
		s.buildMu.Lock()
		s.built.Broadcast()
		s.buildMu.Unlock()
	}
}

// insertLocked puts e, whose key is absent, into the table, doubling the
// table first if that would make it more than half full. The caller holds mu.
func (s *Scope[K]) insertLocked(e *entry[K]) {
	t := s.tab.Load()
	if 2*(int(s.size.Load())+1) > len(t.slots) && len(t.slots) < s.maxSlots {
		t = s.growLocked(t)
	}
	place(t, e)
}

// place stores e in the first free slot of its probe sequence.
func place[K comparable](t *table[K], e *entry[K]) {
	for i := e.hash & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].Load() == nil {
			t.slots[i].Store(e)
			return
		}
	}
}

// growLocked publishes a table twice the size of t holding its entries.
// Probes still reading t find what it held; a key inserted after the swap
// is missing from t, and a probe that misses confirms under mu.
func (s *Scope[K]) growLocked(t *table[K]) *table[K] {
	n := newTable[K](2 * len(t.slots))
	for i := range t.slots {
		if e := t.slots[i].Load(); e != nil {
			place(n, e)
		}
	}
	s.tab.Store(n)
	return n
}

// removeLocked deletes e from the table and the size, shifting the rest of
// its cluster back so that no probe sequence has a hole. The caller holds
// mu.
func (s *Scope[K]) removeLocked(e *entry[K]) {
	t := s.tab.Load()
	i := e.hash & t.mask
	for t.slots[i].Load() != e {
		if t.slots[i].Load() == nil {
			return // not in the table (cannot happen)
		}
		i = (i + 1) & t.mask
	}
	t.slots[i].Store(nil)
	s.size.Add(-1)
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		f := t.slots[j].Load()
		if f == nil {
			return
		}
		// f may move into the hole at i unless its home slot lies
		// cyclically in (i, j]: then its probe never passes i.
		if home := f.hash & t.mask; (j-home)&t.mask >= (j-i)&t.mask {
			t.slots[i].Store(f)
			t.slots[j].Store(nil)
			i = j
		}
	}
}

// build runs Shape and builds the guard of a new entry, outside mu. If
// Shape panics the entry is removed and the panic goes on.
func (s *Scope[K]) build(e *entry[K]) *policy.Guard {
	ok := false
	defer func() {
		if !ok {
			s.mu.Lock()
			e.state.Store(deadBit)
			s.removeLocked(e)
			s.misses--
			s.mu.Unlock()
			s.endBuild()
		}
	}()
	c := s.compiled
	if s.opts.Shape != nil {
		var err error
		if c, err = policy.Compile(s.opts.Shape(e.key)); err != nil {
			s.shapeErrs.Add(1)
			if s.opts.OnShapeError != nil {
				s.opts.OnShapeError(e.key, err)
			} else {
				slog.Warn("scope: Shape returned an invalid policy; using the template", "key", e.key, "err", err)
			}
			c = s.compiled
		}
	}
	var hook func(policy.Event)
	if on := s.opts.OnEvent; on != nil {
		key := e.key
		hook = func(ev policy.Event) { on(key, ev) }
	}
	g := &e.g
	s.recycler.Init(g, c, hook)
	e.state.Or(builtBit) // no pin or eviction before the build ends
	ok = true
	s.endBuild()
	return g
}

// MaxKeys returns the number of keys the scope keeps after a sweep
// (Options.MaxKeys, or its default).
func (s *Scope[K]) MaxKeys() int { return s.maxKeys }

// Template returns the compiled template policy, and whether every key's
// guard is built from it (no Options.Shape).
func (s *Scope[K]) Template() (c *policy.Compiled, uniform bool) {
	return s.compiled, s.opts.Shape == nil
}

// Len returns the number of keys held.
func (s *Scope[K]) Len() int { return int(s.size.Load()) }

// Stats returns a snapshot of the scope's counters.
func (s *Scope[K]) Stats() Stats {
	s.mu.Lock()
	misses := s.misses
	s.mu.Unlock()
	return Stats{
		Size:        s.Len(),
		Hits:        s.hits.load(),
		Misses:      misses,
		Evictions:   s.evictions.Load(),
		Pinned:      int(s.pinned.Load()),
		ShapeErrors: s.shapeErrs.Load(),
		Sweeps:      s.sweeps.Load(),
	}
}

// Range calls fn for each key and guard until fn returns false. It does not
// count as a lookup (keys ranged over are not kept alive by it) and is
// approximate: keys added or evicted while it runs may or may not be seen.
// fn may call the scope.
func (s *Scope[K]) Range(fn func(K, *policy.Guard) bool) {
	s.mu.Lock()
	t := s.tab.Load()
	live := make([]*entry[K], 0, s.size.Load())
	for i := range t.slots {
		if e := t.slots[i].Load(); e != nil {
			live = append(live, e)
		}
	}
	s.mu.Unlock()
	for _, e := range live {
		if g := e.guard(); g != nil && e.state.Load() >= 0 {
			if !fn(e.key, g) {
				return
			}
		}
	}
}
