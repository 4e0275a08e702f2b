package consumer

import "sync/atomic"

// This file is what the engine forgets: idle tenants past
// Config.MaxIdleTenants (idleList, idleIfDone) and each partition's idle
// lanes past the same bound (sweepLanes). Memory per tenant is thereby
// bounded whatever the stream of keys; what a tenant holds while it has
// messages in the engine is bounded by the message bounds instead.

// idleList is the engine's tracked tenants that have no lane on any
// partition and nothing in flight, the least recently released first,
// guarded by Consumer.tmu. Such a tenant holds nothing but its counters
// and its scope pin, so the first may be forgotten at any moment (see
// idleIfDone).
//
// It is a queue of references, not a list through the tenants: a tenant
// that leaves it (a message of it came back) only marks itself, and its
// entry, stale from then on, is skipped when it reaches the front or
// dropped when the queue is compacted. Unlinking a tenant from a list
// would write its two neighbours, tenants released long before and after
// it: with many tenants, two cache misses for every tenant that comes back
// (BenchmarkEngine at 100,000 tenants guards this). push compacts the
// queue once it holds 2*n+idleSlack entries, and n is at most
// MaxIdleTenants+1, so the queue holds at most 2*MaxIdleTenants+idleSlack+2;
// a stale entry keeps its tenant's memory (not its guard: a forgotten
// tenant's pin is released) until it leaves the queue.
type idleList struct {
	q fifo[idleRef]
	n int // tenants listed (onIdle)
}

// idleRef is an entry of the idle list: live while its tenant is listed
// and seq is the tenant's current idleSeq.
type idleRef struct {
	t   *tenant
	seq uint32
}

func (r idleRef) live() bool { return r.t.onIdle && r.t.idleSeq == r.seq }

// idleSlack is how many stale entries the idle list's queue holds beyond
// twice its listed tenants before push compacts it: a compaction then
// reads at most two entries for each push since the last.
const idleSlack = 256

func (l *idleList) push(t *tenant) {
	t.idleSeq++
	t.onIdle = true
	l.n++
	if l.q.len() >= 2*l.n+idleSlack {
		l.compact()
	}
	l.q.push(idleRef{t: t, seq: t.idleSeq})
}

// remove unlists t, which is listed; its entry goes stale.
func (l *idleList) remove(t *tenant) {
	t.onIdle = false
	l.n--
}

// oldest unlists and returns the tenant listed longest. The list must not
// be empty.
func (l *idleList) oldest() *tenant {
	for {
		if r := l.q.pop(); r.live() {
			l.remove(r.t)
			return r.t
		}
	}
}

// compact drops the stale entries, keeping the others in order.
func (l *idleList) compact() {
	q := &l.q
	keep := q.buf[:0]
	for _, r := range q.buf[q.head:] {
		if r.live() {
			keep = append(keep, r)
		}
	}
	clear(q.buf[len(keep):])
	q.buf, q.head = keep, 0
}

// each calls f for each listed tenant, the longest listed first.
func (l *idleList) each(f func(*tenant)) {
	for i := range l.q.len() {
		if r := l.q.at(i); r.live() {
			f(r.t)
		}
	}
}

// idleIfDone lists t as idle if it has no lane and nothing in flight, and
// then forgets the tenant idle longest if more than MaxIdleTenants are: it
// leaves the tenant table, so its key's next message starts a fresh tenant.
// While the engine tracks more than twice MaxIdleTenants tenants (a stream
// of keys mostly seen once), a tenant that never made a guard (its
// messages ran without one, see loneOK) is forgotten at once instead of
// listed: it holds nothing worth keeping, and listing it would push out an
// idle tenant that holds a guard, the list's oldest, whose lines a stream
// of new keys has long made cold. It returns the forgotten tenant, whose
// scope pin the caller releases with no lock held (unpin). Called with tmu
// held.
//
// A tenant with no lane may still have jobs in flight: jobs of lanes
// dropped while they ran (a revoked partition). It becomes idle when the
// last of them ends (zombieDone), so that a listed tenant is always one
// that holds nothing.
func (c *Consumer) idleIfDone(t *tenant) (forgotten *tenant) {
	if t.none || t.gone || t.lanes > 0 || t.onIdle || t.inflight.Load() > 0 {
		return nil
	}
	if t.guardP.Load() == nil && c.overTracked() {
		return c.forget(t)
	}
	c.idle.push(t)
	if c.idle.n <= c.maxIdle {
		return nil
	}
	return c.forget(c.idle.oldest())
}

// forget takes f, which is not listed idle, out of the tenant table.
// Called with tmu held.
func (c *Consumer) forget(f *tenant) *tenant {
	c.tenants.del(f, keyHash(f.key))
	c.ntenants.Add(-1)
	f.gone = true
	c.forgotten++
	f.dwell.addTo(&c.goneDwell, &c.goneDwellSum)
	return f
}

