package consumer

import (
	"sync"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// spillWorkers is how many goroutines run spill jobs (appends, re-feed
// reads and cursor commits), each job one lane at a time.
const spillWorkers = 4

// spillBatch caps the messages of one Append.
const spillBatch = 256

// SpillReason says why a lane spilled.
type SpillReason uint8

// Spill reasons.
const (
	SpillParked    SpillReason = iota + 1 // parked at MaxParkedPerTenant (or MaxParked in total)
	SpillStuck                            // its oldest message held the partition's commit for StuckAfter
	SpillBacklog                          // its backlog in the partition passed MaxQueuedPerTenant
	SpillRecovered                        // its spill log had entries when the partition was assigned
	// SpillDLQUnavailable: as SpillStuck, while its oldest message waits
	// for a dead letter its DLQ refuses (TenantStats.DLQUnavailable).
	SpillDLQUnavailable
	// SpillQuarantine: its tenant is quarantined (Control.Quarantine).
	SpillQuarantine
)

func (r SpillReason) String() string {
	switch r {
	case SpillParked:
		return "parked-bound"
	case SpillStuck:
		return "stuck"
	case SpillBacklog:
		return "backlog"
	case SpillRecovered:
		return "recovered"
	case SpillDLQUnavailable:
		return "dlq-unavailable"
	case SpillQuarantine:
		return "quarantine"
	}
	return "none"
}

// spillQueue holds lanes whose spill job must run. Its mu is a leaf lock.
type spillQueue struct {
	mu   sync.Mutex
	cond *sync.Cond
	q    []*lane
	stop bool
}

func (s *spillQueue) push(l *lane) {
	s.mu.Lock()
	s.q = append(s.q, l)
	s.cond.Signal()
	s.mu.Unlock()
}

func (s *spillQueue) pop() *lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.q) == 0 && !s.stop {
		s.cond.Wait()
	}
	if s.stop {
		return nil
	}
	l := s.q[0]
	s.q[0] = nil
	s.q = s.q[1:]
	return l
}

