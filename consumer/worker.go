package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// shardTurn is how many jobs a worker takes from one shard before it lets
// the scheduler pick the next shard: fairness across partitions without a
// trip through the scheduler's lock per message. A job is one message, or
// a whole run of a quick tenant's lane (at most quickTurn by its estimate),
// so a worker's turn on a shard lasts about shardTurn handler calls or
// shardTurn quick turns.
const shardTurn = 16

// maxJudgeSpan caps how many following messages one judge round tries.
const maxJudgeSpan = 64

// worker is one of Config.Concurrency goroutines that run lanes. Its
// fields are its own; cur is read by housekeeping (to end calls past their
// deadline).
type worker struct {
	c   *Consumer
	cur atomic.Pointer[callCtx]
	// n are this worker's counters, summed by Stats: per worker so that
	// workers on two cores never write one line per message.
	n counters
	// settling is the shard this worker is calling Source.Settle for, if
	// any: Revoked waits for it (see settleSource).
	settling atomic.Pointer[shard]
	job      job
	res      stepResult
	turn     int // jobs taken from the current shard
	// batch is the worker's run of attempts on batchG, ended before the
	// run's finish (see allow).
	batch  policy.Batch
	batchG *policy.Guard
	// A quick run's handled messages are counted (runHandled) and those
	// of a source whose Settle does something (unsettled) settled when the
	// run ends (see handled).
	runHandled uint64
	unsettled  []*Message
	// callOpen: the worker's context is still in the call begun for a
	// message of the job's quick run, kept open for the run's next call
	// (see call) and ended by endCall when the run ends. Between the
	// run's calls the worker counts as in a call (Stats.InFlight), and an
	// expiry then (the run stalled for a whole AttemptTimeout) marks the
	// context dirty, so the next call begins a fresh one.
	callOpen bool
	// callAt is when the last call began (engine clock): the round's start
	// of a fresh message, written to its state only if the call fails.
	callAt int64

	// Deferred until the shard lock is released.
	events  []Event
	recheck []*tenant // tenants whose blocked lanes may run now
	resume  *shard    // shard whose pause may end
	spills  []*lane   // lanes whose spill job must be queued
	chain   int       // lanes still ready when this worker took one
	zombie  *tenant   // tenant of a dropped lane whose job ended: it may be idle now
	forgot  []*tenant // tenants forgotten as their lanes were released (see release): their pins to release
	// searching: woken from the scheduler's wait and not yet holding a
	// lane (see sched). Only this worker reads or writes it.
	searching bool
	// quickOn: w's job is on a quick lane, counted in its shard's quick.
	quickOn  bool
	quickGen uint64 // the shard's quickGen when w was counted
	// enough: the lane w took last is quick and its shard has enough
	// workers on quick lanes: w wakes no other (see runQuick).
	enough bool
	// wake is where the scheduler signals this worker while it is idle
	// (see sched.signal); one signal at most is ever pending.
	wake chan *shard
}

// job is one step of one lane: its head message and, for a judge round, the
// messages behind it.
type job struct {
	l  *lane
	sh *shard
	// t and quick are l.t and l.quick, copied when the job is loaded: the
	// steps read them for every message, and the lane's lines are the ones
	// DeliverBatch writes for every message it queues (q, and rq while the
	// lane counts against read-ahead), so that each read from the lane was
	// a miss on a line the other core had just written. Neither changes
	// while the job runs (take sets quick, under the lock, before load).
	t     *tenant
	quick bool
	m     *Message
	judge dlq.Reason
	span  []*Message
	// confirm are up to as many messages again behind span: a suspect head
	// that failed its last attempt after a winner is dead-lettered only once
	// one of the messages behind the winner succeeds after that failure
	// (see confirm in step.go).
	confirm []*Message
	// run are the messages behind m that the worker may step next without
	// taking the shard's lock in between (see runOn).
	run  []*Message
	next int // how many of run were stepped (the next to step)
	// turns is how many of the run's messages the lane's fair share
	// allows while other lanes of the shard are ready.
	turns int
	// gen is Consumer.runGen when the job was loaded: the run ends when it
	// moves (the engine drains, or the controls changed).
	gen uint64
	// lone: m is its lane's only message and fresh (see loneOK).
	lone bool
	// fresh: no message of the lane had been tried when the job was
	// loaded (lane.tried clear), so none of m and run has a failure state,
	// an attempt or a round begun: the steps read nothing of their states
	// (a line the delivering core wrote last; BenchmarkEngine guards
	// this). Only the messages the job steps get tried, each
	// after it was stepped, so it holds for the rest of the job.
	fresh bool
}

