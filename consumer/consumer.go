package consumer

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Consumer runs messages from a Source through per-tenant guards. It is
// safe for concurrent use; Run may be called once.
//
// Locking (see also Config's "Callbacks and locks"): each partition's shard
// has its own mu, which guards its lanes, their queues and scheduling
// state, and its watermark; a message's delivery, scheduling and settle take
// only that lock. tmu guards the tenant table (taken when a lane appears or
// leaves); sched.mu the ring of shards with ready lanes (taken when a shard
// runs out of ready lanes or gets its first); pmu the partition table; the
// spill queue has its own. Lock order: shard.mu, then tmu, sched.mu,
// tenant.bmu or the spill queue's mu (leaves). No lock is held across a
// call of user code or a Source, SpillLog or DLQ method.
type Consumer struct {
	cfg      Config
	scope    *scope.Scope[string]
	fallback *policy.Guard // used when the scope's Shape panics
	// lone runs a tenant's first message, its lane's only one, while the
	// engine tracks more than one and a half times MaxIdleTenants tenants
	// (see loneOK): a guard of the scope's template that never records an
	// outcome. Nil where the scope shapes keys or the template has an
	// Admit hook (whose refusal is an event of the key's own guard).
	lone *policy.Guard
	log  *slog.Logger
	src  Source
	tr   *tracer // nil: no tracing
	// settleNoop: src's Settle does nothing (SettleNooper), so the engine
	// never calls it.
	settleNoop bool
	// quickWorkers is how many workers on a shard's quick lanes are
	// enough: GOMAXPROCS, one fewer on a shard fed one message at a time
	// (see shard.quickMax, runQuick).
	quickWorkers int
	epoch        time.Time
	epochNano    int64            // epoch.UnixNano(), to put produce times on the engine clock (bornOf)
	wall         func() time.Time // the wall clock read by housekeeping; nil: time.Now (tests set it)
	now          atomic.Int64     // engine clock: ns since epoch, advanced by housekeeping

	hctx    context.Context // parent of handler contexts; cancelled past DrainTimeout
	hcancel context.CancelFunc
	// hdone is set once hctx is cancelled: a call's begin loads it rather
	// than asking hctx.Err() (an atomic.Value load and a type check a
	// message; BenchmarkEngine at one tenant guards this).
	hdone    atomic.Bool
	bg       context.Context // for Source, spill and DLQ calls; cancelled when Run returns
	bgCancel context.CancelFunc

	pmu     sync.Mutex
	parts   atomic.Pointer[partTable] // copy on write under pmu (setParts)
	partGen uint64                    // pmu

	maxIdle int // Config.MaxIdleTenants, also each partition's bound on lanes (see laneBound)

	// The tenant table, guarded by tmu: the tenants the engine tracks,
	// those of them that are idle (see idleList) and how many it forgot.
	// On lines of its own: with many tenants, tmu is taken for every
	// message, on both cores, and a line it shared with parts or maxIdle,
	// which every delivery reads, would be a miss for each read
	// (TestConsumerLayout).
	_         [64]byte
	tmu       sync.Mutex
	tenants   keyTable[*tenant]
	noTenant  *tenant
	idle      idleList
	forgotten uint64
	// goneDwell holds the dwell counts of forgotten tenants, so that
	// Stats' Totals.Dwell covers every settle since New.
	goneDwell    [len(dwellBounds) + 1]uint64
	goneDwellSum int64
	// ntenants is len(tenants), readable without tmu (see overTracked),
	// which every lane that goes idle reads: on a line of its own, away
	// from tmu's, which the table's lock traffic takes from core to core.
	_        [64]byte
	ntenants atomic.Int64
	_        [56]byte

	sched   sched
	spillQ  spillQueue
	workers []*worker
	// workerList publishes workers to Stats, which may run before Run.
	workerList atomic.Pointer[[]*worker]

	running  atomic.Bool
	draining atomic.Bool
	// runGen ends the workers' runs (see runOn): bit 0 is set when the
	// engine drains, and SetControls adds 2, so that a run's next message
	// is stepped only under the controls its lane was scheduled with.
	runGen atomic.Uint64

	// Operators' controls and the fleet's breaker seeds (controls.go):
	// tables swapped whole. ctlMu orders SetControls' swaps and its
	// stores of the tenants' entries; it is taken before tmu.
	ctlMu sync.Mutex
	ctls  atomic.Pointer[controlTable]
	seeds atomic.Pointer[map[string]time.Time]

	parkedTotal atomic.Int64
	stats       counters
}