func (s *spillQueue) shutdown() {
	s.mu.Lock()
	s.stop = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// spillable reports whether l may spill at all.
func (c *Consumer) spillable(l *lane) bool {
	return c.cfg.Spill != nil && !l.t.none && !l.dead
}

// requestSpill asks for l to spill, for reason. A lane that is not running
// enters spill mode at once; a running one when its step finishes. It
// reports false when l cannot spill (no SpillLog, or the no-tenant bucket).
// Called with l's shard mu held.
func (c *Consumer) requestSpill(l *lane, reason SpillReason, ev *[]Event) bool {
	if !c.spillable(l) {
		return false
	}
	if l.spill.on {
		return true
	}
	l.spill.reason = reason
	if l.state == laneRunning {
		l.spill.want = true
		return true
	}
	c.enterSpill(l, ev)
	return true
}

// enterSpill puts an idle lane in spill mode: its live messages (the tail
// of q, behind any re-fed ones) move to pend, in order, to be appended to
// its spill log; later live messages follow them there until the log is
// read back to its end. Called with l's shard mu held, l not running.
func (c *Consumer) enterSpill(l *lane, ev *[]Event) {
	l.spill.want = false
	if !c.spillable(l) {
		return
	}
	if l.state == laneTimer {
		c.disarm(l)
	}
	i := 0
	for n := l.q.len(); i < n && l.q.at(i).Refed; i++ {
	}
	if n := l.q.len() - i; n > 0 {
		var moved []*Message
		moved = l.q.takeFrom(i, moved)
		for _, m := range moved {
			m.st.spilled, m.st.noted = true, false
		}
		if i == 0 {
			if v := keepVerdict(l, moved[0]); v != nil {
				l.spill.kept = v
				f := moved[0].st.fail // keepVerdict found it failed
				f.note, moved[0].st.noted = encodeNote(v), true
			}
			l.judge, l.judgeSpan = "", 0
		}
		if l.parked {
			c.addParked(l, -n)
		}
		l.pend.pushFront(moved)
	}
	l.shared = true
	if !l.spill.on {
		l.spill.on = true
		l.t.spillLanes.Add(1)
		*ev = append(*ev, Event{Kind: EventSpilling, Tenant: l.key, Partition: l.sh.p, Spill: l.spill.reason})
	}
	if l.state == laneIdle && l.q.len() > 0 && !c.draining.Load() {
		c.makeReady(l) // re-fed messages stay runnable (a cancelled wait ends)
	}
	c.recount(l)
	c.ensureSpillJob(l)
}

// needsSpillWork reports whether l's spill job has something to do.
// Called with l's shard mu held.
func (c *Consumer) needsSpillWork(l *lane) bool {
	if l.spill.commit.want.Load() > l.spill.commit.done.Load() {
		return true
	}
	return l.spill.on && (l.pend.len() > 0 || c.refeedRoom(l) > 0)
}

// ensureSpillJob queues l's spill job if it has work and none is queued,
// running or backing off. Called with l's shard mu held.
func (c *Consumer) ensureSpillJob(l *lane) {
	if l.dead || l.spill.job || l.spill.wait || c.cfg.Spill == nil || !c.needsSpillWork(l) {
		return
	}
	l.spill.job = true
	l.shared = true
	c.spillQ.push(l)
}

// queueSpill is ensureSpillJob for callers holding no lock.
func (c *Consumer) queueSpill(l *lane) {
	l.sh.mu.Lock()
	c.ensureSpillJob(l)
	l.sh.mu.Unlock()
}

// raiseSpillCursor moves l's commit point in its spill log to the oldest
// re-fed message not yet settled (or past the last one read) and queues the
// commit. Called with l's shard mu held.
func (c *Consumer) raiseSpillCursor(l *lane) {
	next := l.spill.readPos
	if h := l.spill.refed.head; h != nil {
		next = h.SpillPos
	}
	if next >= 0 && l.spill.commit.raise(next) {
		c.ensureSpillJob(l)
	}
}

// spillLoop runs spill jobs until the engine drains.
func (c *Consumer) spillLoop() {
	for {
		l := c.spillQ.pop()
		if l == nil {
			return
		}
		c.spillWork(l)
	}
}

// spillWork runs l's spill job: it commits the spill cursor, appends pending
// messages (then settles their originals), and reads the log back into q
// while the tenant may run, until nothing is left to do; a lane whose log is
// read to its end with nothing pending leaves spill mode. Every SpillLog
// call is made with no lock held.
//
// The job counts itself in on its partition's spill gate: Revoked waits for
// the call in progress, so that an append of a revoked lane lands before
// the partition's next owner lists the logs to recover (Pending), and the
// lane's calls never overlap those of the next owner's lane.
func (c *Consumer) spillWork(l *lane) {
	sh, t := l.sh, l.t
	sl := SpillLane{Tenant: l.key, Partition: sh.p}
	var batch []*Message
	var ev []Event
	defer func() {
		for i := range ev {
			c.emit(ev[i])
		}
	}()
	if !sh.spills.enter() {
		return // revoked: the lane is dead
	}
	defer sh.spills.exit()
	for {
		committed := false
		if l.spill.commit.want.Load() > l.spill.commit.done.Load() {
			err := l.spill.commit.run(func(next int64) error { return c.cfg.Spill.Commit(c.hctx, sl, next) })
			if err != nil {
				// Backed off as a failed append or read: retried at once,
				// a log that is down would take every call the job makes.
				c.spillFailed(l, "commit", err, &ev)
				return
			}
			committed = true
		}
		sh.mu.Lock()
		if l.dead || c.draining.Load() {
			l.spill.job = false
			sh.mu.Unlock()
			return
		}
		if committed {
			l.spill.fails = 0
		}
		switch {
		case l.pend.len() > 0:
			batch = batch[:0]
			for i, n := 0, min(l.pend.len(), spillBatch); i < n; i++ {
				batch = append(batch, l.pend.at(i))
			}
			reason := l.spill.reason
			sh.mu.Unlock()
			if c.tr != nil {
				for _, m := range batch {
					if tp := traceParent(m); tp != "" {
						m.Headers = withTraceParent(m.Headers, tp)
					}
				}
			}
			if err := c.cfg.Spill.Append(c.hctx, sl, batch); err != nil {
				c.spillFailed(l, "append", err, &ev)
				return
			}
			for _, m := range batch {
				c.settleSource(sh, m, nil)
				traceSpilled(m, reason)
			}
			sh.mu.Lock()
			if l.dead {
				sh.mu.Unlock()
				return
			}
			l.spill.fails = 0
			for range batch {
				m := l.pend.remove(0)
				sh.count.queued--
				c.unlist(sh, l, m) // the next tick commits past them
			}
			if l.spill.out == 0 {
				l.spill.born = c.bornOf(batch[0])
			}
			l.spill.out += len(batch)
			t.spilled.Add(uint64(len(batch)))
			c.stats.spilled.Add(uint64(len(batch)))
			resume := sh.pause.reason != 0 && sh.pause.reason != PauseDraining && sh.count.queued <= sh.bounds.maxQueued/2 &&
				(sh.pause.reason != PauseReadAhead || c.pressureGone(sh))
			if resume {
				c.setPause(sh, 0)
			}
			sh.mu.Unlock()
			clear(batch)
			if resume {
				c.syncPause(sh)
			}
		case l.spill.on && c.refeedRoom(l) > 0:
			n := c.refeedRoom(l)
			from := l.spill.readPos
			sh.mu.Unlock()
			msgs, err := c.cfg.Spill.Read(c.hctx, sl, from, n)
			if err != nil {
				c.spillFailed(l, "read", err, &ev)
				return
			}
			notes := c.readNotes(sl, msgs)
			if c.tr != nil {
				for _, m := range msgs {
					m.st = msgState{}
					c.tr.start(m, l.key, true)
				}
			}
			sh.mu.Lock()
			if l.dead {
				sh.mu.Unlock()
				return
			}
			l.spill.fails = 0
			if len(msgs) == 0 {
				if l.pend.len() > 0 {
					sh.mu.Unlock()
					continue // live messages arrived meanwhile: append them first
				}
				// The log is read to its end and nothing waits to be
				// appended: the lane's messages flow directly again,
				// behind the re-fed ones still in q.
				l.spill.on = false
				c.recount(l)
				t.spillLanes.Add(-1)
				ev = append(ev, Event{Kind: EventSpillDrained, Tenant: l.key, Partition: sh.p})
				l.spill.job = false
				if l.spill.commit.want.Load() > l.spill.commit.done.Load() {
					l.spill.job = true // one more pass for the cursor
					sh.mu.Unlock()
					continue
				}
				sh.mu.Unlock()
				return
			}
			dups := c.refeed(l, msgs, notes)
			sh.mu.Unlock()
			for _, m := range dups {
				traceDropped(m, "duplicate")
			}
		default:
			l.spill.job = false
			if c.needsSpillWork(l) && l.spill.commit.want.Load() > l.spill.commit.done.Load() {
				l.spill.job = true
				sh.mu.Unlock()
				continue
			}
			sh.mu.Unlock()
			return
		}
	}
}

// refeedRoom is how many entries l may read back now: a window (at most
// the lane's share of its partition) while its
// tenant's breaker is closed; while it is not, only what a probe needs: the
// head, and as many behind it as a judge round of a suspect head may try
// (a poison head must not keep its tenant parked for lack of a message to
// compare it with); none while its tenant is held or quarantined. Called
// with l's shard mu held.
func (c *Consumer) refeedRoom(l *lane) int {
	if l.t.ctl.Load().stops() {
		return 0 // held or quarantined: nothing re-fed until released
	}
	want := min(c.cfg.RefeedWindow, l.sh.bounds.maxQueuedTenant)
	if g := l.t.peekGuard(); g != nil && !g.Closed() {
		want = 1
	}
	if l.judge != "" {
		// The judge's span may pass the window (it is bounded by
		// maxJudgeSpan): a run of bad messages longer than the window must
		// not hide the good one behind them.
		want = max(want, 2*l.judgeSpan+1) // and as many to confirm
	}
	return max(want-l.q.len(), 0)
}

// refeed puts messages read from l's spill log into q, dropping copies of
// messages re-fed already (a crash or a failed append may have written one
// twice); it returns the traced copies it dropped, whose spans the caller
// ends. Called with l's shard mu held.
func (c *Consumer) refeed(l *lane, msgs []*Message, notes []*spillVerdict) (dups []*Message) {
	sh, t := l.sh, l.t
	now := c.clock()
	for i, m := range msgs {
		if m.SpillPos >= l.spill.readPos {
			l.spill.readPos = m.SpillPos + 1
		}
		if l.spill.seenCopy(m.Offset) {
			c.stats.duplicates.Add(1)
			t.spillDone.Add(1)
			l.spill.out = max(l.spill.out-1, 0)
			if m.st.traced {
				dups = append(dups, m)
			}
			continue
		}
		m.Refed = true
		m.st = msgState{lane: l, fail: m.st.fail, msgScalars: msgScalars{gen: uint32(sh.gen), at: now, traced: m.st.traced}}
		if v := l.spill.kept; v != nil && m.Offset == v.off {
			l.spill.kept = nil
			restoreVerdict(l, m, v)
		} else if notes != nil && notes[i] != nil {
			restoreVerdict(l, m, notes[i]) // spilled by another process
		}
		l.spill.refed.pushBack(m)
		l.q.push(m)
		sh.count.queued++
		t.refed.Add(1)
		c.stats.refed.Add(1)
		if l.parked {
			c.addParked(l, 1)
		}
	}
	if l.spill.refed.head == nil {
		c.raiseSpillCursor(l) // all duplicates: move the cursor past them
	}
	if l.state == laneIdle && l.q.len() > 0 && !c.draining.Load() {
		c.makeReady(l)
	}
	return dups
}

// spillVerdict is what a lane knew against the head it spilled: a dead
// letter waiting for the DLQ to take it, or a judge round's evidence (a
// later message succeeded where it failed). Without it, the re-fed copy
// would be judged again from nothing, and if the messages that convicted it
// were handled meanwhile, nothing behind it could convict it again: it
// would wait, probing, until its tenant's next message on the partition.
// The lane keeps it in memory for its own re-feed, and the spill log carries
// it with the message as its spill note (see encodeNote), for a copy re-fed
// by another process (after a restart or a rebalance).
type spillVerdict struct {
	off   int64      // the message's offset
	judge dlq.Reason // the lane's judge of it
	span  int        // and the judge's span
	fail  failState  // its failure state, without its span
}

// keepVerdict returns what l knows against m, its head, which it is about
// to spill, or nil if nothing. Called with l's shard mu held.
func keepVerdict(l *lane, m *Message) *spillVerdict {
	f := m.st.failed()
	if f == nil || (f.dlqReason == "" && !f.evidence) {
		return nil
	}
	v := &spillVerdict{off: m.Offset, judge: l.judge, span: l.judgeSpan, fail: *f}
	v.fail.span, v.fail.tparked, v.fail.note = nil, false, nil
	return v
}

// readNotes decodes the spill notes of msgs, read from sl's log: nil
// if none has one, else the verdict of each (nil where none). A note that
// does not decode is dropped, with a warning: its message is judged afresh.
// Called with no lock held.
func (c *Consumer) readNotes(sl SpillLane, msgs []*Message) []*spillVerdict {
	var out []*spillVerdict
	for i, m := range msgs {
		note := m.SpillNote()
		if note == nil {
			continue
		}
		m.SetSpillNote(nil)
		v, err := decodeNote(note)
		if err != nil {
			c.log.Warn("consumer: a spill record's note does not decode; its message is judged afresh", "tenant", sl.Tenant, "partition", m.Partition, "offset", m.Offset, "err", err)
			continue
		}
		if out == nil {
			out = make([]*spillVerdict, len(msgs))
		}
		out[i] = v
	}
	return out
}

// restoreVerdict gives m, the re-fed copy of the head l spilled, what l
// knew against the original (see spillVerdict), and l its judge if m is
// its head. Called with l's shard mu held, before m is queued.
func restoreVerdict(l *lane, m *Message, v *spillVerdict) {
	f := m.st.wr()
	span := f.span // a traced copy's span, kept in its failure state
	*f = v.fail
	f.span = span
	if l.q.len() == 0 && v.judge != "" {
		l.judge, l.judgeSpan = v.judge, max(v.span, 1)
	}
}

// spillRetryMax caps the wait before a failed spill-log call is made
// again (from Config.DLQRetry, doubling).
const spillRetryMax = 30 * time.Second

// spillFailed backs l's spill job off after a failed call: the messages stay
// where they are (pend, unsettled), and the job runs again after a doubling
// wait. A partition whose memory bound is reached meanwhile is paused, with
// reason PauseSpillUnavailable.
func (c *Consumer) spillFailed(l *lane, op string, err error, ev *[]Event) {
	sh := l.sh
	c.stats.spillFails.Add(1)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l.spill.job = false
	if l.dead || c.hctx.Err() != nil {
		return
	}
	l.spill.fails++
	wait := min(c.cfg.DLQRetry<<min(l.spill.fails-1, 8), spillRetryMax)
	l.spill.wait = true
	time.AfterFunc(wait, func() {
		sh.mu.Lock()
		l.spill.wait = false
		c.ensureSpillJob(l)
		sh.mu.Unlock()
	})
	if l.spill.fails == 1 || l.spill.fails%10 == 0 {
		c.log.Warn("consumer: spill log failing; the tenant's messages stay unsettled", "op", op, "tenant", l.key, "partition", sh.p, "fails", l.spill.fails, "retry_in", wait, "err", err)
	}
	*ev = append(*ev, Event{Kind: EventSpillFailed, Tenant: l.key, Partition: sh.p, Err: err, Delay: wait})
}

// recoverSpills asks the spill log which of sh's tenants have spilled
// messages left and puts their lanes in spill mode before any live message
// of the partition arrives, so that each tenant's order holds across a
// restart or a rebalance. It retries until it knows or the engine stops.
func (c *Consumer) recoverSpills(sh *shard) {
	var lanes []SpillLane
	for attempt := 1; ; attempt++ {
		var err error
		lanes, err = c.cfg.Spill.Pending(c.hctx, sh.p)
		if err == nil {
			break
		}
		if c.hctx.Err() != nil {
			return
		}
		wait := min(c.cfg.DLQRetry<<min(attempt-1, 8), 5*time.Second)
		c.log.Warn("consumer: cannot list spilled tenants of an assigned partition; retrying before delivering it", "partition", sh.p, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.hctx.Done():
			t.Stop()
			return
		}
	}
	var ev []Event
	sh.mu.Lock()
	for _, sl := range lanes {
		if sl.Partition != sh.p || sh.dead {
			continue
		}
		l := sh.laneFor(sl.Tenant, keyHash(sl.Tenant))
		l.shared = true
		if !l.spill.on {
			l.spill.on = true
			l.spill.reason = SpillRecovered
			l.t.spillLanes.Add(1)
			ev = append(ev, Event{Kind: EventSpilling, Tenant: l.key, Partition: sh.p, Spill: SpillRecovered})
		}
		c.ensureSpillJob(l)
	}
	forgot := sh.takeForgotten()
	sh.mu.Unlock()
	c.unpinAll(forgot)
	for i := range ev {
		c.emit(ev[i])
	}
}

// refedMemory is how many re-fed originals a lane remembers to tell copies.
const refedMemory = 4096

// seenCopy reports whether the original at offset was re-fed already
// (within the last refedMemory), and remembers it if not. A copy older
// than that is handled again: a duplicate, which at-least-once allows;
// dropping a message that is not a copy would be a loss.
func (s *laneSpill) seenCopy(offset int64) bool {
	if _, ok := s.refedIDs[offset]; ok {
		return true
	}
	if s.refedIDs == nil {
		s.refedIDs = make(map[int64]struct{})
	}
	if len(s.refedRing) < refedMemory {
		s.refedRing = append(s.refedRing, offset)
	} else {
		delete(s.refedIDs, s.refedRing[s.refedNext])
		s.refedRing[s.refedNext] = offset
		s.refedNext = (s.refedNext + 1) % refedMemory
	}
	s.refedIDs[offset] = struct{}{}
	return false
}

// spillSettled counts a re-fed message of l, just taken out of its re-fed
// list, out of the lane's spilled backlog (laneSpill.out) and moves its
// oldest produce time on: to the next re-fed message's, or, while the next
// is still in the log, to m's (a bound: the next one is no older). Called
// with l's shard mu held.
func (c *Consumer) spillSettled(l *lane, m *Message) {
	if l.spill.out == 0 {
		return // appended by an earlier process: not in this one's backlog
	}
	l.spill.out--
	if h := l.spill.refed.head; h != nil {
		l.spill.born = c.bornOf(h)
	} else {
		l.spill.born = c.bornOf(m)
	}
}

// spillAge is how long ago the oldest message of l's spilled backlog was
// produced, or zero when it has none. Called with l's shard mu held.
func (c *Consumer) spillAge(l *lane, now int64) time.Duration {
	if l.spill.out == 0 {
		return 0
	}
	if h := l.spill.refed.head; h != nil {
		return age(now, c.bornOf(h))
	}
	return age(now, l.spill.born)
}