// runMax caps a lane's messages stepped between two visits to the shard's
// lock (a run): one finish then settles them all. A quick tenant's turn is
// bounded in time by its credit (about quickTurn, see creditOf), so the
// cap only matters for calls well under a microsecond, where a longer run
// pays for the lock and finish over more messages (BenchmarkEngine at 1
// tenant guards this).
const runMax = 64

// stepResult is what a step did, applied to the lane by finish under the
// shard's lock.
type stepResult struct {
	settled []*Message    // settled (handled or dead-lettered), to take out of the lane
	aside   *Message      // the head, set aside: its dead letter cannot be written
	wait    time.Duration // > 0: the lane waits this long before its next step
	park    bool          // the wait is a park (the breaker refused or opened)
	unpark  bool          // the breaker gave a permit: the lane is not parked any more
	suspect dlq.Reason    // the head becomes suspect
	cleared bool          // a judge round found no evidence: clear the judge, widen its span
	// handled counts the messages of the job's tenant this step (or run)
	// handled: added to the tenant's counter once, in finish, rather than
	// per message on a line that every worker of the tenant writes (the
	// engine's total, per worker, counts each at once, or a quick run's
	// when the run ends: see handled).
	handled uint64
}

func newWorker(c *Consumer) *worker {
	w := &worker{c: c, wake: make(chan *shard, 1)}
	w.cur.Store(newCallCtx(c))
	return w
}

func (w *worker) ctx() *callCtx { return w.cur.Load() }

// allow asks g for a permit through the worker's batch on g, starting one
// if the worker has none on g: the messages of a run share one, which
// spares the guard three locked writes an attempt (see policy.Batch).
// The permit is written to *p (policy's AllowTo: no copies of it on the
// way).
func (w *worker) allow(ctx context.Context, g *policy.Guard, p *policy.Permit) error {
	if w.batchG == nil && len(w.job.run) == 0 {
		return g.AllowTo(ctx, p) // a step alone: a batch would only add to it
	}
	if w.batchG != g {
		w.batch.End()
		w.batch, w.batchG = g.Batch(), g
	}
	return w.batch.AllowTo(ctx, p)
}

// endCall ends the call a quick run kept open, if any (see callOpen).
func (w *worker) endCall() {
	if !w.callOpen {
		return
	}
	w.callOpen = false
	w.closeCall(w.ctx())
}

// closeCall ends the call on ctx, the worker's context, and replaces it if
// a handler observed it (see callCtx).
func (w *worker) closeCall(ctx *callCtx) {
	if !ctx.end() {
		w.cur.Store(newCallCtx(w.c))
	}
}

// endBatch ends the worker's batch, if any: before the run's finish, so
// that the guard's counters and its state's reuse never wait for an idle
// worker.
func (w *worker) endBatch() {
	w.batch.End()
	w.batchG = nil
}

// work is a worker goroutine: it takes ready lanes from shards in turn and
// steps them, until the engine drains.
func (c *Consumer) work(w *worker) {
	var sh *shard
	rest := false
	for {
		if sh == nil {
			if sh = c.sched.next(w, rest); sh == nil {
				return
			}
			w.turn = 0
		}
		sh.mu.Lock()
		// A shard with enough workers on its quick lanes needs no more
		// (see runQuick): w waits until a signal instead.
		rest = c.quickFull(sh)
		has := !rest && !c.draining.Load() && c.take(sh, w)
		sh.mu.Unlock()
		if has {
			c.sched.stopSearching(w, sh) // and wakes the next if lanes are ready
		}
		w.flush()
		ran := has
		for has {
			c.step(w)
			for w.runOn() {
				c.stepHead(w)
			}
			w.endCall()
			w.endBatch()
			c.settleRun(w)
			sh.mu.Lock()
			has = c.finish(sh, w)
			if n := len(sh.released); n > 0 && (!has || n >= releaseBatch) {
				w.release(sh)
			}
			sh.mu.Unlock()
			w.flush()
		}
		if ran {
			w.forget()
		}
		sh = nil
	}
}