// counters are totals, kept per worker (and engine-wide for what other
// goroutines count), summed by Stats. The padding keeps two workers'
// counters off one cache line.
type counters struct {
	handled, failed, dead, retried, panics atomic.Uint64
	spilled, refed, spillFails, duplicates atomic.Uint64
	unwritable, dlqFails                   atomic.Uint64
	_                                      [64]byte
}

// New validates cfg and builds a Consumer.
func New(cfg Config) (*Consumer, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg:      cfg,
		scope:    cfg.Scope,
		log:      cfg.Logger,
		epoch:    time.Now(),
		noTenant: &tenant{none: true},
		tr:       newTracer(cfg),
	}
	c.epochNano = c.epoch.UnixNano()
	if c.scope == nil {
		c.scope = scope.New(policy.Default(), scope.Options[string]{})
	}
	c.fallback, err = policy.New(policy.Default())
	if err != nil {
		return nil, err
	}
	c.noTenant.once.Do(func() {}) // the bucket runs no guard
	if tmpl, uniform := c.scope.Template(); uniform && tmpl.Policy().Admit == nil {
		c.lone = tmpl.New()
	}
	c.maxIdle = orInt(cfg.MaxIdleTenants, c.scope.MaxKeys())
	c.quickWorkers = runtime.GOMAXPROCS(0)
	c.setParts(map[Partition]*shard{})
	c.spillQ.cond = sync.NewCond(&c.spillQ.mu)
	hctx, hcancel := context.WithCancel(context.Background())
	c.hctx = hctx
	c.hcancel = func() {
		hcancel()
		c.hdone.Store(true) // after: a begin that sees it finds hctx.Err() set
	}
	c.bg, c.bgCancel = context.WithCancel(context.Background())
	return c, nil
}

// Scope returns the consumer's tenant scope.
func (c *Consumer) Scope() *scope.Scope[string] { return c.scope }

// clock is the engine clock (ns since epoch), at housekeeping resolution.
func (c *Consumer) clock() int64 { return c.now.Load() }

// tick is the housekeeping period: the resolution of attempt timeouts and
// of the engine clock.
const tick = 5 * time.Millisecond

