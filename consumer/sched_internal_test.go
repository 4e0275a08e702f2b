package consumer

import (
	"runtime"
	"sync"
	"testing"
)

// A wake-up is counted only when it wakes a worker: with one worker
// waiting, several calls to wake one before it runs again (it needs the
// lock they hold) wake it once and count one searcher. Counting a signal
// that woke nobody would leave a searcher that does not exist, and while
// one is counted no lane made ready wakes anyone.
func TestSchedCountsOnlyTheWakeUpsItMakes(t *testing.T) {
	s := &sched{}
	s.cond = sync.NewCond(&s.mu)
	w := &worker{}
	got := make(chan *shard)
	go func() { got <- s.next(w) }()
	for {
		s.mu.Lock()
		if s.idle == 1 {
			break // the worker waits (and holds no lock)
		}
		s.mu.Unlock()
		runtime.Gosched()
	}
	sh := &shard{}
	sh.inRing = true
	s.ring = append(s.ring, sh)
	woke := 0
	for range 3 {
		if s.wakeFor(5) {
			woke++
		}
	}
	searching := s.searching.Load()
	s.mu.Unlock()
	if woke != 1 || searching != 1 {
		t.Fatalf("woke %d, counted %d searching, with one worker waiting; want 1 and 1", woke, searching)
	}
	if r := <-got; r != sh || !w.searching {
		t.Fatalf("next returned %p (searching %v), want the shard in the ring and a searching worker", r, w.searching)
	}
	s.mu.Lock()
	idle, signalled := s.idle, s.signalled
	s.mu.Unlock()
	if idle != 0 || signalled != 0 {
		t.Fatalf("after the wake-up: idle %d, signalled %d; want 0 and 0", idle, signalled)
	}
	s.stopSearching(w)
	if n := s.searching.Load(); n != 0 || w.searching {
		t.Fatalf("after the worker took a lane: %d searching (worker %v), want none", n, w.searching)
	}
}