// forget drops w's references to the messages of its last job, as it
// leaves the shard (it may go idle next): the run's settled list (reused
// from its start, never cleared) and the job's. Kept, they would stay
// reachable while the worker idles, up to about two runs of settled
// messages a worker outside every bound the engine counts, each pinning
// its value
// (TestSettledMessagesAreNotKept). Once per visit to a shard that gave w a
// job, not per message.
func (w *worker) forget() {
	clear(w.res.settled[:cap(w.res.settled)])
	w.res.settled = w.res.settled[:0]
	w.res.aside = nil
	w.job.dropMessages()
	w.job.t = nil
}

// dropMessages empties j's run, judge span and confirmers and forgets its
// head.
func (j *job) dropMessages() {
	clear(j.span)
	clear(j.confirm)
	clear(j.run)
	j.span, j.confirm, j.run = j.span[:0], j.confirm[:0], j.run[:0]
	j.m = nil
}

// take pops the next lane of sh that may run and loads its head into w.job.
// Called with sh.mu held. A lane whose tenant is at its bulkhead limit is
// parked in the tenant's blocked list and skipped; a shard with no ready
// lane leaves the scheduler's ring.
func (c *Consumer) take(sh *shard, w *worker) bool {
	gen := c.runGen.Load() // before the controls (see runOn)
	for sh.ready.len() > 0 {
		l := sh.ready.pop()
		if l.dead || l.state != laneReady {
			continue
		}
		if l.q.len() == 0 {
			l.state = laneIdle
			continue
		}
		l.t.prefetch()
		ct := l.t.ctl.Load()
		if ct.stops() {
			c.holdLane(l, ct, &w.events)
			continue
		}
		if !l.t.none && !l.t.tryAcquire(c.limitWith(l.t, ct)) {
			l.state = laneBlocked
			l.shared = true
			l.t.block(l)
			w.recheck = append(w.recheck, l.t)
			continue
		}
		l.state = laneRunning
		if l.credit <= 0 {
			l.credit, l.quick = c.creditOf(l.t, ct)
		}
		w.load(l, gen)
		w.chain = sh.ready.len() // lanes still ready behind it
		sh.takes++
		if w.enough = c.runQuick(sh, w, l); w.enough {
			w.chain = 0
		}
		w.turn++
		return true
	}
	if sh.inRing {
		c.sched.leave(sh)
	}
	return false
}

// load points w.job at l's head; gen is Consumer.runGen, read before the
// lane's control was. Called with l's shard lock held.
func (w *worker) load(l *lane, gen uint64) {
	j := &w.job
	j.dropMessages()
	j.l, j.sh, j.m, j.judge, j.next, j.gen = l, l.sh, l.q.front(), l.judge, 0, gen
	if j.t != l.t {
		j.t = l.t // stored only on a change: a pointer store pays the write barrier while the collector marks
	}
	j.quick = l.quick
	j.fresh = l.judge == "" && !l.t.none && !l.tried.Load()
	j.lone = j.fresh && l.q.len() == 1
	if l.judge != "" {
		n := min(l.judgeSpan, l.q.len()-1)
		for i := 1; i <= n; i++ {
			j.span = append(j.span, l.q.at(i))
		}
		for i := n + 1; i <= min(2*n, l.q.len()-1); i++ {
			j.confirm = append(j.confirm, l.q.at(i))
		}
		return
	}
	// A run takes at most the worker's turns on the shard, and past the
	// lane's fair share only while no other lane of the shard is ready.
	n := min(l.q.len()-1, runMax-1)
	if !l.quick {
		n = min(n, shardTurn-1-w.turn)
	}
	j.turns = l.credit - 1
	if l.sh.ready.len() > 0 {
		n = min(n, j.turns)
	} else if l.sh.readyHint.Load() {
		l.sh.readyHint.Store(false)
	}
	for i := 1; i <= n; i++ {
		j.run = append(j.run, l.q.at(i))
	}
}

