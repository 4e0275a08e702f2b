package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
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

// guard is the state behind a [Guard]: breaker, budget, latency estimate,
// bulkhead. A state made by a [Recycler] outlives its Guard and is reused
// for a later one (see Guard.enter); any other state belongs to one Guard
// for good.
//
// The fields a new life starts from zero are grouped (head, counters, tail)
// so that init clears each group with one plain assignment instead of a
// locked store per field; the fields a retired Guard or an OpenError may
// still read without counting in (pool, life, state, lat) are outside the
// groups and reset with atomic stores.
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

	// Written on sampled attempts only (latency.go); and inflight, the
	// units of work in Run, written twice per Run when the bulkhead is on.
	// Neither is on the closed-breaker success path of a guard without a
	// bulkhead, so they share a line rather than add one to every guard.
	lat      latencyState
	inflight atomic.Int64
	_        cacheLinePad

	// Outcome counters, written on every attempt or rejection: sharded at
	// random so that cores rarely write the same line.
	counts [counterShards]counterShard

	tail
}

// head is read on every attempt and written only when the breaker changes
// state (and slowAt, when the slow-call threshold moves by an eighth), and
// consec and spent on failures and retries. The padding after it keeps it
// off the cache lines written per attempt, so that a reader on another
// core does not miss on every call. The fields a closed breaker's success
// reads come first, after pool, life and state: 56 bytes at the start of
// the allocation, one cache line whether the allocator puts the object at
// a line's start or 8 bytes in (its header, for an object of this size).
// With 1000 tenants each attempt finds its guard cold: one line for these
// instead of three (consec and spent had a line of their own) took about a
// miss off every message (see the engine benchmark).
type head struct {
	r       *resolved     // shared by every guard of one Compiled policy
	samples atomic.Uint32 // latency samples taken, counted up to warmSamples
	consec  atomic.Int32  // consecutive failures while Closed (saturating)
	// slowAt is the slow-call threshold in ns: a successful attempt that
	// took longer is a failure to the breaker. math.MaxInt64 while there is
	// none (slow calls off, or a derived threshold still warming up).
	slowAt atomic.Int64
	spent  atomic.Int64 // retry budget used, in thousandths of a token
	width  int64        // ns per window bucket
	epoch  time.Time    // origin of the nanosecond clock below (the policy's)
	hook   func(Event)  // per-guard event hook, after the policy's OnEvent

	openUntil atomic.Int64 // ns since epoch; meaningful while Open

	// openErr is the error returned while Open (one allocation per trip, so
	// that rejections allocate nothing); fullErr while HalfOpen with every
	// probe slot taken.
	openErr atomic.Pointer[OpenError]
	fullErr atomic.Pointer[OpenError] // built on first use

	// actx is the last attempt ctx made, for the next attempts to share:
	// read by every attempt under an AttemptTimeout, written when one needs
	// a new ctx. Here rather than in tail so that the state's pointers stay
	// in its first lines, which is all the GC scans of it.
	actx atomic.Pointer[attemptCtx]
}

// tail is written on failures and retries and read by them.
type tail struct {
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
	// force is the breaker's Override (see Force): written under mu, read
	// without it by retryAfter.
	force atomic.Uint32
}

const counterShards = 4 // a power of two

// A call counts on the counter shard of its goroutine: a shard picked from
// the address of the goroutine's stack, mixed with shardSalt, so that
// goroutines on different cores calling one guard keep writing lines of
// their own. (A shard drawn at random per call would have both cores
// write every shard's line in turn, most writes a transfer of the line from
// the other core: the parallel rows of bench/policy guard this.) Two
// goroutines that draw the same shard and keep calling at the same time
// find it out within a few collisionEvery calls: such a call counts by
// compare-and-swap (countOn), and one that fails (the other goroutine
// wrote the line meanwhile) moves the salt, which moves every goroutine to
// another shard. The other calls add plainly, which costs a serial caller
// less. Which shard a call counts on is otherwise immaterial: every reader
// sums the shards.
var shardSalt struct {
	_ [64]byte
	v atomic.Uint32
	_ [60]byte
}