// zombieDone is called, with no lock held, once a job of a dropped lane
// of t ended: t may be idle now.
func (c *Consumer) zombieDone(t *tenant) {
	c.tmu.Lock()
	f := c.idleIfDone(t)
	c.tmu.Unlock()
	c.unpin(f)
}

// laneSweep is a partition's sweep of idle lanes: a second-chance queue
// of its lanes (CLOCK's hand, as a FIFO) from which the sweep drops those
// that hold nothing and had no message since they were made or last looked
// at, while the partition has more than laneBound lanes (see
// sweepLanes). New lanes join at the back, so the sweep looks at the
// oldest first. Guarded by the shard's mu, but due.
type laneSweep struct {
	q fifo[*lane] // the lanes of shard.lanes, each once
	// forgot are the tenants forgotten as their last lanes were dropped,
	// whose scope pins the holder of mu releases once it unlocks it (see
	// takeForgotten).
	forgot []*tenant
	// due is set while the partition has more than laneBound lanes:
	// housekeeping reads it at every tick without the lock.
	due atomic.Bool
	// skip is how many of the next lanes made look at none: the last look
	// passed only lanes holding messages, which stay at the front (the
	// oldest, not handled yet) until workers get to them, so that looking
	// again at the next lane would pass the same ones.
	skip int
}

// Per lane made past the bound, the sweep looks at up to sweepPerLane
// lanes that hold nothing and passes up to sweepPerLane*sweepBusy lanes
// holding messages; housekeeping looks at up to sweepChunk of each per
// tick.
const (
	sweepPerLane = 2
	sweepBusy    = 8
	sweepChunk   = 128
)

// A partition keeps at most laneBound lanes beyond those holding
// messages: MaxIdleTenants, but no more than its share of about
// laneShare*MaxIdleTenants lanes over all partitions (at least laneKeepMin)
// and never more than laneKeepMax. An idle lane holds nothing its tenant
// needs, so it may go much sooner than the tenant: without these caps,
// many tenants or many partitions make a lane for almost every message
// and keep them all, and a message then costs the memory of a new lane,
// and the commit scan (which reads each lane) grows with the tenants.
// With them, the sweep's dropped lanes are reused (shard.newLane), so a
// message of a rarely seen tenant costs a lookup of the tenant and a
// reused lane (BenchmarkEngine at many tenants or partitions guards
// these).
const (
	laneShare   = 4
	laneKeepMin = 64
	laneKeepMax = 16384
)

// laneBound is how many lanes a partition keeps beyond those holding
// messages (see laneShare). Read without a lock: the partition count is
// the last published one.
func (c *Consumer) laneBound() int {
	n := max(len(c.parts.Load().m), 1)
	return min(c.maxIdle, max(laneKeepMin, laneShare*c.maxIdle/n), laneKeepMax)
}

// addLane makes and files a new lane of t in sh. If that takes sh past
// laneBound lanes, it first sweeps a few (see sweepLanes), whose memory
// the new lane may then reuse. Called with sh.mu and tmu held.
func (sh *shard) addLane(t *tenant, h uint64) *lane {
	c := sh.c
	bound := c.laneBound()
	if sw := &sh.sweep; sw.q.len() >= bound {
		if sw.skip > 0 {
			sw.skip--
		} else if idle, busy := c.sweepLanes(sh, sweepPerLane, sweepPerLane*sweepBusy, bound-1, bound); idle == 0 {
			sw.skip = busy
		}
	}
	l := sh.newLane()
	l.t, l.key, l.h = t, t.key, h
	// Its tenant's calls are as quick as the partition's last: with many
	// tenants, most lanes run one job, and one taken as slow wakes another
	// worker for the lanes ready behind it (see runQuick), so that a
	// stream of new tenants would keep every worker awake, competing for
	// the cores with the source's goroutine that delivers them.
	l.quickNow = sh.quickPrior
	sh.lanes.put(l, h)
	sh.sweep.q.push(l)
	if sh.sweep.q.len() > bound && !sh.sweep.due.Load() {
		sh.sweep.due.Store(true)
	}
	return l
}