// runOn moves w.job to the next message of its run, if the step just made
// settled its message and asked nothing of the lane (no wait, park,
// suspicion or set-aside), the engine is not draining nor the partition
// revoked, and the controls did not change since the job was loaded (a
// Hold set meanwhile stops the run before its next message: runGen's load
// replaces the load of draining, so the controls cost a run nothing more
// than a compare). The messages stay in their lane's queue (only this
// worker takes from its front) until finish removes the settled ones.
func (w *worker) runOn() bool {
	j, r := &w.job, &w.res
	if j.next == len(j.run) || len(r.settled) == 0 || r.settled[len(r.settled)-1] != j.m ||
		r.wait != 0 || r.park || r.suspect != "" || r.cleared || r.aside != nil ||
		w.c.runGen.Load() != j.gen || j.gen&1 != 0 || j.sh.gate.closed.Load() ||
		j.next >= j.turns && j.sh.readyHint.Load() {
		return false
	}
	j.m = j.run[j.next]
	j.next++
	return true
}

// finish applies w.res to the lane of w.job and loads the next job: the same
// lane if it keeps its turn, or the next ready lane of sh. Called with sh.mu
// held; it reports whether w.job holds a new job.
func (c *Consumer) finish(sh *shard, w *worker) bool {
	j, r := &w.job, &w.res
	l, t := j.l, j.l.t
	if w.quickOn {
		if w.quickGen == sh.quickGen {
			sh.quick--
		}
		w.quickOn = false
	}
	if q := quickNow(t); l.quickNow != q || l.ahead != q || sh.quickPrior != q { // stores only on a change: see removeSettled
		l.quickNow, l.ahead, sh.quickPrior = q, q, q
	}
	if r.handled > 0 {
		t.handled.Add(r.handled)
		t.clearOpen()
	}
	if l.dead {
		if !t.none {
			t.zombies.Add(-1)
			w.zombie = t
		}
		c.releaseSlot(w, t)
		return false
	}
	if !l.quick {
		w.turn += j.next // a quick lane's run is one job (see shardTurn)
	}
	c.applyResult(sh, w)
	return c.moveOn(sh, w)
}

// applyResult applies w.res to the live lane of w.job: it takes out the
// settled messages, sets the head aside, parks or unparks the lane, marks
// or clears its suspect head, and notes what flush must do for it. Called
// by finish with sh.mu held.
func (c *Consumer) applyResult(sh *shard, w *worker) {
	r := &w.res
	l, t := w.job.l, w.job.l.t
	if len(r.settled) > 0 {
		var d dwellRun
		now := c.clock()
		for _, m := range r.settled {
			d.add(c, &t.dwell, m, now)
			c.removeSettled(sh, l, m)
		}
		d.flush(&t.dwell)
	}
	if l.q.len() == 0 && l.tried.Load() {
		l.tried.Store(false) // what q gains next is fresh
	}
	if r.aside != nil {
		c.setAside(sh, l, r.aside)
	}
	if r.unpark && l.parked {
		c.unparkLane(l)
		w.events = append(w.events, Event{Kind: EventResumed, Tenant: l.key, Partition: sh.p})
	}
	if r.suspect != "" {
		l.judge = r.suspect
		l.judgeSpan = max(l.judgeSpan, 1)
	}
	if r.cleared {
		l.judge = ""
		l.judgeSpan = min(2*max(l.judgeSpan, 1), maxJudgeSpan)
	}
	if r.park && !l.parked {
		c.parkLane(l)
		w.events = append(w.events, Event{Kind: EventParked, Tenant: l.key, Partition: sh.p, Delay: r.wait})
	}
	if l.parked && !l.spill.on && (t.parked.Load() >= int64(sh.bounds.maxParkedTenant) || c.parkedTotal.Load() >= int64(c.cfg.MaxParked)) && c.spillable(l) {
		l.spill.want, l.spill.reason = true, SpillParked
	}
	if sh.pause.reason != 0 && sh.pause.reason != PauseDraining && c.pressureGone(sh) {
		w.resume = sh
	}
	if l.spill.on && !l.spill.job && (l.q.len() < max(c.cfg.RefeedWindow/2, 1) || l.judge != "") && c.refeedRoom(l) > 0 {
		w.spills = append(w.spills, l)
	}
	c.recount(l)
}

