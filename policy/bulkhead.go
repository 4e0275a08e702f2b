package policy

import (
	"context"
)

// The bulkhead: how many units of work of one guard may be in flight at
// once. Run enforces it itself; a two-step engine counts its own units in
// flight and asks Concurrency for the limit, so that a tenant at its limit
// waits without holding a worker.

// Concurrency returns how many units of work of this guard may be in flight
// now. The base is Bulkhead.MaxConcurrent if set, else def (the engine's
// default). Without Bulkhead.Adaptive it returns the base (def itself, even
// if zero or negative, when MaxConcurrent is zero). With it, it returns the
// gradient limit clamped to [1, base] (a base of zero or less means 1000);
// when MaxConcurrent is zero, the last def given also caps the gradient
// limit itself, so that it moves within the range the engine uses. It is a
// few atomic loads (and, on a guard of a scope with an adaptive limit and
// no MaxConcurrent, two atomic adds).
func (h *Guard) Concurrency(def int) int {
	base := h.r.maxConcurrent
	if base <= 0 {
		base = def
	}
	if !h.r.adaptive {
		return base
	}
	if base <= 0 {
		base = adaptiveMax
	}
	if h.r.maxConcurrent <= 0 && def > 0 {
		// The engine's default caps the gradient limit: note it (counted
		// in, so that a retired guard cannot write to a reused state).
		g, sh := h.enter(draw())
		if g.lat.hint.Load() != int64(def) {
			g.lat.hint.Store(int64(def))
		}
		lim := g.adaptiveLimit()
		g.exit(sh)
		return clampLimit(lim, base)
	}
	g := h.st.Load()
	lim := g.adaptiveLimit()
	if g.pool != nil && g.life.Load() != h.gen {
		return base // retired: its next call runs on a fresh state, at the cap
	}
	return clampLimit(lim, base)
}

func clampLimit(lim float64, base int) int {
	return max(1, min(base, int(lim)))
}

// Weight returns Bulkhead.Weight, or 1 if it is zero: this guard's share in
// a fair scheduler.
func (h *Guard) Weight() int { return h.r.weight }

// bulkheadLimit is the limit Run enforces: MaxConcurrent, or the gradient
// limit clamped to [1, MaxConcurrent or adaptiveMax].
func (g *guard) bulkheadLimit() int {
	c := g.r.maxConcurrent
	if !g.r.adaptive {
		return c
	}
	if c <= 0 {
		c = adaptiveMax
	}
	return clampLimit(g.adaptiveLimit(), c)
}

// runBulkhead is run under the bulkhead: it counts the unit of work in,
// refuses it at once if that takes it over the limit, and counts it out
// when it ends, panic or not.
func (g *guard) runBulkhead(ctx context.Context, fn func(context.Context) error, r uint32) error {
	lim := g.bulkheadLimit()
	if n := g.inflight.Add(1); n > int64(lim) {
		g.inflight.Add(-1)
		g.counts[r&(counterShards-1)].bulkheadFull.Add(1)
		err := &BulkheadError{Limit: lim}
		g.emit(Event{Kind: EventBulkheadFull, Err: err})
		return err
	}
	defer g.inflight.Add(-1)
	return g.run(ctx, fn, r)
}