// sweepLanes drops idle lanes of sh until it holds at most keep lanes, or
// it looked at idle lanes that hold nothing and passed busy ones that hold
// messages. It takes lanes from the front of the queue: one that holds
// nothing and had at most one message (its first) since it was made or
// the sweep last looked at it is dropped and its tenant released (which
// may forget the tenant, see idleIfDone); any other goes to the back,
// marked as looked at. So a lane made for one message goes at the first
// look after its message was handled, and a lane its tenant keeps using
// stays.
//
// The work is bounded and in proportion to the lanes made, never a walk of
// all lanes: each lane made past the bound first looks at sweepPerLane
// idle lanes (more than the one each lane made needs, so that under any
// stream of new keys the partition's lanes come back to the bound), and
// passes up to sweepBusy times as many busy ones (a backlog of many
// tenants' messages makes as many busy lanes, which cannot go);
// housekeeping does sweepChunk of each per tick while sh.sweep.due is set,
// for lanes that went idle after their keys stopped coming. Called with
// sh.mu and tmu held; the tenants it forgets wait in sh.sweep.forgot for
// their pins to be released with no lock held. It returns how many idle
// and busy lanes it looked at.
//
// A partition holding more lanes with messages than laneBound (a backlog
// of many tenants, or keys each seen once) has them all at the front: a
// lane made past the bound whose look found nothing but those makes the
// next ones made skip their look, as many as it passed (see
// laneSweep.skip), so that a message costs one look at a lane, not
// sweepPerLane*sweepBusy (BenchmarkConsumeTenants guards this).
func (c *Consumer) sweepLanes(sh *shard, idle, busy, keep, bound int) (looked, passed int) {
	sw := &sh.sweep
	for idle > 0 && busy > 0 && sw.q.len() > keep {
		l := sw.q.pop()
		if l.dead {
			// Retired when it went idle (see retire): only its memory is left.
			sh.freeLane(l)
			continue
		}
		free := l.idle()
		if free {
			idle--
			looked++
		} else {
			busy--
			passed++
		}
		if !free || l.hits > 1 {
			if l.hits > 1 {
				l.hits = 1
			}
			sw.q.push(l)
			continue
		}
		c.retire(sh, l)
		if t := c.releaseLocked(l.t); t != nil {
			sw.forgot = append(sw.forgot, t)
		}
		sh.freeLane(l)
	}
	if over := sw.q.len() > bound; over != sw.due.Load() {
		sw.due.Store(over)
	}
	return looked, passed
}

// retire drops l, a lane that holds nothing, from sh: the sweep's way to
// drop a lane, and a worker's for a lane that just went idle after its only
// message, from a partition holding more than laneBound lanes, or while the
// engine tracks more than twice MaxIdleTenants tenants (see overTracked,
// moveOn): a stream of keys each seen once then costs a lane made and
// dropped per message, and the engine holds only the lanes with messages
// beyond its bounds. Waiting for the sweep to come round to each would keep
// thousands of such lanes (each partition up to its bound), and with them
// their tenants and their tenants' scope pins: enough to fill the scope to
// its hard bound, where every new key sweeps it whole. A lane a worker
// retires stays in the sweep's queue, dead, until the sweep passes it and
// reuses its memory. Called with sh.mu held; the caller then releases the
// lane's tenant (releaseLocked with tmu held, or later through
// shard.released, see worker.release) and the scope pin of the tenant that
// forgets, if any, with no lock held (unpin).
func (c *Consumer) retire(sh *shard, l *lane) {
	sh.lanes.del(l, l.h)
	q := l.q.buf // empty: the lane holds nothing
	c.unhook(l)
	l.q.buf = q[:0]
}

// overTracked reports whether the engine tracks more than twice
// MaxIdleTenants tenants: the idle ones are bounded by MaxIdleTenants, and
// as many again may hold only lanes idle but kept; more are tenants of
// lanes made for one message, which retire then drops as soon as it is
// handled. So the tenants the engine pins in its scope stay within the
// scope's HardCeiling (four times MaxKeys by default) plus the tenants
// with messages in flight. Read without tmu.
func (c *Consumer) overTracked() bool { return c.ntenants.Load() > 2*int64(c.maxIdle) }

// loneTracked reports whether the engine tracks more than one and a half
// times MaxIdleTenants tenants: the pressure under which a tenant's first
// message may run without its guard (see loneOK). A stream of keys each
// seen once keeps the engine at about twice MaxIdleTenants (its idle
// tenants, and the tenants of the messages it holds, the guardless ones
// forgotten at once past that count, see idleIfDone): a test at that same
// count would hold for only part of the stream, and the rest of its keys
// would each build a guard for nothing (BenchmarkEngine's distinct-keys
// row shows it). Read without tmu.
func (c *Consumer) loneTracked() bool {
	return c.ntenants.Load() > int64(c.maxIdle)+int64(c.maxIdle/2)
}

// takeForgotten returns the tenants forgotten by sh's sweeps, whose pins
// the caller releases (unpinAll) once it has unlocked sh.mu. Called with
// sh.mu held.
func (sh *shard) takeForgotten() []*tenant {
	f := sh.sweep.forgot
	sh.sweep.forgot = nil
	return f
}

// unpinAll releases the scope pins of forgotten tenants. Called with no
// lock held.
func (c *Consumer) unpinAll(ts []*tenant) {
	for _, t := range ts {
		c.unpin(t)
	}
}

// sweepTick is housekeeping's sweep of sh, at every tick while it has more
// than laneBound lanes: sweepChunk lanes at most.
func (c *Consumer) sweepTick(sh *shard) {
	sh.mu.Lock()
	if !sh.dead {
		bound := c.laneBound()
		c.tmu.Lock()
		c.sweepLanes(sh, sweepChunk, sweepChunk, bound, bound)
		c.tmu.Unlock()
	}
	forgot := sh.takeForgotten()
	sh.mu.Unlock()
	c.unpinAll(forgot)
}