// moveOn decides what the lane of w.job does next (idle, spilling, waiting,
// ready, or kept by w for another run) and, unless w keeps it, releases its
// bulkhead slot and takes the next ready lane of sh. Called by finish with
// sh.mu held, after applyResult; it reports whether w.job holds a new job.
func (c *Consumer) moveOn(sh *shard, w *worker) bool {
	j, r := &w.job, &w.res
	l, t := j.l, j.l.t
	gen := c.runGen.Load() // before the controls (see runOn)
	ct := t.ctl.Load()
	switch {
	case c.draining.Load():
		l.state = laneIdle
	case ct.stops() && (l.q.len() > 0 || l.spill.want):
		l.state = laneIdle
		c.holdLane(l, ct, &w.events)
	case l.spill.want:
		l.state = laneIdle
		c.enterSpill(l, &w.events)
		if l.state == laneIdle && r.wait > 0 && l.q.len() > 0 {
			c.arm(l, r.wait) // re-fed messages keep their wait
		}
	case r.wait > 0:
		c.arm(l, r.wait)
	case l.q.len() > 0:
		l.credit -= 1 + j.next
		if (l.credit > 0 || sh.ready.len() == 0) && w.turn < shardTurn && t.inflight.Load() <= c.limitWith(t, ct) {
			// Keep the lane (and its bulkhead slot).
			w.load(l, gen)
			c.runQuick(sh, w, l)
			w.turn++
			return true
		}
		c.makeReady(l)
	default:
		l.state = laneIdle
	}
	c.releaseSlot(w, t)
	if !t.none && l.state == laneIdle && l.hits <= 1 && (sh.lanes.len() > c.laneBound() || c.overTracked()) && l.idle() {
		c.retire(sh, l)
		sh.released = append(sh.released, t)
	}
	if c.draining.Load() || w.turn >= shardTurn {
		return false
	}
	return c.take(sh, w)
}

// runQuick counts w in sh's workers on quick lanes if l is one (its
// tenant's calls took under quickTurn/2 by its guard's estimate when the
// lane last finished a job, see quickNow), and reports whether there are
// enough of them (GOMAXPROCS, see quickFull): a worker that took a quick
// lane then wakes no other for the lanes still ready, and a worker that
// comes to sh waits instead of taking one. Workers on quick
// lanes do not wait for a dependency, so as many as there are cores keep
// up with all of a partition's quick lanes; woken beyond that, they only
// queue for its lock: with the default 64 workers and 1000 tenants of
// no-op handlers they would wait for the partitions' locks longer than
// they run (BenchmarkEngine at 1000 tenants guards this). A call that turns out to hang is covered by housekeeping (see
// sched.rescue). Called with sh.mu held.
func (c *Consumer) runQuick(sh *shard, w *worker, l *lane) (enough bool) {
	if !l.quickNow {
		return false
	}
	sh.quick++
	w.quickOn, w.quickGen = true, sh.quickGen
	return c.quickFull(sh)
}

// quickFull reports whether sh has enough workers on its quick lanes
// (GOMAXPROCS, one fewer for a partition fed one message at a time: see
// Consumer.Deliver): then none is woken for it, and one that comes waits.
// Called with sh.mu held.
func (c *Consumer) quickFull(sh *shard) bool { return sh.quick >= sh.quickMax }

