package consumer

import (
	"slices"
	"sync/atomic"
	"time"
)

// This file is settling and commits: Source.Settle for handled,
// dead-lettered and spilled messages (settleSource, settleRun), taking
// settled messages out of their lanes (removeSettled), and the partition's
// commit point (refreshCommit) passed to Source.Commit (commitShard).

// commitState is what a shard keeps to find its commit point (the
// watermark) and pass it to Source.Commit. Guarded by the shard's mu, but
// src (see commitSync).
type commitState struct {
	// unsettled counts the partition's live messages not yet settled:
	// those in its lanes (q's live ones and pend) and aside. Their
	// offsets are not kept in a list: the commit point is found by a scan
	// of the lanes, and only after the oldest may have settled (see
	// refreshCommit).
	unsettled int
	// oldestAt is the offset of the oldest unsettled message at the last
	// scan, or -1 if there was none; stale is set when a message at or
	// below it settles (or any, after a scan that found none): the next
	// tick scans again. scannedAt is the engine clock of the last scan.
	oldestAt  int64
	stale     bool
	scannedAt int64
	// late holds the unsettled live messages delivered after a message of
	// a higher offset (a broker's redelivery): the only ones out of offset
	// order in their lanes.
	late []*Message
	next int64      // offset after the last delivered message; -1 before any
	src  commitSync // the points passed to Source.Commit
}

// oldest returns the partition's oldest unsettled live message, or nil:
// the first live message of a lane's queue (re-fed ones come first), else
// the front of its pend (newer than its queue), a set-aside one, or a late
// one. Offsets grow in delivery order but for the late ones, so it is the
// one of least offset. Called with sh.mu held.
func (sh *shard) oldest() *Message {
	o := sh.oldestInOrder()
	for _, m := range sh.commit.late {
		if o == nil || m.Offset < o.Offset {
			o = m
		}
	}
	return o
}

// oldestInOrder is oldest but for the late messages. Called with sh.mu
// held.
func (sh *shard) oldestInOrder() *Message {
	var o *Message
	for _, m := range sh.aside.msgs {
		if !m.st.late && (o == nil || m.Offset < o.Offset) {
			o = m
		}
	}
	sh.eachLane(func(l *lane) {
		if m := l.firstLive(); m != nil && !m.st.late && (o == nil || m.Offset < o.Offset) {
			o = m
		}
	})
	return o
}

// settled counts a live message of sh as settled, and marks the commit
// point for a new scan if m may have been the oldest (see refreshCommit).
// Called with sh.mu held.
func (sh *shard) settled(m *Message) {
	sh.commit.unsettled--
	if len(sh.commit.late) > 0 && m.st.late {
		m.st.late = false
		if i := slices.Index(sh.commit.late, m); i >= 0 {
			sh.commit.late = slices.Delete(sh.commit.late, i, i+1)
		}
	}
	if !sh.commit.stale && (sh.commit.oldestAt < 0 || m.Offset <= sh.commit.oldestAt) {
		sh.commit.stale = true
	}
}

// scanLanes is how many lanes a partition may hold for its commit point to
// be found at every tick. With more, the scans are spaced out in proportion,
// up to scanMax apart: a scan reads each lane's head, cold lines, and a
// scan of hundreds of lanes at every tick costs a share of throughput
// (BenchmarkHandler at 1000 tenants guards this). A later commit costs nothing
// but redeliveries after a crash: the Kafka source commits once a second
// by default, and Revoked and the drain scan at once.
const (
	scanLanes = 16
	scanMax   = time.Second
)

// refreshCommit raises sh's commit point, the offset every message below
// which is settled (the oldest unsettled message's, or past the last
// delivered one), if the oldest may have settled since the last scan. With
// force, it scans regardless (Revoked, the drain). Called with sh.mu held;
// the caller passes the point on with syncCommit once unlocked (see
// commitShard).
func (sh *shard) refreshCommit(now int64, force bool) {
	if !force && (!sh.commit.stale || now-sh.commit.scannedAt < min(int64(tick)*int64(sh.lanes.len()/scanLanes), int64(scanMax))) {
		return
	}
	sh.commit.stale, sh.commit.scannedAt = false, now
	p := sh.commit.next
	sh.commit.oldestAt = -1
	if m := sh.oldest(); m != nil {
		p, sh.commit.oldestAt = m.Offset, m.Offset
	}
	sh.commit.src.raise(p)
}

// commitShard finds sh's commit point (refreshCommit) and passes it to the
// Source (syncCommit), with no lock held during the call.
func (c *Consumer) commitShard(sh *shard, now int64, force bool) {
	sh.mu.Lock()
	if !sh.dead {
		sh.refreshCommit(now, force)
	}
	sh.mu.Unlock()
	c.syncCommit(sh)
}

// syncCommit passes sh's newest commit point to the Source, with no lock
// held.
func (c *Consumer) syncCommit(sh *shard) {
	if sh.commit.src.want.Load() <= sh.commit.src.done.Load() {
		return
	}
	if err := sh.commit.src.run(func(next int64) error { return c.src.Commit(c.bg, sh.p, next) }); err != nil {
		c.log.Warn("consumer: commit failed; retried at the next advance", "partition", sh.p, "err", err)
	}
}

// settleRun counts the messages a quick run handled and tells the source
// they are settled (see handled), with no lock held.
func (c *Consumer) settleRun(w *worker) {
	if w.runHandled > 0 {
		w.n.handled.Add(w.runHandled)
		w.runHandled = 0
	}
	if len(w.unsettled) == 0 {
		return
	}
	c.settleCounted(w.job.sh, w.unsettled, &w.settling)
	clear(w.unsettled)
	w.unsettled = w.unsettled[:0]
}

