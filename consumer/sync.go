package consumer

import (
	"sync"
	"sync/atomic"
	"time"
)

// commitSync hands the newest of a stream of increasing commit points to a
// slow callee (Source.Commit, SpillLog.Commit) without a lock held during
// the call: whoever advances want tries to become the caller; the caller
// loops until done catches up. Calls never overlap and their values strictly
// increase; a point superseded while a call runs is skipped.
type commitSync struct {
	want atomic.Int64 // highest point computed; -1 none
	done atomic.Int64 // highest point passed to the callee; -1 none
	busy atomic.Bool  // a caller is in the loop
	// stopped ends the loop (revocation); waiters poll busy.
	stopped atomic.Bool
}

func (s *commitSync) init() { s.want.Store(-1); s.done.Store(-1) }

// raise lifts want to p and reports whether it moved.
func (s *commitSync) raise(p int64) bool {
	for {
		w := s.want.Load()
		if p <= w {
			return false
		}
		if s.want.CompareAndSwap(w, p) {
			return true
		}
	}
}

// run calls call with each new point until none is left or another caller
// holds the loop. It returns the last error of call, if any.
func (s *commitSync) run(call func(int64) error) error {
	var err error
	for !s.stopped.Load() && s.want.Load() > s.done.Load() {
		if !s.busy.CompareAndSwap(false, true) {
			return err
		}
		for !s.stopped.Load() {
			w := s.want.Load()
			if w <= s.done.Load() {
				break
			}
			if e := call(w); e != nil {
				err = e
				// Keep done where it was: the next advance retries.
				break
			}
			s.done.Store(w)
		}
		s.busy.Store(false)
		if err != nil {
			return err
		}
	}
	return err
}

// stop ends the loop and waits for a running call to return.
func (s *commitSync) stop() {
	s.stopped.Store(true)
	for s.busy.Load() {
		yield()
	}
}

// settleGate lets Source.Settle run without a shard lock while Revoked waits
// for the calls in progress and stops later ones: a caller counts itself in
// and then checks closed; Revoked sets closed and then waits for the count
// to drop (both sequentially consistent, so one of them sees the other).
type settleGate struct {
	n      atomic.Int64
	closed atomic.Bool
}

func (g *settleGate) enter() bool {
	g.n.Add(1)
	if g.closed.Load() {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *settleGate) exit() { g.n.Add(-1) }

func (g *settleGate) close() {
	g.closed.Store(true)
	for g.n.Load() > 0 {
		yield()
	}
}

// pauseSync applies the engine's wish for a partition (paused or not) to the
// Source, one call at a time and with no lock held, ending on the last wish.
type pauseSync struct {
	mu      sync.Mutex
	want    bool
	applied bool
	busy    bool
	stopped bool
}

// set records the wish and reports whether it changed.
func (p *pauseSync) set(want bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := p.want != want
	p.want = want
	return changed
}

// run applies wishes until the applied state matches the last one. apply is
// called with no lock held; it returns what it applied, and run reports the
// transitions it made (for events).
func (p *pauseSync) run(apply func(pause bool)) (transitions []bool) {
	for {
		p.mu.Lock()
		if p.busy || p.stopped || p.want == p.applied {
			p.mu.Unlock()
			return transitions
		}
		want := p.want
		p.busy = true
		p.mu.Unlock()
		apply(want)
		transitions = append(transitions, want)
		p.mu.Lock()
		p.applied = want
		p.busy = false
		p.mu.Unlock()
	}
}

// stop ends run loops and returns whether the source was left paused by
// the engine, after waiting for a call in progress.
func (p *pauseSync) stop() (paused bool) {
	for {
		p.mu.Lock()
		if !p.busy {
			p.stopped = true
			paused = p.applied
			p.mu.Unlock()
			return paused
		}
		p.mu.Unlock()
		yield()
	}
}

// yield waits a little while another goroutine finishes a call (a Settle,
// Commit or Pause in progress); these waits happen on revocation and
// shutdown only.
func yield() { time.Sleep(50 * time.Microsecond) }
