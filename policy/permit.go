package policy

import (
	"context"
	"time"
)

// Permit is the right to make one attempt, granted by [Guard.Allow]. Report
// the attempt's outcome with [Permit.Done], or give it back with
// [Permit.Release] if the attempt never ran: a half-open probe permit that
// is neither keeps its probe slot taken.
//
// Done and Release end the permit they are called on and zero it, so that a
// second call (Done after Done, Release after Done, ...) does nothing. That
// holds per Permit variable: a copy made before the first call is a second
// permit to the same attempt, and ending both counts the attempt twice (and
// on a guard of a scope lets its state be reused while the attempt runs).
// Keep one Permit and pass a pointer to it. The zero Permit does nothing.
type Permit struct {
	g     *guard
	gen   uint64
	start int64 // when the attempt started, read as clock says
	timed bool  // the attempt is a latency sample (clock is clockExact)
	probe bool
	clock uint8 // how start was read: clockNone, clockExact, clockCoarse
	shard uint8 // counter shard, and shardChecked
	// counted: the permit came from Guard.Allow on a recycled state, and
	// Done or Release ends the call counted in by Guard.enter.
	counted bool
	// batch: the permit came from Batch.Allow, which counts its successes.
	batch *Batch
}

// How a Permit's start was read.
const (
	clockNone   = iota // not read: the attempt is neither sampled nor checked for slowness
	clockExact         // guard.now(): ns since the guard's epoch
	clockCoarse        // coarseNow(): ns since coarseBase
)

// Probe reports whether this permit is a half-open probe. It is false once
// the permit has ended.
func (p *Permit) Probe() bool { return p.probe }

// Allow is the first step of two-step use: it asks the Admit hook and the
// breaker whether an attempt may start now, without running anything. On
// refusal the error is an [*AdmitError] or an [*OpenError] whose RetryAfter
// says how long until a probe is admitted. Allow does not enforce the
// bulkhead: an engine counts its own units in flight and asks
// [Guard.Concurrency] for the limit.
//
// The attempt is timed from Allow to Done (for the latency estimate and the
// slow-call check): call Allow when the attempt is about to start, not
// before it waits for a worker, or the wait counts as slowness.
func (h *Guard) Allow(ctx context.Context) (Permit, error) {
	var p Permit
	err := h.AllowTo(ctx, &p)
	return p, err
}

// AllowTo is [Guard.Allow] writing the permit to *p, which must hold no
// live permit (see [Batch.AllowTo]). On refusal *p is the zero Permit.
func (h *Guard) AllowTo(ctx context.Context, p *Permit) error {
	*p = Permit{}
	r := draw()
	g, sh := h.enter(r)
	if err := g.allow(ctx, p, r); err != nil {
		g.exit(sh)
		*p = Permit{}
		return err
	}
	// The permit's shard is r's, the same as sh on a recycled state.
	p.counted = g.pool != nil
	return nil
}

// Batch is a run of attempts on one guard by one goroutine, for an engine
// that makes many in a row (the consumer steps a tenant's queued messages
// one after another): [Guard.Batch] counts the caller in on the guard's
// state once, where [Guard.Allow] counts in and out per attempt on a guard
// from a [Recycler], and the batch adds up its successes and writes them to
// the guard's counters once, at [Batch.End]. That is three locked writes
// fewer per attempt on a guard from a Recycler, one on another guard; what
// an attempt decides and records (the breaker, the budget, the latency
// estimate, failures and rejections) is unchanged and seen at once.
//
// Until End, [Guard.Stats] does not count the batch's successes, and a
// guard retired during the batch (a scope evicting its key) keeps serving
// the batch's attempts from its old state, which is not reused before End;
// the guard's next call after End moves to a fresh state as usual. End the
// permits of a batch before the batch. A Batch in use must not be copied
// (its permits point to it) or shared between goroutines. The zero Batch
// is ended.
type Batch struct {
	g         *guard
	shard     uint8 // the counter shard of the batch's attempts (see draw)
	successes uint64
	// rnd draws each attempt's random bits (whether it is a latency
	// sample) by xorshift, seeded with the draw the batch started with,
	// cheaper than a draw from the runtime's generator per attempt.
	rnd uint32
}

// Batch starts a batch of attempts on h; see [Batch].
func (h *Guard) Batch() Batch {
	r := draw()
	g, sh := h.enter(r) // counted in on a recycled state, as Guard.Allow
	return Batch{g: g, shard: sh, rnd: r | 1}
}

// Allow is [Guard.Allow] for an attempt of the batch. On an ended batch
// it returns [ErrBatchEnded].
func (b *Batch) Allow(ctx context.Context) (Permit, error) {
	var p Permit
	err := b.AllowTo(ctx, &p)
	return p, err
}

// AllowTo is [Batch.Allow] writing the permit to *p, which must hold no
// live permit, for an engine that keeps the permit in place: a Permit
// returned by value is copied at each return on the way to where it is
// kept, a measurable share of a consumer's step (BenchmarkEngine). On refusal
// *p is the zero Permit.
func (b *Batch) AllowTo(ctx context.Context, p *Permit) error {
	*p = Permit{}
	if b.g == nil {
		return ErrBatchEnded
	}
	x := b.rnd // xorshift32: never 0 from a seed that is not
	x ^= x << 13
	x ^= x >> 17
	x ^= x << 5
	b.rnd = x
	// The attempt counts on the batch's shard (its failures; its success
	// is counted by End).
	if err := b.g.allow(ctx, p, x&^(counterShards-1)|uint32(b.shard)); err != nil {
		*p = Permit{}
		return err
	}
	p.batch = b
	return nil
}

