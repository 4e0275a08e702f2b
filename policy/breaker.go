package policy

import (
	"errors"
	"math"
	"time"
)

// The circuit breaker: a state word (generation<<2 | State) read on every
// attempt, a rolling window of outcome buckets for the ratio rule, and the
// transitions, each of which starts a new generation under mu so that late
// outcomes from before it are ignored.

func unpack(s uint64) (State, uint64) { return State(s & 3), s >> 2 }

// breakerState is the breaker state; a breaker whose open period has ended
// reports HalfOpen.
func (g *guard) breakerState() State {
	st, _ := unpack(g.state.Load())
	if st == Open && g.now() >= g.openUntil.Load() {
		return HalfOpen
	}
	return st
}

// retryAfter is how long until the breaker admits a probe: zero unless the
// breaker is open.
func (g *guard) retryAfter() time.Duration {
	st, _ := unpack(g.state.Load())
	if st != Open {
		return 0
	}
	if Override(g.force.Load()) == OverrideOpen {
		return g.r.maxOpen // see Force
	}
	return max(time.Duration(g.openUntil.Load()-g.now()), 0)
}

// State returns the breaker state. A breaker whose open period has ended
// reports HalfOpen. Without a breaker it is always Closed.
func (h *Guard) State() State {
	g, sh := h.enter(draw())
	st := g.breakerState()
	g.exit(sh)
	return st
}

// Closed reports whether the breaker is closed (always, without a breaker).
// It is State() == Closed without reading the clock, for code that scans
// many guards: an open breaker whose open period has ended is not closed.
func (h *Guard) Closed() bool {
	// One load, then a check that it was of h's own life: a state is reset
	// (and its state word stored) only after Retire moved life on.
	g := h.st.Load()
	st, _ := unpack(g.state.Load())
	if g.pool != nil && g.life.Load() != h.gen {
		return true // retired: its next call runs on a fresh, closed state
	}
	return st == Closed
}

// RetryAfter returns how long until the breaker admits a probe: zero unless
// the breaker is open.
func (h *Guard) RetryAfter() time.Duration {
	g, sh := h.enter(draw())
	d := g.retryAfter()
	g.exit(sh)
	return d
}

// acquire fills the zero Permit *p, or refuses. It works through a pointer:
// copying a Permit of mixed-size fields by value costs store-forwarding
// stalls that showed up as a fifth of the hot path. r is the call's draw
// (see draw): its low bits are the counter shard, and its random bits
// decide whether the attempt is a latency sample and whether its success
// checks for a shard collision.
func (g *guard) acquire(p *Permit, r uint32) error {
	shard := uint8(r & (counterShards - 1))
	ps := shard // the permit's: its success may check for a collision
	if checks(r) {
		ps |= shardChecked
	}
	if !g.r.breaker {
		p.g, p.shard = g, ps
		g.begin(p, r)
		return nil
	}
	st, gen := unpack(g.state.Load())
	if st == Closed {
		// The hot path: no exact clock read unless this attempt is a
		// sample (the slow-call check reads the coarse clock).
		p.g, p.gen, p.shard = g, gen, ps
		g.begin(p, r)
		return nil
	}
	now := g.now()
	if st == Open && now < g.openUntil.Load() {
		g.counts[shard].rejected.Add(1)
		return g.openErr.Load()
	}
	return g.acquireSlow(p, now, shard)
}

func (g *guard) acquireSlow(p *Permit, now int64, shard uint8) error {
	g.mu.Lock()
	st, gen := unpack(g.state.Load())
	if st == Open && now >= g.openUntil.Load() {
		g.setState(HalfOpen)
		g.probesOut, g.probesOK = 0, 0
		g.mu.Unlock()
		g.emitState(Event{Kind: EventBreakerHalfOpen, State: HalfOpen})
		g.mu.Lock()
		st, gen = unpack(g.state.Load())
	}
	switch st {
	case Closed:
		g.mu.Unlock()
		*p = Permit{g: g, gen: gen, start: now, timed: true, clock: clockExact, shard: shard}
		return nil
	case HalfOpen:
		if g.probesOut+g.probesOK < g.r.probes {
			g.probesOut++
			g.mu.Unlock()
			*p = Permit{g: g, gen: gen, start: now, timed: true, clock: clockExact, probe: true, shard: shard}
			return nil
		}
		full := g.fullErr.Load()
		if full == nil {
			full = &OpenError{State: HalfOpen, clock: g.r.clock, g: g, life: g.life.Load()}
			g.fullErr.Store(full)
		}
		g.mu.Unlock()
		g.counts[shard].rejected.Add(1)
		return full
	default:
		g.mu.Unlock()
		g.counts[shard].rejected.Add(1)
		return g.openErr.Load()
	}
}

// setState moves to st with a new generation. Called with mu held.
func (g *guard) setState(st State) {
	_, gen := unpack(g.state.Load())
	g.state.Store((gen+1)<<2 | uint64(st))
}

