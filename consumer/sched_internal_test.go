package consumer

import (
	"runtime"
	"slices"
	"testing"
	"unsafe"
)

// A wake-up is counted only when it wakes a worker: with one worker
// waiting, several calls to wake one before it runs again (it needs the
// lock they hold) wake it once and count one searcher. Counting a signal
// that woke nobody would leave a searcher that does not exist, and while
// one is counted no lane made ready wakes anyone.
func TestSchedCountsOnlyTheWakeUpsItMakes(t *testing.T) {
	s := &sched{}
	w := &worker{wake: make(chan *shard, 1)}
	got := make(chan *shard)
	go func() { got <- s.next(w, false) }()
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
		if s.wakeFor(5, sh) {
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
	s.stopSearching(w, sh)
	if n := s.searching.Load(); n != 0 || w.searching {
		t.Fatalf("after the worker took a lane: %d searching (worker %v), want none", n, w.searching)
	}
}

// The worker woken is the one that went idle last (its stack and job are
// still warm), not the one idle longest; and shutdown wakes every one.
func TestSchedWakesTheLastIdleWorkerFirst(t *testing.T) {
	s := &sched{}
	ws, got := idleWorkers(s, 3)
	s.mu.Lock()
	s.ring = append(s.ring, &shard{inRing: true})
	woke := s.wakeFor(1, s.ring[0])
	s.mu.Unlock()
	if r := <-got; !woke || r.w != ws[2] {
		t.Fatalf("woke %v: worker %d, want the last idle (2)", woke, slices.Index(ws, r.w))
	}
	s.mu.Lock()
	s.ring = s.ring[:0]
	s.mu.Unlock()
	s.shutdown()
	for range 2 {
		<-got
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idle != 0 || len(s.sleepers) != 0 {
		t.Fatalf("after shutdown: idle %d, %d sleepers; want none", s.idle, len(s.sleepers))
	}
	// A lane made ready during the drain (a blocked lane let go) finds no
	// one to wake, and wakeFor must not fail looking for one.
	s.ring = append(s.ring, &shard{inRing: true})
	if s.wakeFor(1, s.ring[0]) {
		t.Fatal("woke a worker after shutdown")
	}
}

// Housekeeping's rescue wakes a worker for each partition with ready lanes
// that took none since its last look (its quick workers hang), sends each
// to its own partition, and forgets the partitions' quick-worker counts; a
// partition that took a lane meanwhile is left alone.
func TestSchedRescuesEachStuckShard(t *testing.T) {
	s := &sched{}
	_, got := idleWorkers(s, 3)
	shards := make([]*shard, 3)
	s.mu.Lock()
	for i := range shards {
		sh := &shard{inRing: true, quick: 2}
		sh.ready.push(&lane{})
		shards[i] = sh
		s.ring = append(s.ring, sh)
	}
	s.mu.Unlock()
	shards[2].mu.Lock()
	shards[2].takes++ // the third took a lane since the last look
	shards[2].mu.Unlock()
	s.rescue()
	seen := map[*shard]bool{}
	for range 2 {
		seen[(<-got).sh] = true
	}
	if !seen[shards[0]] || !seen[shards[1]] {
		t.Fatalf("rescued workers went to %v, want one to each stuck shard (%p, %p)", seen, shards[0], shards[1])
	}
	for i, sh := range shards {
		sh.mu.Lock()
		quick, rescues := sh.quick, sh.rescues
		sh.mu.Unlock()
		if wq, wr := 0, uint64(1); i == 2 && (quick != 2 || rescues != 0) || i < 2 && (quick != wq || rescues != wr) {
			t.Fatalf("shard %d: quick %d, rescues %d", i, quick, rescues)
		}
	}
	s.mu.Lock()
	left := len(s.sleepers)
	s.mu.Unlock()
	if left != 1 {
		t.Fatalf("%d workers still asleep after the rescue, want 1 (two stuck shards, one each)", left)
	}
	s.shutdown()
	<-got
}

// woken is what an idle worker's call to next returned.
type woken struct {
	w  *worker
	sh *shard
}

// idleWorkers starts n workers waiting in s.next, one at a time, so that
// they go idle in order; each sends what next returned on got.
func idleWorkers(s *sched, n int) (ws []*worker, got chan woken) {
	got = make(chan woken, n)
	for i := range n {
		w := &worker{wake: make(chan *shard, 1)}
		ws = append(ws, w)
		go func() { got <- woken{w, s.next(w, false)} }()
		for {
			s.mu.Lock()
			idle := s.idle
			s.mu.Unlock()
			if idle == i+1 {
				break
			}
			runtime.Gosched()
		}
	}
	return ws, got
}

// TestMessageLayout keeps a message's engine state in one cache line, the
// last of a 256-byte Message (a size class whose objects start on a line):
// see msgState. A field added to either breaks it here rather than as a
// slower engine.
func TestMessageLayout(t *testing.T) {
	var m Message
	if n := unsafe.Sizeof(m.st); n != 64 {
		t.Errorf("msgState is %d bytes, want 64 (one cache line)", n)
	}
	if n := unsafe.Sizeof(m); n != 256 {
		t.Errorf("Message is %d bytes, want 256", n)
	}
	if off := unsafe.Offsetof(m.st); off%64 != 0 {
		t.Errorf("msgState at offset %d of Message, not on a cache line", off)
	}
}