// Run feeds src's messages through the engine until ctx is cancelled or the
// source fails, then drains: it pauses every partition, lets in-flight
// handlers finish (up to DrainTimeout), settles and commits what finished,
// stops the source and returns. Messages still queued, parked or waiting to
// be spilled are left unsettled, to be redelivered. It returns nil after a
// shutdown through ctx, or the source's error.
func (c *Consumer) Run(ctx context.Context, src Source) error {
	if src == nil || isNilValue(src) {
		return errors.New("consumer: Run needs a Source")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	c.src = src
	if c.tr != nil {
		c.tr.setSource(src)
	}
	if n, ok := src.(SettleNooper); ok && n.SettleIsNoop() {
		c.settleNoop = true
	}
	c.now.Store(c.sinceEpoch())
	defer c.hcancel()
	defer c.bgCancel()

	var workers sync.WaitGroup
	c.workers = make([]*worker, c.cfg.Concurrency)
	for i := range c.workers {
		c.workers[i] = newWorker(c)
	}
	c.workerList.Store(&c.workers)
	for _, w := range c.workers {
		workers.Go(func() { c.work(w) })
	}
	hkDone := make(chan struct{})
	hkStop := make(chan struct{})
	go func() { defer close(hkDone); c.housekeeping(hkStop) }()

	var spillers sync.WaitGroup
	if c.cfg.Spill != nil {
		for range spillWorkers {
			spillers.Go(c.spillLoop)
		}
	}

	srcCtx, stopSrc := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSrc()
	srcDone := make(chan error, 1)
	go func() { srcDone <- src.Run(srcCtx, c) }()

	var srcErr error
	stopped := false
	select {
	case <-ctx.Done():
	case srcErr = <-srcDone:
		stopped = true
	}

	// Drain: no new work; in-flight handlers and spill appends finish (up
	// to DrainTimeout); then the source stops.
	c.draining.Store(true)
	c.runGen.Or(1)
	for _, sh := range c.shards() {
		c.requestPause(sh, PauseDraining)
	}
	c.sched.shutdown()
	c.spillQ.shutdown()
	drained := make(chan struct{})
	go func() { workers.Wait(); spillers.Wait(); close(drained) }()
	timer := time.NewTimer(c.cfg.DrainTimeout)
	select {
	case <-drained:
	case <-timer.C:
		c.log.Warn("consumer: drain timeout; cancelling in-flight handlers", "timeout", c.cfg.DrainTimeout)
		c.hcancel()
		for _, w := range c.workers {
			w.ctx().cancel(context.Canceled)
		}
		<-drained
	}
	timer.Stop()
	// The drain is over: end what still waits on hctx, such as the source's
	// Assigned callback retrying a spill log's Pending (recoverSpills), so
	// the source's Run can return: a spill log that is down while a
	// partition is assigned would hold Run after cancel for ever.
	c.hcancel()
	close(hkStop)
	<-hkDone
	for _, sh := range c.shards() {
		c.commitShard(sh, c.clock(), true)
	}
	if c.tr != nil {
		for _, sh := range c.shards() {
			sh.mu.Lock()
			open := c.openSpans(sh)
			sh.mu.Unlock()
			for _, m := range open {
				traceDropped(m, "shutdown")
			}
		}
	}

	stopSrc()
	if !stopped {
		srcErr = <-srcDone
	}
	if errors.Is(srcErr, context.Canceled) && ctx.Err() != nil {
		srcErr = nil
	}
	return srcErr
}

// housekeeping advances the engine clock, ends handler calls past their
// deadline, spills tenants whose messages are stuck, and sweeps idle lanes
// (and so tenants, see sweepLanes), until stop is closed.
func (c *Consumer) housekeeping(stop <-chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	var slow int
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := c.sinceEpoch()
		c.now.Store(now)
		for _, w := range c.workers {
			w.ctx().expireIfDue(now)
		}
		c.sched.rescue()
		// Commits are found and go out here, every tick, not per settled
		// message: a source commits on its own interval anyway, and a
		// Commit per message would put a shared line and a call on the
		// hot path, as would keeping the unsettled offsets in order (see
		// shard.refreshCommit).
		for _, sh := range c.parts.Load().m {
			c.commitShard(sh, now, false)
			if sh.sweep.due.Load() {
				c.sweepTick(sh)
			}
		}
		if slow++; slow%20 == 0 { // every 100ms
			for _, sh := range c.shards() {
				c.maintain(sh, now)
			}
		}
	}
}

// shards returns the current partition table's shards.
func (c *Consumer) shards() []*shard {
	m := c.parts.Load().m
	out := make([]*shard, 0, len(m))
	for _, sh := range m {
		out = append(out, sh)
	}
	return out
}

// partTable is the assigned partitions' shards. few holds them too when
// there are at most fewParts, for shardOf to compare with instead of
// hashing a Partition (a string and an ID) on a NATS delivery's path, one
// lookup per message; nil when there are more.
type partTable struct {
	m   map[Partition]*shard
	few []*shard
}