// settleSource tells the source that m is settled (a re-fed message's
// original was settled when it was spilled). It makes no call for a
// partition revoked since m's delivery. A worker passes its own slot to
// count itself in (a store to its own line); other callers use the
// partition's shared count.
func (c *Consumer) settleSource(sh *shard, m *Message, slot *atomic.Pointer[shard]) {
	if c.settleNoop || m.Refed || m.st.gen != uint32(sh.gen) {
		return
	}
	if slot != nil {
		one := [1]*Message{m}
		c.settleCounted(sh, one[:], slot)
		return
	}
	if !sh.gate.enter() {
		return
	}
	defer sh.gate.exit()
	c.settleOne(sh, m)
}

// settleCounted settles ms, of sh, with a worker counted in by its slot:
// Revoked waits while the slot holds sh, and the worker settles nothing
// once the gate is closed (see settleGate).
func (c *Consumer) settleCounted(sh *shard, ms []*Message, slot *atomic.Pointer[shard]) {
	slot.Store(sh)
	if !sh.gate.closed.Load() {
		for _, m := range ms {
			c.settleOne(sh, m)
		}
	}
	slot.Store(nil)
}

// settleOne calls Source.Settle for m, of a partition the caller counted
// itself in on (see settleSource).
func (c *Consumer) settleOne(sh *shard, m *Message) {
	if m.Refed || m.st.gen != uint32(sh.gen) {
		return
	}
	if err := c.src.Settle(c.bg, m); err != nil {
		c.log.Warn("consumer: settle failed; the message may be redelivered", "partition", m.Partition, "offset", m.Offset, "err", err)
	}
}

// removeSettled takes a settled message out of its lane, and out of the
// counts of its partition's unsettled messages (live) or its lane's spill
// cursor (re-fed). Called with sh.mu held.
func (c *Consumer) removeSettled(sh *shard, l *lane, m *Message) {
	for i, n := 0, l.q.len(); i < n; i++ {
		if l.q.at(i) == m {
			l.q.remove(i)
			if i == 0 && (l.judge != "" || l.judgeSpan != 0) {
				// Written only when set: the line is also the one the
				// delivering goroutine reads for every message (spill.on),
				// and a store per message would take it from that core's
				// cache each time.
				l.judge, l.judgeSpan = "", 0
			}
			break
		}
	}
	sh.count.queued--
	if l.parked {
		c.addParked(l, -1)
	}
	c.unlist(sh, l, m)
}

// unlist counts a settled message out of what tracks its commit: its
// partition's unsettled messages (live), whose commit point the next tick
// raises if m may have been the oldest (see shard.refreshCommit), or its
// lane's spill cursor (re-fed), whose move is handed to the lane's spill
// job. Called with sh.mu held.
func (c *Consumer) unlist(sh *shard, l *lane, m *Message) {
	if l.spill.refed.n > 0 && m.Refed { // n counts l's re-fed messages: most lanes read no message here
		l.t.spillDone.Add(1)
		head := l.spill.refed.remove(m)
		c.spillSettled(l, m)
		if head {
			c.raiseSpillCursor(l)
		}
		return
	}
	sh.settled(m)
}

// commitSync hands the newest of a stream of increasing commit points to a
// slow callee (Source.Commit, SpillLog.Commit) without a lock held during
// the call: whoever advances want tries to become the caller; the caller
// loops until done catches up. Calls never overlap and their values strictly
// increase; a point superseded while a call runs is skipped.
type commitSync struct {
	want atomic.Int64 // highest point computed; -1 none
	done atomic.Int64 // highest point passed to the callee; -1 none
	busy atomic.Bool  // a caller is in the loop
	// stopped ends the loop (revocation); waiters poll busy.
	stopped atomic.Bool
}

func (s *commitSync) init() { s.want.Store(-1); s.done.Store(-1) }

// raise lifts want to p and reports whether it moved.
func (s *commitSync) raise(p int64) bool {
	for {
		w := s.want.Load()
		if p <= w {
			return false
		}
		if s.want.CompareAndSwap(w, p) {
			return true
		}
	}
}

// run calls call with each new point until none is left or another caller
// holds the loop. It returns the last error of call, if any.
func (s *commitSync) run(call func(int64) error) error {
	var err error
	for !s.stopped.Load() && s.want.Load() > s.done.Load() {
		if !s.busy.CompareAndSwap(false, true) {
			return err
		}
		for !s.stopped.Load() {
			w := s.want.Load()
			if w <= s.done.Load() {
				break
			}
			if e := call(w); e != nil {
				err = e
				// Keep done where it was: the next advance retries.
				break
			}
			s.done.Store(w)
		}
		s.busy.Store(false)
		if err != nil {
			return err
		}
	}
	return err
}

// stop ends the loop and waits for a running call to return.
func (s *commitSync) stop() {
	s.stopped.Store(true)
	for s.busy.Load() {
		yield()
	}
}

// settleGate lets Source.Settle run without a shard lock while Revoked waits
// for the calls in progress and stops later ones: a caller counts itself in
// and then checks closed; Revoked sets closed and then waits for the count
// to drop (both sequentially consistent, so one of them sees the other).
type settleGate struct {
	n      atomic.Int64
	closed atomic.Bool
}

func (g *settleGate) enter() bool {
	g.n.Add(1)
	if g.closed.Load() {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *settleGate) exit() { g.n.Add(-1) }

func (g *settleGate) close() {
	g.closed.Store(true)
	for g.n.Load() > 0 {
		yield()
	}
}