// quickNow reports whether t's calls are quick (under quickTurn/2) by its
// guard's latency estimate. Read by finish, right after the step: the
// guard's line is then in the worker's cache, where take, on any worker,
// would find it cold (BenchmarkHandler guards this).
func quickNow(t *tenant) bool {
	if t.none {
		return false
	}
	g := t.peekGuard()
	if g == nil {
		return false
	}
	return quickEst(g.Latency())
}

// quickEst reports whether a latency estimate is a quick tenant's: known,
// and under quickTurn/2.
func quickEst(est time.Duration) bool { return est > 0 && est < quickTurn/2 }

// releaseSlot gives back the bulkhead slot of a finished job.
func (c *Consumer) releaseSlot(w *worker, t *tenant) {
	if t.none {
		return
	}
	t.inflight.Add(-1)
	if t.nblocked.Load() > 0 {
		w.recheck = append(w.recheck, t)
	}
}

// limitOf is t's bulkhead limit now.
func (c *Consumer) limitOf(t *tenant) int32 { return c.limitWith(t, t.ctl.Load()) }

// limitWith is t's bulkhead limit under its control ct: ct's Concurrency
// if set, else its guard's (up to Concurrency either way).
func (c *Consumer) limitWith(t *tenant, ct *Control) int32 {
	if ct != nil && ct.Concurrency > 0 {
		return int32(min(ct.Concurrency, c.cfg.Concurrency))
	}
	g := t.peekGuard()
	if g == nil {
		return int32(c.cfg.TenantConcurrency)
	}
	return int32(min(max(g.Concurrency(c.cfg.TenantConcurrency), 1), c.cfg.Concurrency))
}

// quickTurn is how long, by its guard's latency estimate, a lane's turn
// may take when it runs past its weight in messages (see creditOf).
const quickTurn = 10 * time.Microsecond

// creditOf is how many messages a lane of t takes per turn while other
// lanes of its partition are ready: its fair-share weight, multiplied by as
// many calls as fit into a turn by its guard's latency estimate: into
// quickTurn (up to runMax) for a tenant whose calls are quick, into
// slowTurn (up to shardTurn) for one whose calls take less than half of
// slowTurn. A quiet tenant behind it thus waits, per turn ahead of it,
// about quickTurn of a quick tenant, up to slowTurn of one with calls under
// a millisecond, or one handler call of a slower tenant, while a turn of
// several messages pays the work of a turn (take, finish, the partition's
// lock, the cache lines of a lane, tenant and guard that another core
// touched last) once instead of per message. Tenants of equal latency keep
// the ratio of their weights. Without an estimate yet, the weight alone.
// quick reports a credit by quickTurn.
//
// With one message a turn, such a lane's calls of 50µs on 1000 tenants
// would each pay a take and a finish under its partition's lock, and the
// workers would wait on those locks longer than they run: turns by
// slowTurn spare that (BenchmarkHandler's wait-50us rows guard this).
func (c *Consumer) creditOf(t *tenant, ct *Control) (credit int, quick bool) {
	w := 1
	if ct != nil && ct.Weight > 0 {
		w = ct.Weight
	}
	g := t.peekGuard()
	if g == nil {
		return w, false
	}
	if ct == nil || ct.Weight <= 0 {
		w = max(g.Weight(), 1)
	}
	est := g.Latency()
	if quickEst(est) {
		return w * int(min(quickTurn/est, runMax)), true
	}
	if est > 0 && est < slowTurn/2 {
		return w * int(min(slowTurn/est, shardTurn)), false
	}
	return w, false
}

// releaseBatch is how many tenants of retired lanes a shard holds before
// the next worker to finish a job there drops their holds (release), even
// if it stays on the shard.
const releaseBatch = 32

// slowTurn is how long, by its guard's latency estimate, the turn of a lane
// whose calls are not quick may take: as many calls as fit (up to
// shardTurn), one at the least (see creditOf).
const slowTurn = time.Millisecond

