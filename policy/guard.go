package policy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// State is a circuit breaker state.
type State uint8

// Breaker states.
const (
	Closed   State = iota // attempts flow; failures are counted
	HalfOpen              // a bounded number of probes are admitted
	Open                  // every attempt is refused until the open period ends
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

const windowBuckets = 10

// guard is the state behind a [Guard]: breaker, budget, latency estimate.
// A state made by a [Recycler] outlives its Guard and is reused for a later
// one (see Guard.enter); any other state belongs to one Guard for good.
//
// The fields a new life starts from zero are grouped (head, counters, tail)
// so that init clears each group with one plain assignment instead of a
// locked store per field; the fields a retired Guard or an OpenError may
// still touch (pool, life, active, latency) are outside the groups.
type guard struct {
	pool *Recycler // the recycler this state returns to; nil: none
	// life counts the Guards this state has served; a Guard owns the state
	// while life equals its own number (Recycler.Retire increments it).
	life atomic.Uint64
	// state packs generation<<2 | State. Changed only under mu; read freely
	// (Guard.Closed reads it without counting in, so init stores it
	// atomically).
	state atomic.Uint64
	head
	_ cacheLinePad

	// Written on every sampled attempt.
	latency atomic.Int64 // latency estimate, ns; 0 until the first sample
	_       cacheLinePad

	// Outcome counters, written on every attempt or rejection: sharded at
	// random so that cores rarely write the same line.
	counts [counterShards]counterShard

	tail
}

// head is read on every attempt and written only when the breaker changes
// state. The padding after it keeps it off the cache lines written per
// attempt, so that a reader on another core does not miss on every call.
type head struct {
	r     *resolved   // shared by every guard of one Compiled policy
	hook  func(Event) // per-guard event hook, after the policy's OnEvent
	epoch time.Time   // origin of the nanosecond clock below (the policy's)
	width int64       // ns per window bucket

	openUntil atomic.Int64 // ns since epoch; meaningful while Open

	// openErr is the error returned while Open (one allocation per trip, so
	// that rejections allocate nothing); fullErr while HalfOpen with every
	// probe slot taken.
	openErr atomic.Pointer[OpenError]
	fullErr atomic.Pointer[OpenError] // built on first use
	samples atomic.Uint64             // latency samples taken, counted up to warmSamples
}

// tail is read on every success and written on failures and retries.
type tail struct {
	consec  atomic.Int64 // consecutive failures while Closed
	spent   atomic.Int64 // retry budget used, in thousandths of a token
	retries atomic.Uint64

	mu        sync.Mutex
	trips     int // trips since the breaker last closed (mu)
	probesOut int // half-open permits outstanding (mu)
	probesOK  int // half-open successes in this generation (mu)
	// floorEmpty is when, in ns since epoch, the retry floor was (or will
	// be, by the spends so far) empty; it accrues one retry per floorEvery
	// ns after that, up to floorCap ns' worth (mu).
	floorEmpty int64
	win        [windowBuckets]bucket
}

const counterShards = 4 // a power of two

type counterShard struct {
	counters
	// active counts the calls in progress on a recycled state (see
	// Guard.enter); always zero on a state that is never recycled.
	active atomic.Int64
	_      [128 - 32]byte
}

type counters struct {
	successes atomic.Uint64
	failures  atomic.Uint64
	rejected  atomic.Uint64
}

// cacheLinePad separates fields written by different cores (two 64-byte
// lines, for the adjacent-line prefetcher).
type cacheLinePad [128]byte

// bucket is one slice of the rolling window. seq is one more than the index
// of the time slice it counts (0: none, so that a zeroed window is empty); a
// stale bucket is cleared under mu before use.
type bucket struct {
	seq  atomic.Int64
	succ atomic.Int64
	fail atomic.Int64
}

// New validates p and builds a Guard from it. The error names the offending
// field and matches [ErrInvalidPolicy]. To build many guards of one policy,
// [Compile] it once.
func New(p Policy) (*Guard, error) {
	c, err := Compile(p)
	if err != nil {
		return nil, err
	}
	return c.New(), nil
}

// Compiled is a validated Policy from which guards are built: every guard
// of a Compiled shares one copy of the policy, so [Compiled.New] neither
// validates nor copies it, and a guard costs only its own state (about
// 1.2 KiB, one allocation). A Compiled is immutable and safe for concurrent use.
type Compiled struct{ r *resolved }

// Compile validates p and keeps a copy of it (Breaker and Budget included:
// changing them afterwards changes no guard). The error names the
// offending field and matches [ErrInvalidPolicy].
func Compile(p Policy) (*Compiled, error) {
	r, err := resolve(p)
	if err != nil {
		return nil, err
	}
	return &Compiled{r: r}, nil
}

// Policy returns a copy of the compiled Policy.
func (c *Compiled) Policy() Policy { return c.r.policy() }

// New builds a fresh guard: closed breaker, full retry budget, no latency
// estimate.
func (c *Compiled) New() *Guard { return c.NewWithEvents(nil) }

// NewWithEvents is New with a hook of this guard only: onEvent receives each
// of its events, after the policy's OnEvent. A keyed collection of guards
// uses it to tell which key an event is about.
func (c *Compiled) NewWithEvents(onEvent func(Event)) *Guard {
	// One allocation for the handle and its state.
	f := &struct {
		h Guard
		g guard
	}{}
	f.h.attach(&f.g, c.r, onEvent)
	return &f.h
}

// init makes g a fresh state of policy r: closed breaker, full budget, no
// latency estimate, zero counters, empty window. It leaves pool, life and
// the active counts alone, and is called on a state no call is using (a new
// one, or a recycled one whose active counts are zero: every call of its
// last life ended before), so the plain writes race with nothing.
func (g *guard) init(r *resolved, onEvent func(Event)) {
	g.state.Store(0)
	g.head = head{r: r, hook: onEvent, epoch: r.epoch}
	if r.breaker {
		g.width = int64(r.window) / windowBuckets
	}
	g.latency.Store(0) // an OpenError of the last life may be reading it
	for i := range g.counts {
		g.counts[i].counters = counters{}
	}
	g.tail = tail{floorEmpty: -r.floorCap} // budget and floor start full
}

func (r *resolved) policy() Policy {
	p := r.originalCopy
	if p.Breaker != nil {
		b := *p.Breaker
		p.Breaker = &b
	}
	if p.Budget != nil {
		b := *p.Budget
		p.Budget = &b
	}
	return p
}

func (g *guard) now() int64 {
	if g.r.systemClock {
		return int64(time.Since(g.epoch))
	}
	// An injected clock may be set back before the guard's birth; the
	// window index below must not go negative.
	return max(int64(g.r.clock.Now().Sub(g.epoch)), 0)
}

func unpack(s uint64) (State, uint64) { return State(s & 3), s >> 2 }

// State returns the breaker state. A breaker whose open period has ended
// reports HalfOpen. Without a breaker it is always Closed.
func (g *guard) breakerState() State {
	st, _ := unpack(g.state.Load())
	if st == Open && g.now() >= g.openUntil.Load() {
		return HalfOpen
	}
	return st
}

// RetryAfter returns how long until the breaker admits a probe: zero unless
// the breaker is open.
func (g *guard) retryAfter() time.Duration {
	st, _ := unpack(g.state.Load())
	if st != Open {
		return 0
	}
	return max(time.Duration(g.openUntil.Load()-g.now()), 0)
}

// Permit is the right to make one attempt, granted by [Guard.Allow]. Report
// the attempt's outcome exactly once with [Permit.Done], or give it back
// with [Permit.Release] if the attempt never ran: a half-open probe permit
// that is neither keeps its probe slot taken. A Permit is a small value;
// copying it is fine, but only one copy may call Done or Release. The zero
// Permit does nothing.
type Permit struct {
	g     *guard
	gen   uint64
	start int64 // ns since epoch, when timed
	timed bool  // the attempt is a latency sample
	probe bool
	shard uint8 // counter shard
	// counted: the permit came from Guard.Allow on a recycled state, and
	// Done or Release ends the call counted in by Guard.enter.
	counted bool
}

// Probe reports whether this permit is a half-open probe.
func (p Permit) Probe() bool { return p.probe }

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

// acquire fills the zero Permit *p, or refuses. It works through a pointer:
// copying a Permit of mixed-size fields by value costs store-forwarding
// stalls that showed up as a fifth of the hot path. r is a random number
// (math/rand/v2's per-thread generator: no shared write) that picks the
// counter shard and decides whether the attempt is a latency sample.
func (g *guard) acquire(p *Permit, r uint32) error {
	shard := uint8(r & (counterShards - 1))
	if !g.r.breaker {
		p.g, p.shard = g, shard
		p.start, p.timed = g.sample(r)
		return nil
	}
	st, gen := unpack(g.state.Load())
	if st == Closed {
		// The hot path: no clock read unless this attempt is a sample.
		p.g, p.gen, p.shard = g, gen, shard
		p.start, p.timed = g.sample(r)
		return nil
	}
	now := g.now()
	if st == Open && now < g.openUntil.Load() {
		g.counts[shard].rejected.Add(1)
		return g.openErr.Load()
	}
	return g.acquireSlow(p, now, shard)
}

// warmSamples is how many attempts are all timed before sampling starts,
// so that a new guard has an estimate at once.
const warmSamples = 32

// sample decides whether the attempt about to start is a latency sample and,
// if so, reads the clock. One attempt in Latency.SampleEvery is, chosen by
// the random r (its top 30 bits mapped onto [0, SampleEvery) by a multiply).
func (g *guard) sample(r uint32) (int64, bool) {
	if n := g.r.sampleEvery; n > 1 && g.samples.Load() >= warmSamples && (uint64(r>>2)*uint64(n))>>30 != 0 {
		return 0, false
	}
	return g.now(), true
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
		*p = Permit{g: g, gen: gen, start: now, timed: true, shard: shard}
		return nil
	case HalfOpen:
		if g.probesOut+g.probesOK < g.r.probes {
			g.probesOut++
			g.mu.Unlock()
			*p = Permit{g: g, gen: gen, start: now, timed: true, probe: true, shard: shard}
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

// Done reports the outcome of the attempt: nil for success, an error for a
// failure (unless the breaker excludes it). An outcome from an earlier
// breaker generation is counted in Stats but does not move the breaker.
func (p Permit) Done(err error) { p.done(err) }

func (p *Permit) done(err error) {
	if p.g == nil {
		return
	}
	p.record(err)
	if p.counted {
		p.g.exit(p.shard)
	}
}

func (p *Permit) record(err error) {
	g := p.g
	var end int64 // read only if needed: the clock is most of the hot path
	if p.timed {
		end = g.now()
		g.observe(end - p.start)
	}
	if err == nil {
		g.counts[p.shard&(counterShards-1)].successes.Add(1)
		g.earn()
		if g.r.breaker {
			g.recordSuccess(p, end)
		}
		return
	}
	if g.r.exclude(err) {
		if p.probe {
			g.mu.Lock()
			if _, gen := unpack(g.state.Load()); gen == p.gen {
				g.probesOut--
			}
			g.mu.Unlock()
		}
		return
	}
	g.counts[p.shard&(counterShards-1)].failures.Add(1)
	if g.r.breaker {
		if !p.timed {
			end = g.now()
		}
		g.recordFailure(p, end, err)
	}
}

// Release gives the permit back without an outcome: the attempt did not run
// (the engine shut down, BeforeAttempt refused). It frees a half-open probe
// slot and records nothing. Call either Done or Release, once.
func (p Permit) Release() { p.release() }

func (p *Permit) release() {
	g := p.g
	if g == nil {
		return
	}
	if p.probe {
		g.mu.Lock()
		if _, gen := unpack(g.state.Load()); gen == p.gen {
			g.probesOut--
		}
		g.mu.Unlock()
	}
	if p.counted {
		g.exit(p.shard)
	}
}

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
			if !p.timed {
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
	g.setState(Closed)
	g.trips = 0
	g.consec.Store(0)
	g.clearWindow()
	g.mu.Unlock()
	g.emitState(Event{Kind: EventBreakerClosed, State: Closed})
}

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
		n := g.consec.Add(1)
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

// earn deposits a success's share into the retry budget. It reads before it
// writes so that a full bucket (the steady state) costs no contended write.
func (g *guard) earn() {
	if !g.r.budget {
		return
	}
	for {
		t := g.spent.Load()
		if t <= 0 {
			return
		}
		if g.spent.CompareAndSwap(t, max(t-g.r.earnMilli, 0)) {
			return
		}
	}
}

// spend withdraws one token for a retry, from the bucket or else from the
// floor. It reports whether the retry may go ahead.
func (g *guard) spend() bool {
	if !g.r.budget {
		return true
	}
	for {
		t := g.spent.Load()
		if g.r.maxMilli-t < 1000 {
			break
		}
		if g.spent.CompareAndSwap(t, t+1000) {
			return true
		}
	}
	if g.r.floorPerSec == 0 {
		return false
	}
	// The floor is a virtual schedule in integer ns, so it neither drifts
	// nor loses fractions however often it is asked.
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	empty := max(g.floorEmpty, now-g.r.floorCap)
	if now-empty < g.r.floorEvery {
		return false
	}
	g.floorEmpty = empty + g.r.floorEvery
	return true
}

// observe feeds one attempt duration to the streaming quantile estimate:
// stochastic gradient descent on the pinball loss with a step proportional
// to the estimate, so it tracks any scale in O(1) memory.
func (g *guard) observe(d int64) {
	if g.samples.Load() < warmSamples {
		g.samples.Add(1)
	}
	if d <= 0 {
		d = 1
	}
	est := g.latency.Load()
	if est == 0 {
		g.latency.CompareAndSwap(0, d)
		return
	}
	step := max(est/16, 1)
	var next int64
	if d > est {
		next = est + max(int64(float64(step)*g.r.quantile), 1)
	} else if d < est {
		next = est - max(int64(float64(step)*(1-g.r.quantile)), 1)
	} else {
		return
	}
	g.latency.Store(max(next, 1))
}

// NextRetry is the retry decision of the executor, exposed for engines that
// schedule their own attempts. Given the attempt that just failed (from 1),
// its error, and the previous backoff (0 before the first retry), it returns
// the wait before the next attempt, or a non-nil error when there must be no
// retry: err itself when it is permanent or the attempts are used up, an
// [*OpenError] when the breaker will still be open after the wait (park
// rather than retry), or an [*ExhaustedError] when the budget refused. Only a
// scheduled retry spends a budget token; it emits EventRetryScheduled,
// EventRejected or EventBudgetExhausted accordingly.
func (g *guard) nextRetryPublic(attempt int, err error, prev time.Duration) (time.Duration, error) {
	d, stop := g.nextRetry(context.Background(), attempt, err, prev)
	if stop != nil {
		return 0, stop
	}
	return d, nil
}

// nextRetry decides a retry. Everything that can end the work without a retry
// is checked before a budget token is spent: a permanent error, the last
// attempt, and, for Run, a breaker that will still be open after the wait
// and a wait that would outlive ctx's deadline.
func (g *guard) nextRetry(ctx context.Context, attempt int, err error, prev time.Duration) (time.Duration, error) {
	if err == nil {
		return 0, nil
	}
	if attempt >= g.r.maxAttempts || IsPermanent(err) {
		return 0, err
	}
	d := g.r.backoffFor(attempt, err, prev)
	if g.r.breaker {
		if st, _ := unpack(g.state.Load()); st == Open && g.openUntil.Load()-g.now() > int64(d) {
			g.counts[rand.Uint32()&(counterShards-1)].rejected.Add(1)
			oe := g.openErr.Load()
			g.emit(Event{Kind: EventRejected, Attempt: attempt + 1, Err: oe})
			return 0, oe
		}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return 0, errors.Join(err, context.DeadlineExceeded) // the wait would outlive the deadline
	}
	if !g.spend() {
		g.emit(Event{Kind: EventBudgetExhausted, Attempt: attempt, Err: err})
		return 0, &ExhaustedError{Attempts: attempt, Err: err}
	}
	g.retries.Add(1)
	g.emit(Event{Kind: EventRetryScheduled, Attempt: attempt, Delay: d, Err: err})
	return d, nil
}

// Backoff returns the wait after the given failed attempt (from 1). prev is
// the previous wait, used by decorrelated jitter (0 before the first retry).
// It spends nothing.
func (r *resolved) backoffFor(attempt int, err error, prev time.Duration) time.Duration {
	b := r.backoff
	var d time.Duration
	switch b.Kind {
	case Constant:
		d = b.Base
	case Linear:
		d = b.Base * time.Duration(attempt)
		if attempt > 0 && d/time.Duration(attempt) != b.Base { // overflow
			d = b.Max
		}
	case CustomKind:
		d = b.Custom(attempt, err)
	default:
		// Decorrelated jitter: uniform in [Base, 3*prev], capped.
		if prev < b.Base {
			prev = b.Base
		}
		hi := b.Max // 3*prev, capped, without overflow
		if p := min(prev, b.Max); p <= b.Max/3 {
			hi = p * 3
		}
		d = b.Base
		if hi > b.Base {
			d += time.Duration(rand.Int64N(int64(hi - b.Base + 1)))
		}
	}
	return min(max(d, 0), b.Max)
}

// Run runs fn through the guard: Admit, then for each attempt the breaker
// permit, BeforeAttempt, the attempt (under the Deadline, if any), the
// outcome recorded, and the retry decision with budget and backoff. It
// returns nil on the first success, or the error that ended the work:
//
//   - the last attempt's error (permanent, or the attempts are used up);
//   - an [*OpenError] when the breaker refused an attempt, or opened and
//     will still be open after the backoff (no token is spent then);
//   - an [*ExhaustedError] when the retry budget refused a retry;
//   - an [*AdmitError] when Admit refused, or BeforeAttempt's error;
//   - the last attempt's error joined with ctx's error when ctx ended during
//     an attempt or a backoff (a backoff is interrupted at once), or with
//     [context.DeadlineExceeded] when the next backoff would outlive the
//     deadline.
//
// A panic in fn is recorded as a failure and re-raised.
// run is Guard.Run on state g; r is a random number for the first attempt
// (the same one Guard.Run counted the call in with, so that both write one
// counter shard's line).
func (g *guard) run(ctx context.Context, fn func(context.Context) error, r uint32) error {
	if err := g.admit(ctx); err != nil {
		return err
	}
	if g.r.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.r.deadline)
		defer cancel()
	}
	var prev time.Duration
	var last error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return errors.Join(last, err)
			}
			return err
		}
		var p Permit
		if attempt > 1 {
			r = rand.Uint32()
		}
		err := g.acquire(&p, r)
		if err != nil {
			g.emit(Event{Kind: EventRejected, Attempt: attempt, Err: err})
			return err
		}
		if g.r.before != nil {
			if err := g.r.before(ctx, attempt); err != nil {
				p.release()
				return err
			}
		}
		if g.r.hedge {
			err = g.hedged(ctx, &p, attempt, fn)
		} else {
			err = g.attempt(ctx, &p, fn)
		}
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(err, cerr) {
				return err
			}
			return errors.Join(err, cerr)
		}
		d, stop := g.nextRetry(ctx, attempt, err, prev)
		if stop != nil {
			return stop
		}
		prev, last = d, err
		if serr := sleep(ctx, d); serr != nil {
			return errors.Join(err, serr)
		}
	}
}

