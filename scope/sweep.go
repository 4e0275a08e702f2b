package scope

import "github.com/ringfence/ringfence/policy"

// kick makes sure a maintenance goroutine will look at the scope. At most one
// runs at a time; it exits when there is nothing left to do, so an idle Scope
// owns no goroutine.
func (s *Scope[K]) kick() {
	if !s.running.Load() && s.running.CompareAndSwap(false, true) {
		go s.maintain()
	}
}

func (s *Scope[K]) maintain() {
	for {
		s.sweepMu.Lock()
		evicted := s.rebuild(false)
		s.sweepMu.Unlock()
		s.notify(evicted)
		// Clear running before looking for more work: an insert either sees
		// it clear and starts a new goroutine, or is seen here.
		s.running.Store(false)
		if !s.needsWork() || !s.running.CompareAndSwap(false, true) {
			return
		}
	}
}

func (s *Scope[K]) needsWork() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.needSweepLocked() || s.needPromoteLocked()
}

func (s *Scope[K]) needSweepLocked() bool { return int(s.size.Load()) > s.trigger }

func (s *Scope[K]) needPromoteLocked() bool {
	return len(s.dirty) > 0 && s.slowHits >= s.promoteAfterLocked()
}

func (s *Scope[K]) notify(evicted []K) {
	if s.opts.OnEvict == nil {
		return
	}
	for _, k := range evicted {
		s.opts.OnEvict(k)
	}
}

// rebuild publishes a new read map: the old one plus the overflow, swept if
// the scope is over its trigger (or force is set). It holds mu only to take
// the overflow and to publish; lookups of present keys never wait for it.
// The caller holds sweepMu. It returns the evicted keys if OnEvict is set.
func (s *Scope[K]) rebuild(force bool) []K {
	s.mu.Lock()
	sweep := force || s.needSweepLocked()
	if !sweep && !s.needPromoteLocked() {
		s.mu.Unlock()
		return nil
	}
	old := s.read.Load()
	frozen := s.dirty
	s.frozen = frozen
	s.dirty = make(map[K]*entry[K])
	s.slowHits = 0
	epoch := old.epoch
	if sweep {
		// A new epoch starts now: lookups from here on stamp it, so keys
		// seen while this sweep runs survive the next one too.
		epoch++
		s.read.Store(&readMap[K]{m: old.m, epoch: epoch})
	}
	s.mu.Unlock()

	var m map[K]*entry[K]
	var evicted []K
	if sweep {
		m, evicted = s.sweep(old.m, frozen, old.epoch)
		s.sweeps.Add(1)
	} else {
		m = make(map[K]*entry[K], len(old.m)+len(frozen))
		for _, src := range [2]map[K]*entry[K]{old.m, frozen} {
			for k, e := range src {
				if e.state.Load() >= 0 {
					m[k] = e
				}
			}
		}
	}

	s.mu.Lock()
	s.read.Store(&readMap[K]{m: m, epoch: epoch})
	s.frozen = nil
	s.size.Store(int64(len(m) + len(s.dirty)))
	if sweep {
		// Leave room for maxKeys/16 new keys before the next sweep, so the
		// O(n) sweep is amortised over many inserts.
		s.trigger = min(max(s.maxKeys, len(m)+s.maxKeys/16+1), s.bound-1)
	}
	s.mu.Unlock()
	return evicted
}

// sweep decides which entries of the old read map and the overflow survive.
// prev is the epoch that was current until this sweep started: entries
// stamped with it or with the new one were seen since the previous sweep
// started.
func (s *Scope[K]) sweep(old, frozen map[K]*entry[K], prev uint32) (map[K]*entry[K], []K) {
	var seen, pinned, open, cold []*entry[K]
	for _, src := range [2]map[K]*entry[K]{old, frozen} {
		for _, e := range src {
			st := e.state.Load()
			if st < 0 {
				continue
			}
			g := e.guard.Load()
			switch {
			case g == nil: // still being built: brand new
				seen = append(seen, e)
			case st > 0:
				pinned = append(pinned, e)
			case g.State() != policy.Closed:
				open = append(open, e)
			case e.seen.Load()-prev <= 1:
				seen = append(seen, e)
			default:
				cold = append(cold, e)
			}
		}
	}
	if len(seen) > s.maxKeys {
		// More keys were seen than fit: keep an arbitrary part, down to a
		// low-water mark so that the next sweep is not due at once.
		keep := s.maxKeys - s.maxKeys/8
		cold = append(cold, seen[keep:]...)
		seen = seen[:keep]
	}
	m := make(map[K]*entry[K], min(len(seen)+len(pinned)+len(open), s.ceiling))
	for _, e := range seen {
		m[e.key] = e
	}
	var evicted []K
	kill := func(e *entry[K]) {
		for {
			n := e.state.Load()
			if n < 0 {
				return
			}
			if e.state.CompareAndSwap(n, dead) {
				if n > 0 {
					s.pinned.Add(-1)
				}
				s.evictions.Add(1)
				if s.opts.OnEvict != nil {
					evicted = append(evicted, e.key)
				}
				return
			}
		}
	}
	// Protected entries fill the room left under the ceiling, pinned first:
	// they hold parked messages.
	for _, list := range [2][]*entry[K]{pinned, open} {
		for _, e := range list {
			if len(m) < s.ceiling {
				m[e.key] = e
			} else {
				kill(e)
			}
		}
	}
	for _, e := range cold {
		// A cold entry pinned since it was classified is kept.
		if e.state.CompareAndSwap(0, dead) {
			s.evictions.Add(1)
			if s.opts.OnEvict != nil {
				evicted = append(evicted, e.key)
			}
		} else if e.state.Load() > 0 {
			m[e.key] = e
		}
	}
	return m, evicted
}
