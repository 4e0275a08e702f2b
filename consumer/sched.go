package consumer

import (
	"sync"
	"sync/atomic"
)

// sched hands shards with ready lanes to workers. Its ring holds exactly
// the shards whose ready queue is not empty (kept so under both locks: a
// shard enters or leaves only while its own mu and sched.mu are held). Idle
// workers wait on cond; a shard entering the ring wakes one, and a worker
// that takes a lane while more are ready wakes the next (a chain), so a
// burst wakes workers without a signal per message.
//
// A woken worker is searching until it takes a lane or waits again. A lane
// made ready wakes a worker only if none is searching, and a worker that
// takes a lane while n more of its partition are ready wakes another only
// if n is more than the workers searching (they will take those): the
// searchers take the work that would have woken more. A searcher that
// takes a lane wakes the next if any lane is still ready and no other
// worker searches (stopSearching). So a ready lane always has a worker
// awake and not in a handler to take it while any sleeps; a backlog wakes
// workers as fast as they take lanes; and a stream of messages that one
// worker keeps up with, arriving one at a time, does not wake a second per
// message (Go's scheduler keeps its spinning threads the same way).
//
// Workers on quick lanes are the exception (see runQuick): once a
// partition has as many of them as cores, a worker that takes a quick lane
// wakes no other, and a worker that comes to the partition waits instead.
// They are not waiting for a dependency, so they take the partition's
// ready lanes themselves; if their calls all hang, housekeeping sees the
// partition take no lane for a tick and wakes one (rescue).
type sched struct {
	mu     sync.Mutex
	ring   []*shard
	cursor int
	// sleepers are the idle workers not yet signalled, the most recently
	// idle last: a signal wakes the last (see wakeFor).
	sleepers []*worker
	idle     int // workers waiting for a signal
	// signalled of them were signalled and have not yet returned from
	// the wait (idle - signalled is len(sleepers) until shutdown, which
	// wakes every sleeper without counting it).
	signalled int
	stop      bool // draining: workers return
	// wakeable mirrors idle - signalled for a lock-free look: the idle
	// workers a Signal would wake. A lane made ready while workers sleep
	// must wake one even if its shard is in the ring; and a worker that took
	// a lane while more are ready (chain) need not take mu when every idle
	// worker is signalled already (with many tenants, most calls: a trip
	// to mu's line for no wake-up; BenchmarkEngine guards this).
	wakeable atomic.Int32
	// searching counts woken workers that have not taken a lane yet.
	// Raised by the waker, under mu; lowered by the worker.
	searching atomic.Int32
	checked   []*shard // rescue's copy of the ring; housekeeping's own
}

// enter adds sh to the ring (if it is not in it) and, with wake, wakes an
// idle worker for the lane that was just made ready. Called with sh.mu
// held.
func (s *sched) enter(sh *shard, wake bool) {
	s.mu.Lock()
	if !sh.inRing {
		sh.inRing = true
		s.ring = append(s.ring, sh)
	}
	if wake {
		s.wakeFor(1, sh)
	}
	s.mu.Unlock()
}

// wakeFor wakes an idle worker if more than the searching workers are
// needed for n ready lanes. Called with s.mu held; it reports whether it
// woke one.
func (s *sched) wakeFor(n int, sh *shard) bool {
	if len(s.sleepers) == 0 || int(s.searching.Load()) >= n {
		return false
	}
	s.signalled++
	s.wakeable.Add(-1)
	s.searching.Add(1)
	s.signal(sh)
	return true
}

// signal wakes the idle worker that went idle last (its stack and job are
// the likeliest still in a cache; sync.Cond wakes the one idle longest)
// and tells it which shard it was woken for, so that it goes there rather
// than to the ring's next: woken for a partition with ready lanes, a worker
// that went to one with enough workers waited again (see runQuick). Called
// with s.mu held, with a sleeper.
func (s *sched) signal(sh *shard) {
	last := len(s.sleepers) - 1
	w := s.sleepers[last]
	s.sleepers[last] = nil
	s.sleepers = s.sleepers[:last]
	w.wake <- sh
}