// collisionEvery: one call in collisionEvery (a power of two) checks its
// count for a collision (see shardSalt), chosen by the bits of its random
// number above the shard's (checks).
const collisionEvery = 64

// checks reports whether the call whose random number is r counts by
// compare-and-swap.
func checks(r uint32) bool { return r>>2&(collisionEvery-1) == 0 }

// shardChecked marks a Permit's shard (Permit.shard) as one whose success
// checks for a collision.
const shardChecked = 0x80

// draw returns a random number for a call (whether its attempt is a
// latency sample, see begin, and whether it checks for a collision, see
// checks) whose low bits, r&(counterShards-1), are the calling goroutine's
// counter shard.
func draw() uint32 {
	return rand.Uint32()&^(counterShards-1) | goroutineShard(shardSalt.v.Load())
}

// goroutineShard picks a shard from the address of the calling goroutine's
// stack and salt: stable for a goroutine while the salt is, different
// across goroutines, and free to compute.
func goroutineShard(salt uint32) uint32 {
	p := uint64(uintptr(unsafe.Pointer(&salt)))>>10 ^ uint64(salt) // salt is on the stack
	return uint32(p * 0x9E3779B97F4A7C15 >> 62)                    // top 2 bits: 4 shards
}

// shardCount is a counter of a shard: its outcome counts (atomic.Uint64)
// and its count of calls in progress (atomic.Int64).
type shardCount[T int64 | uint64] interface {
	Load() T
	CompareAndSwap(old, new T) bool
	Add(delta T) T
}

// countOn adds 1 to a counter of the caller's shard; if another goroutine
// wrote it meanwhile, it moves the salt (see shardSalt).
func countOn[T int64 | uint64, C shardCount[T]](c C) {
	if n := c.Load(); !c.CompareAndSwap(n, n+1) {
		collided()
		c.Add(1)
	}
}

// collided moves the salt: two goroutines counted on one shard at once.
func collided() { shardSalt.v.Add(1) }

type counterShard struct {
	// The lead pad puts active and successes at 16 bytes past a line (see
	// TestGuardLayout), so that they share one whether the allocator puts
	// the guard at a line's start or 8 bytes in.
	_ [32]byte
	// active counts the calls in progress on a recycled state (see
	// Guard.enter); always zero on a state that is never recycled. It comes
	// right before successes, the other field every success writes.
	active atomic.Int64
	counters
	_ [128 - 32 - 48]byte
}

type counters struct {
	successes    atomic.Uint64
	failures     atomic.Uint64
	rejected     atomic.Uint64
	slow         atomic.Uint64 // successes the breaker counted as failures
	bulkheadFull atomic.Uint64 // Run refusals by the bulkhead
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
// 1.2 KiB, one allocation). A Compiled is immutable and safe for concurrent
// use.
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
		g guard // first: see head
		h Guard
	}{}
	f.h.attach(&f.g, c.r, onEvent)
	return &f.h
}

// init makes g a fresh state of policy r: closed breaker, full budget, no
// latency estimate, zero counters, empty window. It leaves pool, life and
// the active counts alone, and is called on a state no call is using (a new
// one, or a recycled one whose active counts are zero: every call of its
// last life ended before), so the plain writes race with nothing; the
// fields read without counting in are stored atomically.
func (g *guard) init(r *resolved, onEvent func(Event)) {
	// state is read without counting in (Guard.Closed), so it is stored
	// atomically, first, while its line is warm from Retire. Every other
	// field is written plainly and the one atomic store that follows them
	// (slowAt's) is the only wait for their lines (which warm has loaded,
	// for a recycled state): an atomic store is a full barrier on amd64,
	// and one after each cold line would wait for each miss in turn, which
	// is most of a recycled key's first lookup.
	g.state.Store(0)
	g.head = head{r: r, hook: onEvent, epoch: r.epoch} // actx too: a ctx of another life is not to share
	if r.breaker {
		g.width = int64(r.window) / windowBuckets
	}
	g.lat = latencyState{}
	g.inflight = atomic.Int64{}
	for i := range g.counts {
		g.counts[i].counters = counters{}
	}
	g.tail = tail{floorEmpty: -r.floorCap} // budget and floor start full
	g.slowAt.Store(r.slowFixed)
}

