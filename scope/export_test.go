package scope

import (
	"hash/maphash"
	"math"
)

// Quiesce finishes any sweep in progress and runs every sweep that is due,
// so tests and benchmarks start from a known state.
func (s *Scope[K]) Quiesce() {
	s.sweepMu.Lock()
	var evicted []K
	for {
		if !s.sweeping.Load() {
			s.start(false)
		}
		if !s.sweeping.Load() {
			break
		}
		evicted = append(evicted, s.work(math.MaxInt, false)...)
	}
	s.sweepMu.Unlock()
	s.notify(evicted)
}

// SweepNow finishes any sweep in progress, then runs one sweep, due or
// not, to completion.
func (s *Scope[K]) SweepNow() {
	s.sweepMu.Lock()
	var evicted []K
	if s.sweeping.Load() {
		evicted = s.work(math.MaxInt, false)
	}
	s.start(true)
	evicted = append(evicted, s.work(math.MaxInt, false)...)
	s.sweepMu.Unlock()
	s.notify(evicted)
}

// LockFree reports whether the lock-free probe finds key.
func (s *Scope[K]) LockFree(key K) bool {
	return s.find(key, maphash.Comparable(s.seed, key)) != nil
}

// TableSize is the number of slots of the current table.
func (s *Scope[K]) TableSize() int { return len(s.tab.Load().slots) }

// HoldSweeps keeps every lookup from doing sweep work until release is
// called, as if a slow sweep were running on another goroutine.
func (s *Scope[K]) HoldSweeps() (release func()) {
	s.sweepMu.Lock()
	return s.sweepMu.Unlock
}

// ScanOnly starts a sweep and scans the whole table without evicting: the
// cold keys found wait, as between the steps of a sweep. FinishSweep
// evicts them.
func (s *Scope[K]) ScanOnly() {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	if s.sweeping.Load() {
		s.notify(s.work(math.MaxInt, false))
	}
	s.start(true)
	sw := &s.sw
	t := s.tab.Load()
	for ; sw.pos < len(t.slots); sw.pos++ {
		if e := t.slots[sw.pos].Load(); e != nil {
			s.classify(e)
		}
	}
}

// Waiting is the number of cold keys found by the running sweep and not yet
// evicted.
func (s *Scope[K]) Waiting() int {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	return len(s.sw.cold) - s.sw.head
}

// Step does one step of sweep work, as an inserting lookup does.
func (s *Scope[K]) Step() { s.help(false, nil) }
