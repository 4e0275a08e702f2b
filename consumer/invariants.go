package consumer

import (
	"errors"
	"fmt"
)

// checkInvariants verifies that the engine's counts agree with its
// structures (after otter's checker): every partition's queued count with
// its lanes, its watermark with its unsettled messages, each tenant's
// queued, parked, in-flight and spilling counts with its lanes, the parked
// total, the lanes' scheduling states with the ready queues, the scope
// pins with the tenants the engine tracks, and what it may forget: every
// tenant with a lane or a set-aside message is in the tenant table, the
// idle list holds exactly the tenants marked idle, each of which holds
// nothing (no lane, nothing in flight), and no more of them than
// MaxIdleTenants. Tests run it after every round;
// it holds every partition lock at once, so it sees one consistent state
// even while the engine runs.
func (c *Consumer) checkInvariants() error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	shards := c.shards()
	for _, sh := range shards {
		sh.mu.Lock()
	}
	defer func() {
		for _, sh := range shards {
			sh.mu.Unlock()
		}
	}()
	c.tmu.Lock()
	defer c.tmu.Unlock()

	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	type tally struct{ queued, parked, running, spilling, lanes, aside int }
	per := map[*tenant]*tally{}
	at := func(t *tenant) *tally {
		x := per[t]
		if x == nil {
			x = &tally{}
			per[t] = x
		}
		return x
	}
	var parked int
	for _, sh := range shards {
		if sh.dead {
			continue
		}
		inReady := map[*lane]bool{}
		for i := sh.ready.head; i < len(sh.ready.buf); i++ {
			inReady[sh.ready.buf[i]] = true
		}
		lanes := make([]*lane, 0, sh.lanes.len()+1)
		for l := range sh.lanes.all() {
			if k := l.key; l.h != keyHash(k) || sh.lanes.get(k, l.h) != l || l.t.key != k || l.t.none {
				bad("%v: lane under key %q (found %v) belongs to tenant %q (none=%v)", sh.p, k, sh.lanes.get(k, keyHash(k)) == l, l.t.key, l.t.none)
			}
			lanes = append(lanes, l)
		}
		swept := map[*lane]bool{}
		for i := range sh.sweep.q.len() {
			l := sh.sweep.q.at(i)
			if l.dead && !swept[l] && sh.lanes.get(l.key, l.h) != l {
				swept[l] = true // retired, waiting for the sweep to reuse it
				continue
			}
			if swept[l] || sh.lanes.get(l.key, l.h) != l {
				bad("%v/%q: the sweep's queue holds the lane twice or one the partition does not (dead=%v)", sh.p, l.key, l.dead)
			}
			swept[l] = true
		}
		for _, t := range sh.released {
			at(t).lanes++ // a retired lane's hold, not dropped yet
		}
		if live := countLive(swept); live != sh.lanes.len() {
			bad("%v: the sweep's queue holds %d lanes, the partition %d", sh.p, live, sh.lanes.len())
		}
		if sh.none != nil {
			if !sh.none.t.none || sh.none.t != c.noTenant {
				bad("%v: no-tenant lane has a real tenant %q", sh.p, sh.none.t.key)
			}
			lanes = append(lanes, sh.none)
		}
		queued, live, ready := len(sh.aside.msgs), len(sh.aside.msgs), false
		shParked, quickQueued, aheadLanes := 0, 0, 0
		for _, l := range lanes {
			rq := 0
			if l.ahead && !l.parked && !l.spill.on {
				rq = l.q.len()
			}
			if l.rq != rq {
				bad("%v/%q: lane counts %d messages against ReadAhead, holds %d that count", sh.p, l.key, l.rq, rq)
			}
			quickQueued += l.rq
			if l.rq > 1 {
				aheadLanes++
			}
			x := at(l.t)
			x.lanes++
			n := l.q.len() + l.pend.len()
			queued += n
			x.queued += n
			refed := 0
			for i := range l.q.len() {
				m := l.q.at(i)
				if m.st.lane != l {
					bad("%v/%q: message at %d of q belongs to another lane", sh.p, l.key, m.Offset)
				}
				// failSet is the running worker's; the no-tenant bucket is never
				// stepped fresh (its messages' states say why they have no tenant).
				if l.state != laneRunning && !l.t.none && m.st.failSet && !l.tried.Load() {
					bad("%v/%q: message %d of q was tried but the lane is not marked tried", sh.p, l.key, m.Offset)
				}
				if m.Refed {
					refed++
					if i > 0 && !l.q.at(i-1).Refed {
						bad("%v/%q: re-fed message %d behind a live one", sh.p, l.key, m.Offset)
					}
				} else {
					live++
					if i > 0 {
						if p := l.q.at(i - 1); !p.Refed && !p.st.late && !m.st.late && p.Offset >= m.Offset {
							bad("%v/%q: live message %d behind %d", sh.p, l.key, m.Offset, p.Offset)
						}
					}
				}
			}
			live += l.pend.len()
			if l.pend.len() > 0 {
				if m := l.firstLive(); m != l.pend.front() && !m.st.late && !l.pend.front().st.late && m.Offset >= l.pend.front().Offset {
					bad("%v/%q: waiting to spill %d, not newer than queued %d", sh.p, l.key, l.pend.front().Offset, m.Offset)
				}
			}
			if refed != l.spill.refed.n {
				bad("%v/%q: %d re-fed messages in q, %d in the spill cursor list", sh.p, l.key, refed, l.spill.refed.n)
			}
			if l.pend.len() > 0 && !l.spill.on {
				bad("%v/%q: %d messages wait to be spilled but the lane is not spilling", sh.p, l.key, l.pend.len())
			}
			if l.parked {
				parked += l.q.len()
				shParked += l.q.len()
				x.parked += l.q.len()
			}
			if l.spill.on {
				x.spilling++
			}
			switch l.state {
			case laneRunning:
				if !l.t.none {
					x.running++
				}
			case laneReady:
				ready = true
				if !inReady[l] {
					bad("%v/%q: lane is ready but not in the ready queue", sh.p, l.key)
				}
			}
			if l.dead {
				bad("%v/%q: dead lane still in a live shard", sh.p, l.key)
			}
			if (l.state == laneHeld || l.holdPark) && !l.parked {
				bad("%v/%q: lane held by its control (state %v) but not parked", sh.p, l.key, l.state)
			}
			x.aside += l.aside
		}
		if quickQueued != sh.count.quickQueued || aheadLanes != sh.count.aheadLanes {
			bad("%v: read-ahead count %d in %d lanes, lanes count %d in %d", sh.p, sh.count.quickQueued, sh.count.aheadLanes, quickQueued, aheadLanes)
		}
		if queued != sh.count.queued {
			bad("%v: queued count %d, lanes hold %d", sh.p, sh.count.queued, queued)
		}
		if live != sh.commit.unsettled {
			bad("%v: %d unsettled messages counted, lanes and aside hold %d live ones", sh.p, sh.commit.unsettled, live)
		}
		// At least once: the commit point never passes an unsettled
		// message, and the last scan's oldest is still the oldest unless
		// a settle marked it for a new scan. (A late message, a broker's
		// redelivery of an offset it had passed, may be below both.)
		if o := sh.oldestInOrder(); o != nil {
			if w := sh.commit.src.want.Load(); w > o.Offset {
				bad("%v: commit point %d passes unsettled message %d", sh.p, w, o.Offset)
			}
			if !sh.commit.stale && sh.commit.oldestAt >= 0 && o.Offset < sh.commit.oldestAt {
				bad("%v: oldest unsettled message %d is older than the last scan's %d", sh.p, o.Offset, sh.commit.oldestAt)
			}
		}
		asides := map[*lane]int{}
		for _, m := range sh.aside.msgs {
			if m.st.lane.sh != sh {
				bad("%v: set-aside message %d from another partition", sh.p, m.Offset)
			}
			if m.st.lane.dead {
				bad("%v/%q: set-aside message %d of a dropped lane", sh.p, m.st.lane.key, m.Offset)
			}
			at(m.st.lane.t).queued++
			asides[m.st.lane]++
		}
		for _, l := range lanes {
			if l.aside != asides[l] {
				bad("%v/%q: lane counts %d set-aside messages, the partition holds %d", sh.p, l.key, l.aside, asides[l])
			}
		}
		if shParked != sh.count.parked {
			bad("%v: parked count %d, lanes hold %d parked messages", sh.p, sh.count.parked, shParked)
		}
		if ready && !sh.inRing {
			bad("%v: has ready lanes but is not in the scheduler's ring", sh.p)
		}
	}
	if int64(parked) != c.parkedTotal.Load() {
		bad("parked total %d, lanes hold %d parked messages", c.parkedTotal.Load(), parked)
	}
	if n := c.ntenants.Load(); n != int64(c.tenants.len()) {
		bad("tenant count %d, the table holds %d", n, c.tenants.len())
	}
	all := make([]*tenant, 0, c.tenants.len()+1)
	all = append(all, c.noTenant)
	pinned, idle := 0, 0
	for t := range c.tenants.all() {
		k := t.key
		if c.tenants.get(k, keyHash(k)) != t {
			bad("tenant %q not found under its key", k)
		}
		if t.onIdle {
			idle++
			// Forgetting a listed tenant must lose nothing: it holds no
			// lane (so nothing queued, parked, spilling or set aside) and
			// nothing in flight, not even a job of a dropped lane.
			if t.lanes != 0 || t.inflight.Load() != 0 || t.zombies.Load() != 0 || t.parked.Load() != 0 || t.spillLanes.Load() != 0 {
				bad("idle tenant %q holds %d lanes, %d in flight (%d of dropped lanes), %d parked, %d spilling lanes", k, t.lanes, t.inflight.Load(), t.zombies.Load(), t.parked.Load(), t.spillLanes.Load())
			}
		}
		// A tenant's pin holds while the scope keeps its guard: past its
		// HardCeiling the scope evicts pinned keys too (and their pins
		// with them), so only guards still the scope's count.
		if g := t.guardP.Load(); g != nil && g != c.fallback {
			if sg, ok := c.scope.Peek(t.key); ok && sg == t.scoped {
				pinned++
			}
		}
		all = append(all, t)
	}
	for _, t := range all {
		x := at(t)
		if int64(x.parked) != t.parked.Load() {
			bad("tenant %q: parked count %d, lanes hold %d", t.key, t.parked.Load(), x.parked)
		}
		if !t.none && int32(x.running)+t.zombies.Load() != t.inflight.Load() {
			bad("tenant %q: %d in flight, %d running lanes and %d jobs of dropped lanes", t.key, t.inflight.Load(), x.running, t.zombies.Load())
		}
		if int32(x.spilling) != t.spillLanes.Load() {
			bad("tenant %q: %d spilling lanes counted, %d found", t.key, t.spillLanes.Load(), x.spilling)
		}
		if int32(x.lanes) != t.lanes {
			bad("tenant %q: lane count %d, %d found", t.key, t.lanes, x.lanes)
		}
		delete(per, t)
	}
	for t := range per {
		bad("lanes or set-aside messages of tenant %q (none=%v) that the tenant table does not hold", t.key, t.none)
	}
	n := 0
	c.idle.each(func(t *tenant) {
		if c.tenants.get(t.key, keyHash(t.key)) != t {
			bad("idle list holds tenant %q, not in the table", t.key)
		}
		n++
	})
	if c.idle.q.len() > 2*(c.maxIdle+1)+idleSlack {
		bad("idle list's queue holds %d entries, MaxIdleTenants is %d", c.idle.q.len(), c.maxIdle)
	}
	if n != c.idle.n || idle != c.idle.n {
		bad("idle list counts %d tenants, holds %d, the table marks %d", c.idle.n, n, idle)
	}
	if c.idle.n > c.maxIdle {
		bad("%d idle tenants tracked, more than MaxIdleTenants %d", c.idle.n, c.maxIdle)
	}
	if got := c.scope.Stats().Pinned; got < pinned {
		bad("scope holds %d pinned keys, the engine pinned %d tenants whose guards it holds", got, pinned)
	}
	return errors.Join(errs...)
}

// countLive counts the lanes of set that were not dropped.
func countLive(set map[*lane]bool) int {
	n := 0
	for l := range set {
		if !l.dead {
			n++
		}
	}
	return n
}
