package scope

import (
	"math"

	"github.com/ringfence/ringfence/policy"
)

// stepUnits is how much rebuild work (entries classified, copied or
// evicted) one slow-path lookup does. A rebuild of n entries is spread over
// about 3n/stepUnits slow lookups, so no single lookup pays for a sweep, and
// sweeping keeps up with any insert rate.
const stepUnits = 32

type phase uint8

const (
	phaseClassify phase = iota
	phaseSelect
	phaseBuild
	phaseEvict
	phasePublish
)

// rebuild is the state of an incremental rebuild of the read map: a sweep,
// or a promotion of the overflow. All fields are protected by sweepMu.
type rebuild[K comparable] struct {
	active bool
	sweep  bool
	prev   uint32 // epoch before a sweep: entries stamped prev or later were seen
	epoch  uint32 // epoch of the map to publish
	phase  phase
	i      int

	old    *readMap[K]
	frozen []*entry[K]

	seen, pinned, open, cold, over []*entry[K] // reused across rebuilds
	keep                           []*entry[K] // becomes the published list

	m       map[K]*entry[K]
	evicted []K
}

func (s *Scope[K]) sweepDueLocked() bool { return int(s.size.Load()) > s.trigger }

func (s *Scope[K]) promoteDueLocked() bool {
	return len(s.dirtyList) > 0 && s.slowHits >= s.promoteAfterLocked()
}

// promoteAfterLocked is how many slow-path hits make the overflow due for
// promotion into the read map: the O(n) copy is amortised over n/8 slow
// lookups.
func (s *Scope[K]) promoteAfterLocked() int {
	return max(len(s.dirtyList), (len(s.read.Load().list)+len(s.dirtyList))/8, 1)
}

// help does a step of rebuild work if no other goroutine is doing one. If
// wait is set (the scope is at its hard bound) it waits for sweepMu and
// finishes the rebuild instead.
func (s *Scope[K]) help(wait bool) {
	if wait {
		s.sweepMu.Lock()
		if !s.rb.active {
			s.start(true)
		}
		evicted := s.work(math.MaxInt)
		s.sweepMu.Unlock()
		s.notify(evicted)
		return
	}
	if !s.sweepMu.TryLock() {
		return
	}
	if !s.rb.active {
		s.start(false)
	}
	var evicted []K
	if s.rb.active {
		evicted = s.work(stepUnits)
	}
	s.sweepMu.Unlock()
	s.notify(evicted)
}

func (s *Scope[K]) notify(evicted []K) {
	if s.opts.OnEvict == nil {
		return
	}
	for _, k := range evicted {
		s.opts.OnEvict(k)
	}
}

// start begins a rebuild if one is due (or force): it takes the overflow,
// and for a sweep starts a new epoch. O(1) apart from a small map.
func (s *Scope[K]) start(force bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sweep := force || s.sweepDueLocked()
	if !sweep && !s.promoteDueLocked() {
		return
	}
	rb := &s.rb
	old := s.read.Load()
	rb.active, rb.sweep, rb.phase, rb.i = true, sweep, phaseClassify, 0
	s.rebuilding.Store(true)
	rb.old, rb.frozen = old, s.dirtyList
	rb.prev, rb.epoch = old.epoch, old.epoch
	s.frozen = s.dirty
	// Sized for the inserts expected before the next rebuild: growing a map
	// rehashes it, a latency spike in the lookup that triggers it.
	hint := s.maxKeys*3/8 + 1
	s.dirty = make(map[K]*entry[K], hint)
	s.dirtyList = make([]*entry[K], 0, hint)
	s.slowHits = 0
	if sweep {
		// Lookups from now on stamp the new epoch, so keys seen while this
		// sweep runs survive the next one too.
		rb.epoch++
		s.read.Store(&readMap[K]{m: old.m, list: old.list, epoch: rb.epoch})
	}
}