// releaseProbe frees the probe slot of p, a probe permit that ended without
// an outcome for the breaker (released, or an excluded error).
func (g *guard) releaseProbe(p *Permit) {
	g.mu.Lock()
	if _, gen := unpack(g.state.Load()); gen == p.gen {
		g.probesOut--
	}
	g.mu.Unlock()
}

// recordSuccess counts a success of p toward the breaker; now is the exact
// time if known, else -1.
func (g *guard) recordSuccess(p *Permit, now int64) {
	s := g.state.Load()
	st, gen := unpack(s)
	if gen != p.gen {
		return
	}
	if st == Closed {
		if g.consec.Load() != 0 {
			g.consec.Store(0)
		}
		if g.r.ratio > 0 {
			if now < 0 {
				now = g.now()
			}
			g.bucketAt(now).succ.Add(1)
		}
		return
	}
	if !p.probe {
		return
	}
	g.mu.Lock()
	st, gen = unpack(g.state.Load())
	if gen != p.gen || st != HalfOpen {
		g.mu.Unlock()
		return
	}
	g.probesOut--
	g.probesOK++
	if g.probesOK < g.r.probes {
		g.mu.Unlock()
		return
	}
	g.closeLocked()
	g.mu.Unlock()
	g.emitState(Event{Kind: EventBreakerClosed, State: Closed})
}

// addConsec adds w to the consecutive failures, saturating (the count is
// 32 bits so that it shares a line with the fields every attempt reads, and
// a ratio-only breaker never resets it by tripping), and returns the sum.
func (g *guard) addConsec(w int64) int64 {
	for {
		o := g.consec.Load()
		n := min(int64(o)+w, math.MaxInt32)
		if g.consec.CompareAndSwap(o, int32(n)) {
			return n
		}
	}
}

// recordFailure counts a failure of p toward the breaker (err is the
// attempt's error, or ErrSlowCall), and trips it if a rule says so.
func (g *guard) recordFailure(p *Permit, now int64, err error) {
	g.mu.Lock()
	st, gen := unpack(g.state.Load())
	if gen != p.gen {
		g.mu.Unlock()
		return
	}
	trip := false
	switch st {
	case Closed:
		w := int64(1)
		if errors.Is(err, ErrAttemptTimeout) {
			w = g.r.timeoutW
		}
		n := g.addConsec(w)
		if g.r.consecutive > 0 && n >= int64(g.r.consecutive) {
			trip = true
		}
		if g.r.ratio > 0 {
			g.bucketAtLocked(now).fail.Add(1)
			if !trip && g.ratioTripped(now) {
				trip = true
			}
		}
	case HalfOpen:
		trip = p.probe
	}
	if trip && Override(g.force.Load()) == OverrideClosed {
		trip = false // forced closed: counted, never tripped (see Force)
	}
	if !trip {
		g.mu.Unlock()
		return
	}
	g.trips++
	d := g.r.openTimeout
	for i := 1; i < g.trips && d < g.r.maxOpen; i++ {
		if d > g.r.maxOpen/2 {
			d = g.r.maxOpen
			break
		}
		d *= 2
	}
	d = min(d, g.r.maxOpen)
	until := now + int64(d)
	if until < now { // an open period of centuries
		until = math.MaxInt64
	}
	g.openUntil.Store(until)
	g.openErr.Store(&OpenError{State: Open, Until: g.epoch.Add(time.Duration(now) + d), clock: g.r.clock, g: g, life: g.life.Load()})
	g.setState(Open)
	g.consec.Store(0)
	g.mu.Unlock()
	g.emitState(Event{Kind: EventBreakerOpened, State: Open, Delay: d, Err: err})
}

// clearWindow empties the rolling window. Called with mu held (or before
// the guard is shared).
func (g *guard) clearWindow() {
	for i := range g.win {
		b := &g.win[i]
		b.seq.Store(0)
		b.succ.Store(0)
		b.fail.Store(0)
	}
}

// bucketAt returns the window bucket for now, clearing it first if it holds
// an older time slice.
func (g *guard) bucketAt(now int64) *bucket {
	seq := now / g.width
	b := &g.win[seq%windowBuckets]
	if b.seq.Load() == seq+1 {
		return b
	}
	g.mu.Lock()
	b = g.bucketAtLocked(now)
	g.mu.Unlock()
	return b
}

func (g *guard) bucketAtLocked(now int64) *bucket {
	seq := now / g.width
	b := &g.win[seq%windowBuckets]
	if b.seq.Load() != seq+1 {
		b.succ.Store(0)
		b.fail.Store(0)
		b.seq.Store(seq + 1)
	}
	return b
}

// ratioTripped reports whether the rolling window trips the ratio rule.
// Called with mu held.
func (g *guard) ratioTripped(now int64) bool {
	seq := now / g.width
	var succ, fail int64
	for i := range g.win {
		b := &g.win[i]
		if s := b.seq.Load() - 1; s > seq-windowBuckets && s <= seq && s >= 0 {
			succ += b.succ.Load()
			fail += b.fail.Load()
		}
	}
	total := succ + fail
	return total >= int64(g.r.minRequests) && float64(fail) >= g.r.ratio*float64(total)
}
