package consumer

import (
	"fmt"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// This file is operator controls: a table of standing instructions per
// tenant (hold, quarantine, breaker override, weight, concurrency) that the
// engine applies to the tenants it has and to those it meets later, and
// the fleet's breaker seeds, applied when a tenant's guard is made.
//
// The table is an immutable map swapped atomically; each tenant holds a
// pointer to its entry (tenant.ctl), set under tmu by SetControls for the
// tenants the engine has and by tenantLocked for those it makes. The engine
// reads it once per lane scheduling (take, and moveOn when a lane keeps its
// worker), never per message: a control that changes ends the runs under
// way (Consumer.runGen), and each run's next scheduling reads it.

// Control is an operator's standing instruction for one tenant.
type Control struct {
	// Hold stops trying the tenant: its messages wait in order, as behind
	// a breaker that admits no probe, spill past the engine's bounds
	// (MaxParkedPerTenant, StuckAfter, ...) as parked messages do, and are
	// never dead-lettered for it. None is lost. Attempts under way when it
	// is set finish.
	Hold bool
	// Quarantine sends the tenant's messages straight to its spill log,
	// with no attempt (spill reason quarantine), and re-feeds nothing until
	// it is cleared. Without a SpillLog it is Hold.
	Quarantine bool
	// Breaker overrides the tenant's breaker (see policy.Guard.Force); a
	// policy without a breaker has nothing to override.
	Breaker BreakerOverride
	// Weight, if > 0, overrides the policy's fair-share weight
	// (Bulkhead.Weight).
	Weight int
	// Concurrency, if > 0, overrides the tenant's bulkhead limit
	// (TenantConcurrency or Bulkhead.MaxConcurrent), up to Concurrency.
	Concurrency int
	// By and Reason say who set it and why; shown, never interpreted.
	By, Reason string
	// At is when it was set.
	At time.Time
}

// stops reports whether the control stops the tenant's attempts.
func (ct *Control) stops() bool { return ct != nil && (ct.Hold || ct.Quarantine) }

// BreakerOverride is a Control's override of a tenant's breaker.
type BreakerOverride uint8

// Breaker overrides.
const (
	// BreakerAuto: the breaker follows its outcomes (the zero value).
	BreakerAuto BreakerOverride = iota
	// BreakerForceOpen: the breaker is open and admits no probe until the
	// override is cleared; then it admits a half-open probe at once.
	BreakerForceOpen
	// BreakerForceClosed: the breaker never opens; retries, deadlines and
	// the bulkhead still apply.
	BreakerForceClosed
)

func (b BreakerOverride) String() string {
	switch b {
	case BreakerAuto:
		return "auto"
	case BreakerForceOpen:
		return "open"
	case BreakerForceClosed:
		return "closed"
	}
	return fmt.Sprintf("BreakerOverride(%d)", uint8(b))
}

// ParseBreakerOverride parses what String returns ("" is auto).
func ParseBreakerOverride(s string) (BreakerOverride, error) {
	switch s {
	case "auto", "":
		return BreakerAuto, nil
	case "open":
		return BreakerForceOpen, nil
	case "closed":
		return BreakerForceClosed, nil
	}
	return 0, fmt.Errorf("consumer: breaker override %q: want auto, open or closed", s)
}

// MarshalText implements encoding.TextMarshaler.
func (b BreakerOverride) MarshalText() ([]byte, error) {
	if b > BreakerForceClosed {
		return nil, fmt.Errorf("consumer: invalid breaker override %d", uint8(b))
	}
	return []byte(b.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *BreakerOverride) UnmarshalText(text []byte) error {
	v, err := ParseBreakerOverride(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// policyOverride maps a control's breaker override to the guard's.
func policyOverride(ct *Control) policy.Override {
	if ct == nil {
		return policy.OverrideNone
	}
	switch ct.Breaker {
	case BreakerForceOpen:
		return policy.OverrideOpen
	case BreakerForceClosed:
		return policy.OverrideClosed
	}
	return policy.OverrideNone
}

// controlTable is the operators' table: immutable once published.
type controlTable map[string]*Control

// SetControls replaces the whole table of controls (the engine keeps its
// own copy); tenants absent from m have none. It is applied at once to the
// tenants in the engine (a Hold or Quarantine stops new attempts of the
// tenant before SetControls returns; attempts under way finish, and a
// release wakes its lanes and re-feeds what it spilled), and to tenants
// met later before their first attempt. It never waits for a handler and
// calls no user code but OnEvent (EventControlSet, EventControlCleared,
// and the guards' events of a breaker override), with no lock held. Safe
// for concurrent use.
func (c *Consumer) SetControls(m map[string]Control) {
	tab := make(controlTable, len(m))
	for k, v := range m {
		tab[k] = &v
	}
	// ctlMu keeps the table and the tenants' entries in step; applying
	// them (and the events) comes after, unlocked, so that an OnEvent may
	// call SetControls: each application reads the tenant's entry then,
	// so applications out of order still end on the current one.
	c.ctlMu.Lock()
	old := c.ctls.Swap(&tab)
	var changed []string
	var ev []Event
	if old != nil {
		for k, o := range *old {
			if n, ok := tab[k]; !ok || *n != *o {
				changed = append(changed, k)
			}
			if _, ok := tab[k]; !ok {
				ev = append(ev, Event{Kind: EventControlCleared, Tenant: k})
			}
		}
	}
	for k, n := range tab {
		var o *Control
		if old != nil {
			o = (*old)[k]
		}
		if o == nil {
			changed = append(changed, k)
		}
		if o == nil || *o != *n {
			ev = append(ev, Event{Kind: EventControlSet, Tenant: k})
		}
	}
	var ts []*tenant
	c.tmu.Lock()
	for _, k := range changed {
		if t := c.tenants.get(k, keyHash(k)); t != nil {
			t.ctl.Store(tab[k])
			ts = append(ts, t)
		}
	}
	c.tmu.Unlock()
	// Runs under way end at their next message and schedule again, which
	// reads the new controls (see runOn).
	if len(ts) > 0 {
		c.runGen.Add(2)
	}
	c.ctlMu.Unlock()
	for _, t := range ts {
		c.applyControl(t, &ev)
	}
	for i := range ev {
		c.emit(ev[i])
	}
}

// Controls returns a copy of the table of controls.
func (c *Consumer) Controls() map[string]Control {
	tab := c.ctls.Load()
	if tab == nil {
		return map[string]Control{}
	}
	out := make(map[string]Control, len(*tab))
	for k, v := range *tab {
		out[k] = *v
	}
	return out
}

// controlOf returns key's control in the current table, or nil. Called
// under tmu by tenantLocked, so that SetControls, which swaps the table
// before it takes tmu, finds every tenant made with the old one.
func (c *Consumer) controlOf(key string) *Control {
	if tab := c.ctls.Load(); tab != nil {
		return (*tab)[key]
	}
	return nil
}

// applyControl applies t's control, just changed, to its guard and lanes.
// Called with no lock held; events for the caller to emit go to ev.
func (c *Consumer) applyControl(t *tenant, ev *[]Event) {
	if g := t.peekGuard(); g != nil {
		c.forceGuard(t, g)
	}
	var spills []*lane
	h := keyHash(t.key)
	for _, sh := range c.shards() {
		sh.mu.Lock()
		if l := sh.lanes.get(t.key, h); l != nil && l.t == t && !sh.dead && !l.dead {
			ct := t.ctl.Load()
			if ct.stops() {
				// Held again if held already: a Hold turned Quarantine
				// spills now.
				if l.state != laneRunning && l.q.len()+l.pend.len() > 0 {
					c.holdLane(l, ct, ev)
				}
			} else {
				c.releaseLane(l)
			}
			if l.spill.on && !ct.stops() {
				spills = append(spills, l)
			}
		}
		sh.mu.Unlock()
	}
	for _, l := range spills {
		c.queueSpill(l)
	}
	if t.nblocked.Load() > 0 {
		c.unblock(t)
	}
}

// forceGuard makes g's breaker override t's control's. It reads the
// control again after applying it: SetControls and the guard's maker (see
// guard) may apply one each at once, and the last applied must be the
// current one. Called with no lock held.
func (c *Consumer) forceGuard(t *tenant, g *policy.Guard) {
	if g == c.fallback {
		return // shared by every tenant whose Shape panicked
	}
	for {
		ct := t.ctl.Load()
		if o := policyOverride(ct); g.Forced() != o {
			g.Force(o)
		}
		if t.ctl.Load() == ct {
			return
		}
	}
}

// holdLane stops l, not running, because of its tenant's Hold or
// Quarantine ct: it waits (state laneHeld) with its messages counted as
// parked, so that the parking bounds spill it; a quarantined lane spills
// at once. Called with l's shard mu held.
func (c *Consumer) holdLane(l *lane, ct *Control, ev *[]Event) {
	if l.state == laneTimer {
		c.disarm(l)
	}
	l.state = laneHeld
	l.shared = true // the ready queue or a blocked list may still list it
	if !l.parked {
		l.parked, l.holdPark = true, true
		c.addParked(l, l.q.len())
	}
	switch {
	case ct.Quarantine && c.spillable(l) && !l.spill.on:
		l.spill.reason = SpillQuarantine
		c.enterSpill(l, ev)
	case l.spill.want:
		c.enterSpill(l, ev)
	}
	c.recount(l)
}

// releaseLane resumes l after its tenant's control stopped stopping it, or
// changed otherwise: a held lane runs again at once, and a lane parked
// behind its breaker asks it again now (an override may have been
// cleared). Called with l's shard mu held.
func (c *Consumer) releaseLane(l *lane) {
	switch l.state {
	case laneHeld:
		l.state = laneIdle
		if l.holdPark {
			l.holdPark = false
			c.unparkLane(l)
		}
		if l.q.len() > 0 && !c.draining.Load() {
			c.makeReady(l)
		}
		c.recount(l)
	case laneTimer:
		if l.parked {
			c.disarm(l)
			if l.q.len() > 0 && !c.draining.Load() {
				c.makeReady(l)
			}
		}
	}
}

// SetBreakerSeeds gives the engine the fleet's last view of tenants'
// breakers: for each tenant, the time until which its breaker is open
// elsewhere. It replaces the whole table. A seed applies only when the
// engine makes a tenant's guard (on first sight, or for a tenant that
// comes back after it was forgotten, as when its partition is assigned
// again), and only if that guard's breaker is closed with no outcome
// recorded yet: a seed in the future then opens it until then
// (policy.Guard.Trip): no attempt before the seed, then one half-open
// probe. A guard the engine has already made is left alone (see
// TripBreakers). Safe for concurrent use.
func (c *Consumer) SetBreakerSeeds(m map[string]time.Time) {
	tab := make(map[string]time.Time, len(m))
	for k, v := range m {
		tab[k] = v
	}
	c.seeds.Store(&tab)
}

// seedOf returns the fleet's breaker seed for key, if it has one.
func (c *Consumer) seedOf(key string) (until time.Time, ok bool) {
	if tab := c.seeds.Load(); tab != nil {
		until, ok = (*tab)[key]
	}
	return until, ok
}

// seedGuard trips g, t's guard just made, if the fleet's seed for t is in
// the future and g has seen nothing yet. Called with no lock held.
func (c *Consumer) seedGuard(t *tenant, g *policy.Guard) {
	if g == c.fallback {
		return
	}
	until, ok := c.seedOf(t.key)
	if !ok || !g.Closed() { // Trip ignores a time past on the policy's clock
		return
	}
	if st := g.Stats(); st.Successes+st.Failures+st.Rejected > 0 {
		return
	}
	g.Trip(until)
}

// TripBreakers opens, until its time, the breaker of each tenant of m
// whose guard the engine has made and that is closed, or open until an
// earlier time (policy.Guard.Trip; a half-open breaker, already probing,
// and a forced one are left alone). A tenant the engine has not made a
// guard for is skipped (SetBreakerSeeds covers it). Attempts under way
// finish; the tenant's next attempt waits for the breaker. It returns how
// many breakers it opened or kept open longer. It calls no user code but
// OnEvent (the guards' events), with no lock held. Safe for concurrent
// use.
func (c *Consumer) TripBreakers(m map[string]time.Time) int {
	type trip struct {
		g     *policy.Guard
		until time.Time
	}
	trips := make([]trip, 0, len(m))
	c.tmu.Lock()
	for k, until := range m {
		if t := c.tenants.get(k, keyHash(k)); t != nil {
			if g := t.peekGuard(); g != nil && g != c.fallback {
				trips = append(trips, trip{g, until})
			}
		}
	}
	c.tmu.Unlock()
	n := 0
	for _, tr := range trips {
		if tr.g.State() == policy.HalfOpen {
			continue
		}
		before := tr.g.RetryAfter()
		tr.g.Trip(tr.until)
		if tr.g.RetryAfter() > before {
			n++
		}
	}
	return n
}