// flush does what the last locked section deferred: events, blocked lanes
// to recheck, the source calls for a commit or resume, spill jobs, and a
// chained wake-up. Called with no lock held.
func (w *worker) flush() {
	c := w.c
	if w.chain > 0 {
		c.sched.chain(w.chain, w.job.sh)
		w.chain = 0
	}
	for _, t := range w.recheck {
		c.unblock(t)
	}
	clear(w.recheck)
	w.recheck = w.recheck[:0]
	for _, l := range w.spills {
		c.queueSpill(l)
	}
	clear(w.spills)
	w.spills = w.spills[:0]
	if w.resume != nil {
		c.maybeResume(w.resume)
		w.resume = nil
	}
	for i := range w.events {
		c.emit(w.events[i])
	}
	clear(w.events)
	w.events = w.events[:0]
	if w.zombie != nil {
		c.zombieDone(w.zombie)
		w.zombie = nil
	}
	for i, f := range w.forgot {
		c.unpin(f)
		w.forgot[i] = nil
	}
	w.forgot = w.forgot[:0]
}

// release drops the holds of the tenants of lanes retired after their
// last job (see moveOn), which wait in sh.released, under one hold of the
// tenant table's lock: with a stream of keys each seen once, a hold of it
// per lane made the deliveries, which take it to make lanes, and the
// workers wait for each other (BenchmarkEngine's distinct-keys row guards
// this). The tenants it forgets wait in w.forgot for flush to release
// their pins. Called with sh.mu held, by a worker that leaves sh or finds
// releaseBatch waiting.
func (w *worker) release(sh *shard) {
	c := w.c
	c.tmu.Lock()
	for i, t := range sh.released {
		if f := c.releaseLocked(t); f != nil {
			w.forgot = append(w.forgot, f)
		}
		sh.released[i] = nil
	}
	c.tmu.Unlock()
	sh.released = sh.released[:0]
}

// unblock moves blocked lanes of t back to their ready queues while t has
// free bulkhead slots. Called with no lock held.
func (c *Consumer) unblock(t *tenant) {
	for t.nblocked.Load() > 0 && t.inflight.Load() < c.limitOf(t) {
		l := t.unblockOne()
		if l == nil {
			return
		}
		sh := l.sh
		sh.mu.Lock()
		if !l.dead && l.state == laneBlocked {
			c.makeReady(l)
		}
		sh.mu.Unlock()
	}
}

// makeReady queues an idle lane to run. Called with its shard's mu held.
func (c *Consumer) makeReady(l *lane) {
	sh := l.sh
	l.state = laneReady
	first := sh.ready.len() == 0
	sh.ready.push(l)
	if !sh.readyHint.Load() {
		sh.readyHint.Store(true)
	}
	// Wake a worker only for a first ready lane: the worker that takes a
	// lane while more wait wakes the next (chain), so a burst of ready
	// lanes costs one wake-up, not one per lane. Nor for a shard with
	// enough workers on its quick lanes (see runQuick): they take it, and
	// a worker woken for it would find them and wait again (at 1000
	// tenants, a wake-up and a wait per ~60 messages).
	wake := first && c.sched.wakeable.Load() > 0 && !c.quickFull(sh)
	if !sh.inRing || wake {
		c.sched.enter(sh, wake)
	}
}

// arm makes the lane wait d before its next step. Called with its shard's
// mu held.
func (c *Consumer) arm(l *lane, d time.Duration) {
	l.state = laneTimer
	l.shared = true
	l.timerSeq++
	seq := l.timerSeq
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(d, func() { c.wake(l, seq) })
}

// disarm cancels a lane's pending timer. Called with its shard's mu held.
func (c *Consumer) disarm(l *lane) {
	l.timerSeq++
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if l.state == laneTimer {
		l.state = laneIdle
	}
}

// wake ends a lane's wait.
func (c *Consumer) wake(l *lane, seq uint64) {
	sh := l.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l.dead || l.timerSeq != seq || l.state != laneTimer {
		return
	}
	l.state = laneIdle
	if l.q.len() > 0 && !c.draining.Load() {
		c.makeReady(l)
	}
}