// End writes the batch's successes to the guard's counters and counts the
// caller out. A second End does nothing.
func (b *Batch) End() {
	g := b.g
	if g == nil {
		return
	}
	if b.successes > 0 {
		g.counts[b.shard].successes.Add(b.successes)
	}
	g.exit(b.shard) // counts out of a recycled state; nothing on another
	*b = Batch{}
}

// allow asks Admit and the breaker for a permit, filling the zero *p.
func (g *guard) allow(ctx context.Context, p *Permit, r uint32) error {
	if err := g.admit(ctx); err != nil {
		return err
	}
	err := g.acquire(p, r)
	if err != nil {
		g.emit(Event{Kind: EventRejected, Err: err})
	}
	return err
}

func (g *guard) admit(ctx context.Context) error {
	if g.r.admit == nil {
		return nil
	}
	if err := g.r.admit(ctx); err != nil {
		g.emit(Event{Kind: EventAdmitRefused, Err: err})
		return &AdmitError{Err: err}
	}
	return nil
}

// Done reports the outcome of the attempt: nil for success, an error for a
// failure (unless the breaker excludes it; an error marked [Permanent] is a
// failure in Stats but not to the breaker, see Breaker.CountPermanent). A
// success slower than the slow-call threshold is a failure to the breaker
// (see [SlowCall]). An outcome from an earlier breaker generation is
// counted in Stats but does not move the breaker. Done zeroes the permit: a
// second call does nothing.
func (p *Permit) Done(err error) {
	g := p.g
	if g == nil {
		return
	}
	p.g = nil // a hook below that ends p again does nothing
	p.record(g, err)
	if p.counted {
		g.exit(p.shard)
	}
	*p = Permit{}
}

// Restart times the permit's attempt from now, for an engine that makes
// several attempts under one permit (the consumer's judge tries a suspect
// message and those behind it under one probe): the outcome reported by
// Done is then timed as the last of them, not as all of them together,
// which could look like one slow call. It does nothing on an ended permit.
func (p *Permit) Restart() {
	g := p.g
	if g == nil || p.clock == clockNone {
		return
	}
	if p.clock == clockCoarse {
		if v, fresh := coarseNow(); fresh {
			p.start = v
			return
		}
		p.timed = false
	}
	p.start, p.clock = g.now(), clockExact
}

// Release gives the permit back without an outcome: the attempt did not run
// (the engine shut down, BeforeAttempt refused). It frees a half-open probe
// slot and records nothing. Release zeroes the permit: a second call, or a
// Done after it, does nothing.
func (p *Permit) Release() {
	g := p.g
	if g == nil {
		return
	}
	p.g = nil
	if p.probe {
		g.releaseProbe(p)
	}
	if p.counted {
		g.exit(p.shard)
	}
	*p = Permit{}
}

// record counts the outcome of p's attempt on g: latency sample, slow-call
// check, counters, budget and breaker.
func (p *Permit) record(g *guard, err error) {
	end, d := int64(-1), int64(-1) // the exact end and the duration, if read
	// The threshold in force when the attempt ended: the sample below may
	// move it.
	slowAt := g.slowAt.Load() // math.MaxInt64 when slow calls are off
	// own: a permanent failure, the work's own fault (see
	// Breaker.CountPermanent): it says nothing of the dependency, neither
	// to the breaker nor of its latency (a message that fails to parse in
	// a microsecond would drag the estimate of a 2ms dependency down).
	own := err != nil && !g.r.countPermanent && IsPermanent(err)
	if p.clock == clockCoarse {
		d = coarse.now.Load() - p.start // begin marked the clock used
	} else if p.clock == clockExact {
		end = g.now()
		d = end - p.start
		if p.timed && !own {
			g.observe(d, end, err == nil)
		}
	}
	if err == nil {
		if d > slowAt {
			g.slowCall(p, d, end)
			return
		}
		if p.batch != nil {
			p.batch.successes++
		} else {
			c := &g.counts[p.shard&(counterShards-1)].successes
			if p.shard&shardChecked != 0 {
				countOn[uint64](c)
			} else {
				c.Add(1)
			}
		}
		g.earn()
		if g.r.breaker {
			g.recordSuccess(p, end)
		}
		return
	}
	if g.r.exclude(err) {
		if p.probe {
			g.releaseProbe(p)
		}
		return
	}
	g.counts[p.shard&(counterShards-1)].failures.Add(1)
	if g.r.breaker {
		if own {
			if p.probe {
				g.releaseProbe(p)
			}
			return
		}
		if end < 0 {
			end = g.now()
		}
		g.recordFailure(p, end, err)
	}
}

// slowCall records a success that took d, longer than the slow-call
// threshold: a success to the caller and in Stats, a failure to the breaker
// (so it earns no retry token either).
func (g *guard) slowCall(p *Permit, d, end int64) {
	sh := &g.counts[p.shard&(counterShards-1)]
	sh.successes.Add(1)
	sh.slow.Add(1)
	g.emit(Event{Kind: EventSlowCall, Delay: time.Duration(d), Err: ErrSlowCall})
	if end < 0 {
		end = g.now()
	}
	g.recordFailure(p, end, ErrSlowCall)
}
