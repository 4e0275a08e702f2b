package consumer

import (
	"errors"
	"sync"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// This file is parking and pausing: a lane that waits behind its tenant's
// breaker (parkLane, parkRefused) and a partition the engine pauses at a
// bound (setPause, pressureGone, maybeResume).

// pauseState is the engine's pause of a partition. Guarded by the shard's
// mu, but src (see pauseSync).
type pauseState struct {
	// reason is why the engine wants the partition paused (zero: it does
	// not).
	reason PauseReason
	// at is the engine clock when the engine last paused the partition;
	// aheadOff is set when housekeeping lifted a read-ahead pause whose
	// count did not fall (see maintain), and cleared once count.quickQueued
	// is down to half of aheadLimit (see recount).
	at       int64
	aheadOff bool
	src      pauseSync // the wish applied to Source.Pause/Resume
}

// parkLane starts counting l's messages as parked. Called with sh.mu held.
func (c *Consumer) parkLane(l *lane) {
	l.parked = true
	l.t.noteOpen(c.clock())
	c.addParked(l, l.q.len())
}

// unparkLane stops counting l's messages as parked. Called with sh.mu held.
func (c *Consumer) unparkLane(l *lane) {
	l.parked = false
	c.addParked(l, -l.q.len())
}

// addParked counts n more (or, negative, fewer) messages of parked lane l
// as parked: for its tenant, for the engine, and for its shard (whose
// count lets pressureGone tell a full queue's runnable messages without
// walking the shard's lanes on every finish). Called with l.sh.mu held.
func (c *Consumer) addParked(l *lane, n int) {
	l.sh.count.parked += n
	l.t.parked.Add(int64(n))
	c.parkedTotal.Add(int64(n))
}

// maybeResume lifts an engine pause of sh whose pressure is gone.
func (c *Consumer) maybeResume(sh *shard) {
	sh.mu.Lock()
	ok := !sh.dead && sh.pause.reason != 0 && sh.pause.reason != PauseDraining && c.pressureGone(sh)
	if ok {
		c.setPause(sh, 0)
	}
	sh.mu.Unlock()
	if ok {
		c.syncPause(sh)
	}
}

// parkRefused parks the job's lane after its guard refused a permit, for
// as long as the refusal says.
func (c *Consumer) parkRefused(w *worker, g *policy.Guard, refusal error) {
	w.res.park = true
	w.res.wait = decideRefused(c.retryAfter(g, refusal)).delay
	tracePark(w.job.m, w.res.wait)
}

// retryAfter is how long a refused lane waits before asking again: the
// breaker's open period, or DLQRetry for an Admit refusal.
func (c *Consumer) retryAfter(g *policy.Guard, refusal error) time.Duration {
	var oe *policy.OpenError
	if errors.As(refusal, &oe) {
		return oe.RetryAfter()
	}
	if errors.Is(refusal, policy.ErrAdmitRefused) {
		return c.cfg.DLQRetry
	}
	return g.RetryAfter()
}

// requestPause records that the engine wants sh paused for reason (zero:
// resumed) and applies it, with no lock held.
func (c *Consumer) requestPause(sh *shard, reason PauseReason) {
	sh.mu.Lock()
	if sh.dead {
		sh.mu.Unlock()
		return
	}
	c.setPause(sh, reason)
	sh.mu.Unlock()
	c.syncPause(sh)
}

// setPause records why the engine wants sh paused (zero: it does not).
// Called with sh.mu held, so that the wish and the decision behind it
// change together; syncPause applies it once the lock is released.
func (c *Consumer) setPause(sh *shard, reason PauseReason) {
	if reason != 0 && sh.pause.reason == 0 {
		sh.pause.at = c.clock()
	}
	sh.pause.reason = reason
	sh.pause.src.set(reason != 0)
}

// syncPause makes the Source's pause state follow the engine's last wish,
// one call at a time and with no lock held.
func (c *Consumer) syncPause(sh *shard) {
	for _, paused := range sh.pause.src.run(func(pause bool) {
		if pause {
			c.src.Pause(sh.p)
		} else {
			c.src.Resume(sh.p)
		}
	}) {
		if paused {
			sh.mu.Lock()
			r := sh.pause.reason
			sh.mu.Unlock()
			c.emit(Event{Kind: EventPaused, Partition: sh.p, Pause: r})
		} else {
			c.emit(Event{Kind: EventResumedPartition, Partition: sh.p})
		}
	}
}

// pressureGone reports whether an engine pause of sh may end. Called with
// sh.mu held.
func (c *Consumer) pressureGone(sh *shard) bool {
	if sh.pause.reason == PauseReadAhead {
		// A bound of the partition reached meanwhile pauses it again, for
		// its own reason, at the next delivery.
		return sh.count.quickQueued <= c.aheadLimit(sh)/2
	}
	if sh.count.queued > sh.bounds.maxQueued/2 {
		// A full queue's pressure is the messages that can run. Parked
		// ones are bounded on their own (MaxParkedPerTenant, MaxParked:
		// PauseParkedBound); counted here, a queue whose every message
		// waits behind an open breaker for a message still in the broker
		// (a poison head needs a later message of its tenant as evidence)
		// would stay paused for ever.
		if sh.pause.reason != PauseQueueFull || sh.count.queued-sh.count.parked > sh.bounds.maxQueued/2 {
			return false
		}
	}
	if sh.pause.reason == PauseParkedBound {
		// Below 90% of the bounds, compared without rounding: with a bound
		// of 2, rounded 90% is 1, and one parked message (a poison head
		// waiting for a later message still in the broker) would keep the
		// partition paused for ever.
		if c.parkedTotal.Load()*10 >= int64(c.cfg.MaxParked)*9 {
			return false
		}
		for l := range sh.lanes.all() {
			if l.parked && l.t.parked.Load()*10 >= int64(sh.bounds.maxParkedTenant)*9 {
				return false
			}
		}
	}
	return true
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