// fewParts is how many partitions shardOf finds by comparing.
const fewParts = 8

// setParts makes m the partition table. Called under pmu (or before Run).
func (c *Consumer) setParts(m map[Partition]*shard) {
	t := &partTable{m: m}
	if len(m) <= fewParts {
		t.few = make([]*shard, 0, len(m))
		for _, sh := range m {
			t.few = append(t.few, sh)
		}
	}
	c.parts.Store(t)
}

// shardOf returns p's shard, making it if p was never announced.
func (c *Consumer) shardOf(p Partition) *shard {
	if t := c.parts.Load(); t.few != nil {
		for _, sh := range t.few {
			if sh.p.ID == p.ID && sh.p.Topic == p.Topic {
				return sh
			}
		}
	} else if sh := t.m[p]; sh != nil {
		return sh
	}
	sh, _ := c.assign(p)
	return sh
}

// assign makes p's shard if it has none and reports whether it made it.
func (c *Consumer) assign(p Partition) (*shard, bool) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	old := c.parts.Load().m
	if sh := old[p]; sh != nil {
		return sh, false
	}
	c.partGen++
	maxQ := c.cfg.MaxQueuedPerPartition
	if pc, ok := c.src.(PartitionCapacity); ok {
		if n := pc.MaxUnsettled(p); n > 0 && n < maxQ {
			maxQ = max(n-1, 1)
		}
	}
	sh := newShard(c, p, c.partGen, maxQ)
	m := make(map[Partition]*shard, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[p] = sh
	c.setParts(m)
	return sh, true
}

// Assigned implements Dispatcher.
func (c *Consumer) Assigned(p Partition) {
	sh, made := c.assign(p)
	if !made {
		return
	}
	if c.draining.Load() {
		c.requestPause(sh, PauseDraining)
	}
	if c.cfg.Spill != nil {
		c.recoverSpills(sh)
	}
	c.emit(Event{Kind: EventAssigned, Partition: p})
}

// Revoked implements Dispatcher.
func (c *Consumer) Revoked(p Partition) {
	c.pmu.Lock()
	old := c.parts.Load().m
	sh := old[p]
	if sh == nil {
		c.pmu.Unlock()
		return
	}
	m := make(map[Partition]*shard, len(old))
	for k, v := range old {
		if k != p {
			m[k] = v
		}
	}
	c.setParts(m)

	// Still under pmu, so that the invariant checker never sees the shard
	// gone while its lanes still count.
	var forget []*tenant
	var open []*Message
	sh.mu.Lock()
	if c.tr != nil {
		open = c.openSpans(sh)
	}
	sh.refreshCommit(c.clock(), true) // the source commits it as Revoked returns
	sh.dead = true
	for l := range sh.lanes.all() {
		forget = append(forget, c.dropLane(l))
	}
	if sh.none != nil {
		c.dropLane(sh.none)
	}
	for _, t := range sh.released {
		forget = append(forget, c.releaseTenant(t))
	}
	sh.released = nil
	sh.lanes.reset()
	sh.sweep.q.reset()
	sh.sweep.skip = 0
	forget = append(forget, sh.takeForgotten()...)
	sh.sweep.due.Store(false)
	sh.none = nil
	sh.aside.msgs = nil
	sh.ready.reset()
	sh.commit.unsettled, sh.commit.oldestAt, sh.commit.stale, sh.commit.late = 0, -1, false, nil
	sh.count.queued = 0
	sh.count.quickQueued, sh.count.aheadLanes = 0, 0
	if sh.inRing {
		c.sched.leave(sh)
	}
	sh.mu.Unlock()
	c.pmu.Unlock()

	// No Settle, Commit or SpillLog call for p after Revoked returns.
	c.syncCommit(sh)
	sh.gate.close()
	sh.spills.close()
	for _, w := range c.workers {
		for w.settling.Load() == sh {
			yield()
		}
	}
	sh.commit.src.stop()
	if sh.pause.src.stop() && !c.draining.Load() {
		// The pause was the engine's, for state it just dropped.
		c.src.Resume(p)
	}
	for _, t := range forget {
		c.unpin(t)
	}
	for _, m := range open {
		traceDropped(m, "revoked")
	}
	c.emit(Event{Kind: EventRevoked, Partition: p})
}

