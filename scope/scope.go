package scope

import (
	"fmt"
	"log/slog"
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

	// OnEvict, if set, is called with each evicted key once the sweep that
	// evicted it is complete, by the lookup that completed it (outside any
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
// Lookups of a key already present read an immutable map through an atomic
// pointer: they take no lock and allocate nothing, so no lookup of a present
// key ever waits for a sweep. New keys go to a small overflow map under a
// mutex that a sweep holds only for a few pointer swaps. Rebuilding the read
// map (a sweep, or the promotion of new keys) is incremental: each lookup
// that misses the read map does a small, fixed amount of that work if no
// other goroutine is doing some, so no single lookup pays for a whole sweep,
// sweeping keeps pace with any insert rate, and a Scope owns no goroutine
// (it needs no Close). A rebuild only progresses with such lookups: while
// every lookup hits, a started sweep stays pending (memory stays bounded).
//
// Eviction is approximate, after CLOCK: each lookup stamps its entry with the
// current sweep epoch, and a sweep keeps the keys stamped since the previous
// sweep started (at most MaxKeys of them), the protected keys (pinned, or
// breaker open or half-open) while under HardCeiling, and evicts the rest.
// Between sweeps the scope may exceed MaxKeys, by about MaxKeys/4. A For
// that would take it to HardCeiling+MaxKeys finishes the sweep itself first
// (the only lookup that waits for a sweep; it cannot happen while lookups
// keep sweeping, and only a lookup of a new key could).
//
// A lookup racing with the eviction of its key may return the evicted guard;
// the next lookup gets a fresh one. Callers should look the guard up for each
// unit of work rather than keep it.
//
// A Scope is safe for concurrent use.
type Scope[K comparable] struct {
	// read is the lock-free map: immutable once published. Read by every
	// lookup; written (swapped) only under mu.
	read atomic.Pointer[readMap[K]]
	_    [56]byte // keep read off the line the slow path writes

	template   policy.Policy
	opts       Options[K]
	maxKeys    int
	ceiling    int
	bound      int // HardCeiling + MaxKeys: inserts beyond it sweep inline
	hits       *counter
	evictions  atomic.Uint64
	pinned     atomic.Int64
	shapeErrs  atomic.Uint64
	rebuilding atomic.Bool // a rebuild is in progress (written under sweepMu)
	sweeps     atomic.Uint64
	size       atomic.Int64 // written under mu

	// sweepMu serialises rebuild work. Hits never take it; slow lookups
	// only try it, except a For at the hard bound.
	sweepMu sync.Mutex
	rb      rebuild[K] // (sweepMu)

	mu        sync.Mutex
	dirty     map[K]*entry[K] // keys in neither read nor frozen (mu)
	dirtyList []*entry[K]     // dirty's entries in insertion order (mu)
	frozen    map[K]*entry[K] // dirty taken by the running rebuild; read-only (mu to swap)
	slowHits  int             // lookups served from dirty or frozen since the last rebuild (mu)
	trigger   int             // a sweep is due when size exceeds it (mu)
	misses    uint64          // (mu)
}

// readMap is immutable once published: m for lookups, list for rebuilds.
type readMap[K comparable] struct {
	m     map[K]*entry[K]
	list  []*entry[K]
	epoch uint32
}

// entry states: >= 0 is the pin count of a live entry; dead marks an entry a
// sweep evicted (or whose build panicked). Lookups treat dead entries as
// absent.
const dead = -1

type entry[K comparable] struct {
	guard atomic.Pointer[policy.Guard] // nil until built
	seen  atomic.Uint32                // epoch of the last lookup
	state atomic.Int32                 // pin count, or dead
	build sync.Mutex                   // held by the goroutine building guard
	key   K
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
	if _, err := policy.New(template); err != nil {
		panic(fmt.Errorf("scope: invalid template: %w", err))
	}
	s := &Scope[K]{
		template: template,
		opts:     opts,
		maxKeys:  maxKeys,
		ceiling:  ceiling,
		bound:    ceiling + maxKeys,
		hits:     new(counter),
		dirty:    make(map[K]*entry[K], maxKeys*3/8+1),
		trigger:  maxKeys,
	}
	s.read.Store(&readMap[K]{m: map[K]*entry[K]{}, epoch: 1})
	return s
}

// For returns the guard of key, building it on first sight (or first sight
// after its eviction). A lookup of a present key takes no lock and allocates
// nothing.
func (s *Scope[K]) For(key K) *policy.Guard {
	r := s.read.Load()
	if e := r.m[key]; e != nil {
		if g := e.guard.Load(); g != nil && e.state.Load() >= 0 {
			if e.seen.Load() != r.epoch {
				e.seen.Store(r.epoch)
			}
			s.hits.add()
			return g
		}
	}
	g, _ := s.slow(key)
	return g
}

// Pin is For, and also pins the key: a pinned guard is not evicted while the
// scope holds fewer than HardCeiling keys. Pins are counted; each Pin needs
// one [Scope.Unpin]. If a pinned key is evicted anyway (beyond the ceiling),
// its pins are dropped with it.
func (s *Scope[K]) Pin(key K) *policy.Guard {
	for {
		r := s.read.Load()
		e := r.m[key]
		var g *policy.Guard
		if e != nil {
			g = e.guard.Load()
		}
		if g != nil && e.state.Load() >= 0 {
			if e.seen.Load() != r.epoch {
				e.seen.Store(r.epoch)
			}
			s.hits.add()
		} else {
			g, e = s.slow(key)
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
			if n == 0 {
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
		if n <= 0 {
			return
		}
		if e.state.CompareAndSwap(n, n-1) {
			if n == 1 {
				s.pinned.Add(-1)
			}
			return
		}
	}
}

// lookup finds the live entry of key without creating one or counting.
// Peek returns the guard of key if the scope holds one, without building
// it, counting a hit or marking the key as seen (so it does not keep the key
// from eviction). For reporting; use For to run work.
func (s *Scope[K]) Peek(key K) (*policy.Guard, bool) {
	if e := s.lookup(key); e != nil {
		if g := e.guard.Load(); g != nil {
			return g, true
		}
	}
	return nil, false
}

func (s *Scope[K]) lookup(key K) *entry[K] {
	if e := s.read.Load().m[key]; e != nil && e.state.Load() >= 0 {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.findLocked(key)
}

func (s *Scope[K]) findLocked(key K) *entry[K] {
	if e := s.read.Load().m[key]; e != nil && e.state.Load() >= 0 {
		return e
	}
	if e := s.dirty[key]; e != nil && e.state.Load() >= 0 {
		return e
	}
	if e := s.frozen[key]; e != nil && e.state.Load() >= 0 {
		return e
	}
	return nil
}

// slow is the lookup path for keys not (yet) in the read map. It returns the
// guard and its entry.
func (s *Scope[K]) slow(key K) (*policy.Guard, *entry[K]) {
	for {
		s.mu.Lock()
		if e := s.findLocked(key); e != nil {
			e.seen.Store(s.read.Load().epoch)
			s.slowHits++
			due := s.promoteDueLocked() || s.sweepDueLocked()
			s.mu.Unlock()
			s.hits.add()
			if due || s.rebuilding.Load() {
				s.help(false)
			}
			g := e.guard.Load()
			if g == nil {
				// Another goroutine is building it: wait for that build,
				// not for any sweep.
				e.build.Lock()
				//lint:ignore SA2001 the lock is the build's completion signal
				e.build.Unlock()
				if g = e.guard.Load(); g == nil {
					continue
				}
			}
			return g, e
		}
		if int(s.size.Load()) >= s.bound {
			s.mu.Unlock()
			s.help(true)
			continue
		}
		e := &entry[K]{key: key}
		e.seen.Store(s.read.Load().epoch)
		e.build.Lock()
		s.dirty[key] = e
		s.dirtyList = append(s.dirtyList, e)
		s.misses++
		s.size.Add(1)
		due := s.sweepDueLocked()
		s.mu.Unlock()

		g := s.build(e)
		if due || s.rebuilding.Load() {
			s.help(false)
		}
		return g, e
	}
}

// build runs Shape and policy.New for a new entry, outside mu. If Shape
// panics the entry dies and the panic goes on.
func (s *Scope[K]) build(e *entry[K]) *policy.Guard {
	ok := false
	defer func() {
		if !ok {
			e.state.Store(dead)
			e.build.Unlock()
		}
	}()
	p := s.template
	if s.opts.Shape != nil {
		p = s.opts.Shape(e.key)
	}
	g, err := policy.New(s.withKey(e.key, p))
	if err != nil {
		s.shapeErrs.Add(1)
		if s.opts.OnShapeError != nil {
			s.opts.OnShapeError(e.key, err)
		} else {
			slog.Warn("scope: Shape returned an invalid policy; using the template", "key", e.key, "err", err)
		}
		g, err = policy.New(s.withKey(e.key, s.template))
		if err != nil { // cannot happen: New validated the template
			panic(err)
		}
	}
	e.guard.Store(g)
	ok = true
	e.build.Unlock()
	return g
}

func (s *Scope[K]) withKey(key K, p policy.Policy) policy.Policy {
	if s.opts.OnEvent == nil {
		return p
	}
	inner, hook := p.OnEvent, s.opts.OnEvent
	p.OnEvent = func(e policy.Event) {
		if inner != nil {
			inner(e)
		}
		hook(key, e)
	}
	return p
}

// Len returns the number of keys held, including keys a running sweep is
// about to evict.
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
	r := s.read.Load() // consistent with dirty and frozen: disjoint live keys
	extra := make([]*entry[K], 0, len(s.dirtyList)+len(s.frozen))
	extra = append(extra, s.dirtyList...)
	for _, e := range s.frozen {
		extra = append(extra, e)
	}
	s.mu.Unlock()
	for _, e := range r.list {
		if g := e.guard.Load(); g != nil && e.state.Load() >= 0 {
			if !fn(e.key, g) {
				return
			}
		}
	}
	for _, e := range extra {
		if g := e.guard.Load(); g != nil && e.state.Load() >= 0 {
			if !fn(e.key, g) {
				return
			}
		}
	}
}