// stopSearching ends w's search (it took a lane, or found none and is
// about to wait) and wakes the next worker if lanes are still ready.
func (s *sched) stopSearching(w *worker, sh *shard) {
	if !w.searching {
		return
	}
	w.searching = false
	s.searching.Add(-1)
	if !w.enough {
		s.chain(1, sh)
	}
}

// rescue wakes a worker for each shard in the ring that took no lane since
// the last call (every tick) while lanes were ready: workers on quick lanes
// wake no other once there are enough of them (see runQuick), so if their
// calls all hang, the lanes still ready would wait for them. Called by
// housekeeping with no lock held.
func (s *sched) rescue() {
	s.mu.Lock()
	s.checked = append(s.checked[:0], s.ring...)
	s.mu.Unlock()
	defer clear(s.checked)
	stuck := s.checked[:0]
	for _, sh := range s.checked {
		sh.mu.Lock()
		if sh.ready.len() > 0 && sh.takes == sh.lastTakes {
			// Its workers on quick lanes hang: they count no more (see
			// runQuick), so workers that come take its lanes.
			sh.quick = 0
			sh.quickGen++
			sh.rescues++
			stuck = append(stuck, sh)
		}
		sh.lastTakes = sh.takes
		sh.mu.Unlock()
	}
	if len(stuck) == 0 {
		return
	}
	s.mu.Lock()
	for i, sh := range stuck {
		s.wakeFor(i+1, sh) // one more searching worker for each
	}
	s.mu.Unlock()
}

// leave removes sh from the ring. Called with sh.mu held.
func (s *sched) leave(sh *shard) {
	s.mu.Lock()
	if sh.inRing {
		sh.inRing = false
		for i, x := range s.ring {
			if x == sh {
				last := len(s.ring) - 1
				s.ring[i] = s.ring[last]
				s.ring[last] = nil
				s.ring = s.ring[:last]
				break
			}
		}
	}
	s.mu.Unlock()
}

// chain wakes one more idle worker if any waits and the n lanes still
// ready need more than the workers searching: called by a worker that took
// a lane while n more of its partition were ready, and with n = 1 by a
// searcher that took one (any lane still ready then needs a worker). It
// reports whether it woke one.
func (s *sched) chain(n int, sh *shard) bool {
	if s.wakeable.Load() <= 0 || int(s.searching.Load()) >= n {
		return false
	}
	s.mu.Lock()
	woke := len(s.ring) > 0 && s.wakeFor(n, sh)
	s.mu.Unlock()
	return woke
}

// next returns a shard with ready lanes, waiting while there is none (or,
// with rest, until a signal): the one w was woken for if it still has
// some, else the ring's next; nil once the engine drains. A worker woken
// from the wait is searching (see sched) until it takes a lane or waits
// again.
func (s *sched) next(w *worker, rest bool) *shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	var woken *shard
	for (len(s.ring) == 0 || rest) && !s.stop {
		rest = false
		if w.searching { // found nothing: no longer searching
			w.searching = false
			s.searching.Add(-1)
		}
		s.idle++
		s.wakeable.Add(1)
		s.sleepers = append(s.sleepers, w)
		s.mu.Unlock()
		woken = <-w.wake
		s.mu.Lock()
		s.idle--
		if s.stop {
			s.wakeable.Store(int32(s.idle - s.signalled))
			break // woken by shutdown
		}
		s.signalled--      // and wakeable went down when it was signalled
		w.searching = true // woken by wakeFor, which counted it
	}
	if s.stop {
		return nil
	}
	if woken != nil && woken.inRing {
		return woken // woken for its lanes
	}
	s.cursor++
	return s.ring[s.cursor%len(s.ring)]
}

// shutdown makes every worker return once it finishes its job.
func (s *sched) shutdown() {
	s.mu.Lock()
	s.stop = true
	for _, w := range s.sleepers {
		w.wake <- nil
	}
	clear(s.sleepers)
	s.sleepers = s.sleepers[:0]
	s.mu.Unlock()
}
