package policy

import (
	"fmt"
	"math"
	"time"
)

// Override is an operator's standing decision about a breaker, set with
// [Guard.Force]: it replaces what the outcomes would decide until it is
// cleared.
type Override uint8

// Breaker overrides.
const (
	// OverrideNone: the breaker follows its outcomes (the zero value).
	OverrideNone Override = iota
	// OverrideOpen: the breaker is open and stays open, admitting no
	// probe, until the override is cleared; then its open period ends at
	// once and it admits a half-open probe, as after any open period.
	OverrideOpen
	// OverrideClosed: the breaker never opens; outcomes are still counted
	// (Stats), and retries, deadlines and the bulkhead still apply. A
	// breaker that was open or half-open closes at once.
	OverrideClosed
)

func (o Override) String() string {
	switch o {
	case OverrideNone:
		return "none"
	case OverrideOpen:
		return "open"
	case OverrideClosed:
		return "closed"
	}
	return fmt.Sprintf("Override(%d)", uint8(o))
}

// Force sets the breaker's override (OverrideNone clears it). Each change
// of state it makes is an event whose Forced is set. An open breaker held by
// OverrideOpen reports, as its RetryAfter and its OpenError's, the policy's
// MaxOpenTimeout: a caller that parks for that long asks again and is
// refused again, so none waits for ever on an override it missed being
// cleared. Force is a state of this guard's life: a guard reused by a
// [Recycler] starts without one. A guard without a breaker has nothing to
// force: Force does nothing.
func (h *Guard) Force(o Override) {
	g, sh := h.enter(draw())
	defer g.exit(sh)
	if !g.r.breaker || o > OverrideClosed {
		return
	}
	g.mu.Lock()
	prev := Override(g.force.Load())
	if prev == o {
		g.mu.Unlock()
		return
	}
	g.force.Store(uint32(o))
	now := g.now()
	var ev Event
	switch o {
	case OverrideOpen:
		g.openUntil.Store(math.MaxInt64)
		g.openErr.Store(&OpenError{State: Open, Until: g.epoch.Add(time.Duration(now) + g.r.maxOpen), clock: g.r.clock, g: g, life: g.life.Load(), forced: g.r.maxOpen})
		g.setState(Open)
		g.consec.Store(0)
		ev = Event{Kind: EventBreakerOpened, State: Open, Delay: g.r.maxOpen, Forced: true}
	case OverrideClosed:
		if st, _ := unpack(g.state.Load()); st == Closed {
			g.mu.Unlock()
			return
		}
		g.closeLocked()
		ev = Event{Kind: EventBreakerClosed, State: Closed, Forced: true}
	default: // cleared
		if prev != OverrideOpen {
			g.mu.Unlock()
			return
		}
		// The open period ends now: the next attempt is a half-open probe.
		g.openUntil.Store(now)
		g.openErr.Store(&OpenError{State: Open, Until: g.epoch.Add(time.Duration(now)), clock: g.r.clock, g: g, life: g.life.Load()})
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	g.emitState(ev)
}

// Forced returns the breaker's override.
func (h *Guard) Forced() Override {
	g, sh := h.enter(draw())
	o := Override(g.force.Load())
	g.exit(sh)
	return o
}

// Trip opens the breaker now until until (on the policy's clock), then
// lets it admit half-open probes as after any open period: a caller that
// knows the dependency is failing elsewhere (another process's breaker of
// the same key) starts this guard open instead of learning it from
// failures. It counts as a trip: a failed probe after it opens the breaker
// for twice OpenTimeout. It does nothing if until is not in the future, if
// the breaker is already open past until, if an override is set (see
// Force), or without a breaker. Its event (EventBreakerOpened) has Forced
// set.
func (h *Guard) Trip(until time.Time) {
	g, sh := h.enter(draw())
	defer g.exit(sh)
	if !g.r.breaker {
		return
	}
	g.mu.Lock()
	now := g.now()
	u := until.Sub(g.epoch)
	st, _ := unpack(g.state.Load())
	if Override(g.force.Load()) != OverrideNone || int64(u) <= now || (st == Open && g.openUntil.Load() >= int64(u)) {
		g.mu.Unlock()
		return
	}
	g.trips++
	g.openUntil.Store(int64(u))
	g.openErr.Store(&OpenError{State: Open, Until: until, clock: g.r.clock, g: g, life: g.life.Load()})
	g.setState(Open)
	g.consec.Store(0)
	g.mu.Unlock()
	g.emitState(Event{Kind: EventBreakerOpened, State: Open, Delay: time.Duration(int64(u) - now), Forced: true})
}

// closeLocked closes the breaker: a new generation, no trips, no
// consecutive failures, an empty window. Called with mu held.
func (g *guard) closeLocked() {
	g.setState(Closed)
	g.trips = 0
	g.consec.Store(0)
	g.clearWindow()
}