// warm loads a word of each line init writes, before a recycled state is
// initialised (Recycler.take). Such a state is cold by the time a new key
// takes it (its key was evicted for not being seen), and stores leave the
// store buffer in order, each waiting for its line: these loads, which do
// not wait for each other, fetch every line at once, so that init's stores
// find them in cache. BenchmarkChurn's miss-p50-ns measures it.
func (g *guard) warm() {
	g.state.Load()
	g.actx.Load()
	g.lat.est.Load()
	for i := range g.counts {
		g.counts[i].active.Load()
		g.counts[i].bulkheadFull.Load()
	}
	g.retries.Load()
	for i := range g.win {
		g.win[i].seq.Load()
	}
	g.force.Load()
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

// now is the policy's clock in ns since the guard's epoch.
func (g *guard) now() int64 {
	if g.r.systemClock {
		return int64(time.Since(g.epoch))
	}
	// An injected clock may be set back before the guard's birth; the
	// window index must not go negative.
	return max(int64(g.r.clock.Now().Sub(g.epoch)), 0)
}

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
	// (context.Canceled by default, or Breaker.Exclude) are neither. A slow
	// call is a success here (the work succeeded) and in SlowCalls. A
	// permanent error is a failure here even where the breaker does not
	// count it (Breaker.CountPermanent).
	Successes, Failures uint64
	// SlowCalls: successes slower than the slow-call threshold, which the
	// breaker counted as failures.
	SlowCalls uint64
	// SlowThreshold is the slow-call threshold now; zero when slow calls are
	// off or a derived threshold is still warming up.
	SlowThreshold time.Duration
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
	// InFlight: units of work in Run now, counted only when Run enforces a
	// bulkhead (Bulkhead.MaxConcurrent or Adaptive set).
	InFlight int
	// BulkheadFull: units of work Run refused because InFlight was at the
	// limit.
	BulkheadFull uint64
	// AdaptiveLimit is the gradient concurrency limit (Bulkhead.Adaptive)
	// before [Guard.Concurrency] clamps it; zero when not adaptive.
	AdaptiveLimit int
}

// stats returns a snapshot of the guard's counters and estimates.
func (g *guard) stats() Stats {
	_, gen := unpack(g.state.Load())
	var succ, fail, rej, slow, full uint64
	for i := range g.counts {
		c := &g.counts[i]
		succ += c.successes.Load()
		fail += c.failures.Load()
		rej += c.rejected.Load()
		slow += c.slow.Load()
		full += c.bulkheadFull.Load()
	}
	var thr time.Duration
	if t := g.slowAt.Load(); t != math.MaxInt64 {
		thr = time.Duration(t)
	}
	var limit int
	if g.r.adaptive {
		limit = int(g.adaptiveLimit())
	}
	return Stats{
		State:               g.breakerState(),
		Generation:          gen,
		RetryAfter:          g.retryAfter(),
		Successes:           succ,
		Failures:            fail,
		SlowCalls:           slow,
		SlowThreshold:       thr,
		Rejected:            rej,
		Retries:             g.retries.Load(),
		ConsecutiveFailures: int(g.consec.Load()),
		Tokens:              float64(g.r.maxMilli-g.spent.Load()) / 1000,
		Latency:             time.Duration(g.lat.est.Load()),
		InFlight:            int(g.inflight.Load()),
		BulkheadFull:        full,
		AdaptiveLimit:       limit,
	}
}