func (g *guard) attempt(ctx context.Context, p *Permit, fn func(context.Context) error) (err error) {
	finished := false
	defer func() {
		if finished {
			return
		}
		r := recover()
		if r == nil { // runtime.Goexit: record it and let it go on
			p.done(errGoexit)
			return
		}
		p.done(fmt.Errorf("policy: panic: %v", r))
		panic(r)
	}()
	err = fn(ctx)
	finished = true
	p.done(err)
	return err
}

// hedged runs fn and, if it is still running after the latency estimate,
// a second copy; the first success wins and the other is cancelled.
func (g *guard) hedged(ctx context.Context, p *Permit, attempt int, fn func(context.Context) error) error {
	delay := max(time.Duration(g.latency.Load()), g.r.hedgeMin)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan error, 2)
	run := func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("policy: panic: %v", r)
			}
			results <- err
		}()
		err = fn(hctx)
	}
	go run()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	running := 1
	var err error
	for {
		select {
		case err = <-results:
			running--
			if err == nil || running == 0 {
				p.done(err)
				return err
			}
		case <-timer.C:
			if running == 1 {
				g.emit(Event{Kind: EventHedgeStarted, Attempt: attempt, Delay: delay})
				running++
				go run()
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errGoexit = errors.New("policy: attempt called runtime.Goexit")

// emit sends e to OnEvent with the current state filled in. The state is
// read only when there is a hook, so a guard without one pays nothing.
func (g *guard) emit(e Event) {
	if g.r.onEvent != nil || g.hook != nil {
		e.State = g.breakerState()
		g.emitState(e)
	}
}

// emitState sends e to OnEvent and the guard's hook as given.
func (g *guard) emitState(e Event) {
	if g.r.onEvent != nil {
		g.r.onEvent(e)
	}
	if g.hook != nil {
		g.hook(e)
	}
}

// Stats is a snapshot of a guard.
type Stats struct {
	State      State
	Generation uint64
	// RetryAfter is how long until a probe is admitted (zero unless open).
	RetryAfter time.Duration
	// Successes, Failures: outcomes reported. Excluded errors
	// (context.Canceled by default, or Breaker.Exclude) are neither.
	Successes, Failures uint64
	// Rejected: attempts refused by the breaker.
	Rejected uint64
	// Retries: retries scheduled.
	Retries uint64
	// ConsecutiveFailures while closed.
	ConsecutiveFailures int
	// Tokens left in the retry budget.
	Tokens float64
	// Latency is the current estimate of the configured quantile of
	// attempt durations; zero before the first attempt.
	Latency time.Duration
}

// Stats returns a snapshot of the guard's counters and estimates.
func (g *guard) stats() Stats {
	_, gen := unpack(g.state.Load())
	var succ, fail, rej uint64
	for i := range g.counts {
		c := &g.counts[i]
		succ += c.successes.Load()
		fail += c.failures.Load()
		rej += c.rejected.Load()
	}
	return Stats{
		State:               g.breakerState(),
		Generation:          gen,
		RetryAfter:          g.retryAfter(),
		Successes:           succ,
		Failures:            fail,
		Rejected:            rej,
		Retries:             g.retries.Load(),
		ConsecutiveFailures: int(g.consec.Load()),
		Tokens:              float64(g.r.maxMilli-g.spent.Load()) / 1000,
		Latency:             time.Duration(g.latency.Load()),
	}
}
