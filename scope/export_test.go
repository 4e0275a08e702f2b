package scope

import "math"

// Quiesce finishes any rebuild in progress and runs every rebuild that is
// due, so tests and benchmarks start from a known state.
func (s *Scope[K]) Quiesce() {
	s.sweepMu.Lock()
	var evicted []K
	for {
		if !s.rb.active {
			s.start(false)
		}
		if !s.rb.active {
			break
		}
		evicted = append(evicted, s.work(math.MaxInt)...)
	}
	s.sweepMu.Unlock()
	s.notify(evicted)
}

// SweepNow finishes any rebuild in progress, then runs one sweep, due or
// not, to completion.
func (s *Scope[K]) SweepNow() {
	s.sweepMu.Lock()
	var evicted []K
	if s.rb.active {
		evicted = s.work(math.MaxInt)
	}
	s.start(true)
	evicted = append(evicted, s.work(math.MaxInt)...)
	s.sweepMu.Unlock()
	s.notify(evicted)
}

// Promote moves every overflow key into the read map.
func (s *Scope[K]) Promote() {
	s.sweepMu.Lock()
	if s.rb.active {
		s.notify(s.work(math.MaxInt))
	}
	s.mu.Lock()
	s.slowHits = max(s.slowHits, s.promoteAfterLocked())
	s.mu.Unlock()
	s.start(false)
	var evicted []K
	if s.rb.active {
		evicted = s.work(math.MaxInt)
	}
	s.sweepMu.Unlock()
	s.notify(evicted)
}

// InRead reports whether key is in the lock-free read map.
func (s *Scope[K]) InRead(key K) bool {
	_, ok := s.read.Load().m[key]
	return ok
}

// HoldSweeps keeps every lookup from doing rebuild work until release is
// called, as if a slow rebuild were running on another goroutine.
func (s *Scope[K]) HoldSweeps() (release func()) {
	s.sweepMu.Lock()
	return s.sweepMu.Unlock
}
