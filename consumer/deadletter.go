package consumer

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// This file is dead letters: writing a message's record to its tenant's
// DLQ (deadLetter), and setting aside one the DLQ can never write
// (setAside, retryAside). When a message is dead-lettered is decided in
// decide.go and judged in step.go.

// asideState holds a partition's messages whose dead letter cannot be
// written (see setAside): out of their lanes, still unsettled (counted in
// commit.unsettled and count.queued). Guarded by the shard's mu, but busy.
type asideState struct {
	msgs []*Message
	busy atomic.Bool // a retry of msgs runs (retryAside)
}

// deadLetter writes m to its tenant's DLQ and settles it. While the DLQ
// refuses it, m stays unsettled at the head of its lane and is written
// again after a wait that doubles from DLQRetry up to DLQProbe (each write
// a probe of the DLQ); a record the sink says can never be written is set
// aside (see setAside).
func (c *Consumer) deadLetter(w *worker, m *Message, reason dlq.Reason, cause error) {
	l := m.st.lane
	rec := c.record(l, m, reason, cause)
	err := c.cfg.DLQ.Write(c.hctx, rec)
	if err != nil {
		f := m.st.wr()
		f.dlqReason = reason
		f.dlqFails++
		wait, aside := decideDLQFailed(f.dlqFails, c.cfg.DLQRetry, c.cfg.DLQProbe, errors.Is(err, dlq.ErrUnwritable))
		if aside {
			w.n.unwritable.Add(1)
			l.t.unwritable.Add(1)
			c.log.Error("consumer: dead letter cannot be written; message set aside, holding its partition's commit", "tenant", l.key, "partition", m.Partition, "offset", m.Offset, "reason", reason, "err", err)
			c.emit(Event{Kind: EventDLQUnwritable, Tenant: l.key, Partition: m.Partition, Offset: m.Offset, Err: err, Reason: reason})
			traceEvent(m, "set-aside", 0)
			w.res.aside = m
			return
		}
		w.n.dlqFails.Add(1)
		c.dlqRefused(l.t, m, err, wait)
		c.emit(Event{Kind: EventDLQFailed, Tenant: l.key, Partition: m.Partition, Offset: m.Offset, Err: err, Reason: reason, Delay: wait})
		traceEvent(m, "dlq-failed", wait)
		w.res.wait = wait
		return
	}
	c.dlqTook(l.t)
	w.n.dead.Add(1)
	l.t.dead.Add(1)
	c.settleSource(l.sh, m, &w.settling)
	w.res.settled = append(w.res.settled, m)
	traceDead(m, reason, cause)
	c.emit(Event{Kind: EventDeadLettered, Tenant: l.key, Partition: m.Partition, Offset: m.Offset, Err: cause, Reason: reason})
}

// dlqRefused notes that t's DLQ refused m's dead letter (not for good):
// the DLQ is unavailable until a write succeeds (TenantStats.DLQUnavailable).
// The first refusal of an outage is logged, not each probe after it.
func (c *Consumer) dlqRefused(t *tenant, m *Message, err error, wait time.Duration) {
	t.dlqFails.Add(1)
	if t.dlqDownAt.Load() != 0 || !t.dlqDownAt.CompareAndSwap(0, max(c.clock(), 1)) || c.hctx.Err() != nil {
		return
	}
	c.log.Warn("consumer: DLQ unavailable; the tenant's dead letter and the messages behind it wait, probing the DLQ", "tenant", t.key, "partition", m.Partition, "offset", m.Offset, "err", err, "retry_in", wait, "probe_every", c.cfg.DLQProbe)
}

// dlqTook notes that t's DLQ took a dead letter: if it was unavailable, it
// is back.
func (c *Consumer) dlqTook(t *tenant) {
	at := t.dlqDownAt.Load()
	if at == 0 || !t.dlqDownAt.CompareAndSwap(at, 0) {
		return
	}
	c.log.Info("consumer: DLQ available again", "tenant", t.key, "down_for", time.Duration(max(c.clock()-at, 0)))
}

// record builds m's dead-letter record.
func (c *Consumer) record(l *lane, m *Message, reason dlq.Reason, cause error) *dlq.Record {
	rec := &dlq.Record{
		Key:          m.Key,
		Value:        m.Value,
		Headers:      m.Headers,
		Source:       m.Topic,
		Partition:    m.Partition.ID,
		Offset:       m.Offset,
		Group:        c.cfg.Group,
		Attempts:     m.st.rd().total,
		FirstFailure: m.st.rd().first,
		LastFailure:  m.st.rd().last,
		Reason:       reason,
		TraceParent:  traceParent(m),
	}
	if !l.t.none {
		rec.Tenant = l.key
	}
	if rec.FirstFailure.IsZero() {
		now := time.Now()
		rec.FirstFailure, rec.LastFailure = now, now
	}
	if cause != nil {
		rec.Error, rec.ErrorType = dlq.CapError(cause)
	}
	rec.Redrive = dlq.RedriveCount(m.Headers)
	if m.Stream != "" {
		rec.Stream, rec.Sequence = m.Stream, uint64(m.Offset)
		rec.Offset = -1
	}
	return rec
}

// setAside takes a head whose dead letter cannot be written out of its lane,
// so its tenant moves on; it stays unsettled (holding its partition's
// commit, as at-least-once requires) and its write is tried again every
// asideRetry, in case the DLQ's limits change. Called with sh.mu held.
func (c *Consumer) setAside(sh *shard, l *lane, m *Message) {
	for i, n := 0, l.q.len(); i < n; i++ {
		if l.q.at(i) == m {
			l.q.remove(i)
			if i == 0 {
				l.judge, l.judgeSpan = "", 0
			}
			break
		}
	}
	if l.parked {
		c.addParked(l, -1)
	}
	m.st.aside = true
	m.st.wr().asideAt = c.clock()
	sh.aside.msgs = append(sh.aside.msgs, m)
	l.aside++
}

// asideRetry is how often a set-aside dead letter is tried again.
const asideRetry = time.Minute

// retryAside tries to write the dead letters of sh's set-aside messages
// that are due, settling those that succeed. Run by housekeeping on its own
// goroutine, with no lock held.
func (c *Consumer) retryAside(sh *shard, ms []*Message) {
	defer sh.aside.busy.Store(false)
	var done []*Message
	for _, m := range ms {
		l := m.st.lane
		rec := c.record(l, m, m.st.rd().dlqReason, m.st.rd().lastErr)
		if err := c.cfg.DLQ.Write(c.hctx, rec); err != nil {
			continue
		}
		c.dlqTook(l.t)
		c.stats.dead.Add(1)
		l.t.dead.Add(1)
		var d dwellRun
		d.add(c, &l.t.dwell, m, c.clock())
		d.flush(&l.t.dwell)
		c.settleSource(sh, m, nil)
		done = append(done, m)
		traceDead(m, m.st.rd().dlqReason, m.st.rd().lastErr)
		c.emit(Event{Kind: EventDeadLettered, Tenant: l.key, Partition: m.Partition, Offset: m.Offset, Err: m.st.rd().lastErr, Reason: m.st.rd().dlqReason})
	}
	if len(done) == 0 {
		return
	}
	sh.mu.Lock()
	if !sh.dead {
		for _, m := range done {
			for i, x := range sh.aside.msgs {
				if x == m {
					sh.aside.msgs = append(sh.aside.msgs[:i], sh.aside.msgs[i+1:]...)
					break
				}
			}
			m.st.lane.aside--
			sh.count.queued--
			sh.settled(m) // the next tick commits past it
		}
	}
	sh.mu.Unlock()
}