// work runs up to budget units of the active rebuild and returns the keys
// evicted if it completed (and OnEvict is set). The caller holds sweepMu.
func (s *Scope[K]) work(budget int) []K {
	rb := &s.rb
	for budget > 0 {
		switch rb.phase {
		case phaseClassify:
			n := len(rb.old.list) + len(rb.frozen)
			for ; rb.i < n && budget > 0; rb.i, budget = rb.i+1, budget-1 {
				var e *entry[K]
				if rb.i < len(rb.old.list) {
					e = rb.old.list[rb.i]
				} else {
					e = rb.frozen[rb.i-len(rb.old.list)]
				}
				s.classify(e)
			}
			if rb.i == n {
				rb.phase, rb.i = phaseSelect, 0
			}
		case phaseSelect:
			s.selectKeep()
			budget -= 4
			rb.phase = phaseBuild
		case phaseBuild:
			if rb.m == nil {
				rb.m = make(map[K]*entry[K], len(rb.keep))
			}
			for ; rb.i < len(rb.keep) && budget > 0; rb.i, budget = rb.i+1, budget-1 {
				e := rb.keep[rb.i]
				rb.m[e.key] = e
			}
			if rb.i == len(rb.keep) {
				rb.phase, rb.i = phaseEvict, 0
			}
		case phaseEvict:
			// Evict before publishing: once an entry is dead, lookups treat
			// it as absent, so no key ever has two live guards.
			n := len(rb.over) + len(rb.cold)
			for ; rb.i < n && budget > 0; rb.i, budget = rb.i+1, budget-1 {
				if rb.i < len(rb.over) {
					s.kill(rb.over[rb.i], true)
				} else if e := rb.cold[rb.i-len(rb.over)]; !s.kill(e, false) && e.state.Load() >= 0 {
					// Pinned since it was classified: keep it.
					rb.m[e.key] = e
					rb.keep = append(rb.keep, e)
				}
			}
			if rb.i == n {
				rb.phase = phasePublish
			}
		case phasePublish:
			return s.publish()
		}
	}
	return nil
}

func (s *Scope[K]) classify(e *entry[K]) {
	rb := &s.rb
	st := e.state.Load()
	if st < 0 {
		return // dead: already gone
	}
	if !rb.sweep {
		rb.seen = append(rb.seen, e)
		return
	}
	g := e.guard.Load()
	switch {
	case g == nil: // still being built: brand new
		rb.seen = append(rb.seen, e)
	case st > 0:
		rb.pinned = append(rb.pinned, e)
	case g.State() != policy.Closed:
		rb.open = append(rb.open, e)
	case e.seen.Load()-rb.prev <= 1: // stamped prev or prev+1
		rb.seen = append(rb.seen, e)
	default:
		rb.cold = append(rb.cold, e)
	}
}

// selectKeep decides what survives: the seen keys up to MaxKeys, then the
// protected ones (pinned first: they hold parked messages) while under the
// ceiling.
func (s *Scope[K]) selectKeep() {
	rb := &s.rb
	if rb.sweep && len(rb.seen) > s.maxKeys {
		// More keys were seen than fit: keep an arbitrary part, down to a
		// low-water mark so that the next sweep is not due at once.
		keep := s.maxKeys - s.maxKeys/8
		rb.cold = append(rb.cold, rb.seen[keep:]...)
		rb.seen = rb.seen[:keep]
	}
	rb.keep = make([]*entry[K], 0, min(len(rb.seen)+len(rb.pinned)+len(rb.open), s.ceiling)+s.maxKeys/16)
	rb.keep = append(rb.keep, rb.seen...)
	for _, list := range [2][]*entry[K]{rb.pinned, rb.open} {
		for _, e := range list {
			if len(rb.keep) < s.ceiling {
				rb.keep = append(rb.keep, e)
			} else {
				rb.over = append(rb.over, e)
			}
		}
	}
}

// kill evicts e: only if unpinned, unless force. It reports whether e was
// evicted by this call.
func (s *Scope[K]) kill(e *entry[K], force bool) bool {
	for {
		n := e.state.Load()
		if n < 0 || (n > 0 && !force) {
			return false
		}
		if e.state.CompareAndSwap(n, dead) {
			if n > 0 {
				s.pinned.Add(-1)
			}
			s.evictions.Add(1)
			if s.opts.OnEvict != nil {
				s.rb.evicted = append(s.rb.evicted, e.key)
			}
			return true
		}
	}
}

// publish swaps in the rebuilt map (O(1) under mu) and resets the state.
func (s *Scope[K]) publish() []K {
	rb := &s.rb
	s.mu.Lock()
	s.read.Store(&readMap[K]{m: rb.m, list: rb.keep, epoch: rb.epoch})
	s.frozen = nil
	s.size.Store(int64(len(rb.m) + len(s.dirtyList)))
	if rb.sweep {
		// Leave room for MaxKeys/4 new keys before the next sweep, so
		// that sweeping stays amortised.
		s.trigger = min(max(s.maxKeys, len(rb.m)+s.maxKeys/4+1), s.bound-1)
	}
	s.mu.Unlock()
	s.rebuilding.Store(false)
	if rb.sweep {
		s.sweeps.Add(1)
	}
	evicted := rb.evicted
	for _, l := range []*[]*entry[K]{&rb.seen, &rb.pinned, &rb.open, &rb.cold, &rb.over} {
		clear(*l) // drop references to evicted entries
		*l = (*l)[:0]
	}
	*rb = rebuild[K]{seen: rb.seen, pinned: rb.pinned, open: rb.open, cold: rb.cold, over: rb.over}
	return evicted
}