// dropLane forgets a lane of a revoked partition and releases its tenant.
// Called with sh.mu held; returns the tenant this forgot, if any, whose
// pin must be released (unpin).
func (c *Consumer) dropLane(l *lane) *tenant {
	c.unhook(l)
	return c.releaseTenant(l.t)
}

// unhook forgets a lane (its partition was revoked, or the lane retired),
// but for the release of its tenant, which the caller makes under the lock
// it holds (releaseTenant, releaseLocked). Called with sh.mu held.
func (c *Consumer) unhook(l *lane) {
	l.dead = true
	if l.state == laneRunning && !l.t.none {
		l.t.zombies.Add(1)
	}
	l.timerSeq++
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.parked {
		c.addParked(l, -l.q.len())
	}
	if l.spill.on {
		l.t.spillLanes.Add(-1)
	}
	l.q.reset()
	l.pend.reset()
	l.spill.refed.reset()
	l.spill.commit.stopped.Store(true)
	c.recount(l)
}

// yield waits a little while another goroutine finishes a call (a Settle,
// Commit or Pause in progress); these waits happen on revocation and
// shutdown only.
func yield() { time.Sleep(50 * time.Microsecond) }

// maintain is housekeeping for one shard, every 100ms: it spills the tenant
// of a message that holds the partition's commit for longer than
// StuckAfter, retries set-aside dead letters that are due, and lifts a
// pause whose pressure is gone.
func (c *Consumer) maintain(sh *shard, now int64) {
	var ev []Event
	var aside []*Message
	resume := false
	sh.mu.Lock()
	if sh.dead {
		sh.mu.Unlock()
		return
	}
	if c.cfg.Spill != nil && sh.commit.unsettled > 0 {
		if h := sh.oldest(); h != nil && now-c.stuckSince(h) > int64(c.cfg.StuckAfter) && !h.st.spilled && !h.st.aside {
			if l := h.st.lane; !l.spill.on && !l.spill.want {
				c.requestSpill(l, decideStuckSpill(l.t.dlqDownAt.Load() != 0), &ev)
			}
		}
	}
	if len(sh.aside.msgs) > 0 && !sh.aside.busy.Load() {
		for _, m := range sh.aside.msgs {
			if now-m.st.rd().asideAt >= int64(asideRetry) {
				m.st.wr().asideAt = now
				aside = append(aside, m)
			}
		}
		if len(aside) > 0 {
			sh.aside.busy.Store(true)
		}
	}
	switch {
	case (sh.pause.reason == PauseQueueFull || sh.pause.reason == PauseSpillUnavailable || sh.pause.reason == PauseParkedBound || sh.pause.reason == PauseReadAhead) && c.pressureGone(sh):
		c.setPause(sh, 0)
		resume = true
	case sh.pause.reason == PauseReadAhead && now-sh.pause.at >= int64(aheadStall):
		// Its quick lanes stopped moving (their calls hang, or the lanes
		// wait for workers held elsewhere): holding the partition back
		// helps no one, so it reads on, up to its other bounds, until
		// the count is down to half.
		sh.pause.aheadOff = true
		c.setPause(sh, 0)
		resume = true
	}
	sh.mu.Unlock()
	if resume {
		c.syncPause(sh)
	}
	if len(aside) > 0 {
		go c.retryAside(sh, aside)
	}
	for i := range ev {
		c.emit(ev[i])
	}
}
