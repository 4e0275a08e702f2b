package consumer

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// This file is the engine's effects: a worker's step on its lane's head,
// run with no lock held. It asks the guard, calls the handler, writes dead
// letters and settles with the source; the decisions come from decide.go,
// and finish (worker.go) applies the result to the lane under its shard's
// lock.

// step makes one move on w.job: a dead letter for the no-tenant bucket or a
// failed dead-letter write; otherwise a permit from the tenant's guard, then
// an attempt, or a judge round for a suspect head.
func (c *Consumer) step(w *worker) {
	w.res = stepResult{settled: w.res.settled[:0]}
	c.stepHead(w)
}

// stepHead is step without clearing w.res: the next message of a run adds
// to what the run's earlier steps settled.
func (c *Consumer) stepHead(w *worker) {
	j := &w.job
	r := &w.res
	m := j.m
	t := j.t
	if t.none {
		reason := dlq.ReasonNoTenant
		if !errors.Is(m.st.rd().tenantErr, ErrNoTenant) {
			reason = dlq.ReasonInvalidTenant
		}
		c.deadLetter(w, m, reason, m.st.rd().tenantErr)
		return
	}
	if !j.fresh {
		if f := m.st.failed(); f != nil && f.dlqReason != "" {
			c.deadLetter(w, m, f.dlqReason, f.lastErr)
			return
		}
	}
	var g *policy.Guard
	lone := j.lone && c.loneOK(t)
	if lone {
		g = c.lone
	} else {
		g = c.guard(t)
	}
	var permit policy.Permit
	// lone admits every attempt: it has no Admit hook and its breaker,
	// recording nothing, stays closed.
	if err := w.allow(c.hctx, g, &permit); err != nil {
		c.parkRefused(w, g, err)
		return
	}
	r.unpark = true
	traceResume(m)
	attempt := 1
	if !j.fresh {
		attempt = int(m.st.attempts) + 1
	}
	if err := g.BeforeAttempt(c.hctx, attempt); err != nil {
		// The hook refused this attempt: not the dependency's failure (the
		// breaker does not count it), not the message's either unless
		// permanent. Wait a backoff and ask again.
		permit.Release()
		if policy.IsPermanent(err) {
			c.noteFailure(w, m, err, false)
			c.deadLetter(w, m, dlq.ReasonPermanent, err)
			return
		}
		r.wait = max(g.Backoff(1, err, m.st.rd().backoff), time.Millisecond)
		return
	}
	jf := judgeFacts{reason: j.judge, probe: permit.Probe(), behind: len(j.span)}
	if j.judge != "" {
		jf.evidence = m.st.rd().evidence
	}
	if judge, headFirst := decideJudgeStart(jf); judge {
		c.judge(w, g, &permit, jf, headFirst)
		return
	}
	c.attempt(w, g, &permit, m, lone)
}

// loneOK reports whether t's head, its lane's only message (job.lone), may
// run on Consumer.lone instead of t's own guard: while the engine tracks
// more than one and a half times MaxIdleTenants tenants (a stream of keys
// mostly seen once, see loneTracked), for a tenant that has no guard yet
// and never had a message handled, no control and no breaker seed from
// the fleet, and whose key the scope holds no guard for (one that outlived
// the tenant's last stay in the engine, perhaps open, is its own). Its
// attempt then records nothing: a success builds no guard at all, and a
// failure builds t's and counts there (see attempt). A key seen once so
// costs the scope nothing; under that pressure its guard would have been
// evicted soon after, success and all.
func (c *Consumer) loneOK(t *tenant) bool {
	if c.lone == nil || t.guardP.Load() != nil || t.handled.Load() != 0 || !c.loneTracked() || t.ctl.Load() != nil {
		return false
	}
	if _, seeded := c.seedOf(t.key); seeded {
		return false
	}
	_, held := c.scope.Peek(t.key)
	return !held
}

// attempt runs the handler on the head m under permit (the permit is done)
// and carries out what decideAttempt says of the outcome. A success is
// settled here without building the outcome: decideAttempt's first case
// (handled: settle), written out because it is every message's path
// (building and copying the outcome and the verdict would cost every
// message; BenchmarkEngine guards this).
//
// With lone, g is Consumer.lone (see loneOK): the outcome is not recorded
// there, and a failure is recorded in the tenant's own guard, made now,
// which takes over.
func (c *Consumer) attempt(w *worker, g *policy.Guard, permit *policy.Permit, m *Message, lone bool) {
	probe := permit.Probe()
	err, panicked := c.call(w, g, m, false)
	if lone {
		permit.Release()
	} else {
		permit.Done(err)
	}
	if err == nil {
		c.handled(w, m) // which forgets its failed probes
		return
	}
	if lone {
		g = c.guard(w.job.t)
		var p policy.Permit
		if g.AllowTo(c.hctx, &p) == nil {
			p.Done(err)
		}
	}
	if w.job.fresh {
		m.st.roundStart = w.callAt // call left it unwritten (see job.fresh)
	}
	o := outcome{err: err, panicked: panicked, probe: probe}
	c.noteFailure(w, m, err, panicked)
	if probe {
		m.st.wr().probeFails++
	}
	o.permanent = policy.IsPermanent(err)
	o.closed = g.Closed()
	o.probeFails = m.st.rd().probeFails
	v := decideAttempt(o, limits{poisonProbes: c.cfg.PoisonProbes})
	if v.act == actAskRetry {
		rd := g.NextRetry(int(m.st.attempts), o.err, m.st.rd().backoff)
		v = decideRetry(rd, c.retryFacts(g, m))
	}
	c.carryOut(w, g, m, o.err, v)
}

// retryFacts gathers decideRetry's inputs for m.
func (c *Consumer) retryFacts(g *policy.Guard, m *Message) retryFacts {
	f := retryFacts{
		attempts:     int(m.st.attempts),
		maxAttempts:  g.MaxAttempts(),
		panicked:     m.st.rd().panicked,
		deadlineLeft: -1,
	}
	if d := g.Deadline(); d > 0 {
		f.deadlineLeft = max(d-time.Duration(c.clock()-m.st.roundStart), 0)
	}
	f.longBackoff = g.Backoff(g.MaxAttempts(), m.st.rd().lastErr, 1<<62)
	return f
}

// carryOut applies a verdict on the head m.
func (c *Consumer) carryOut(w *worker, g *policy.Guard, m *Message, err error, v verdict) {
	r := &w.res
	if v.newRound {
		m.st.attempts = 0
		if f := m.st.failed(); f != nil {
			f.backoff = 0
		}
	}
	if v.suspect != "" {
		r.suspect = v.suspect
	}
	switch v.act {
	case actSettle:
		c.handled(w, m)
	case actDeadLetter:
		c.deadLetter(w, m, v.reason, err)
	case actRetry:
		m.st.wr().backoff = v.delay
		r.wait = v.delay
		w.n.retried.Add(1)
		m.st.lane.t.retried.Add(1)
		traceEvent(m, "retry", v.delay)
		c.emit(Event{Kind: EventRetried, Tenant: m.st.lane.key, Partition: m.Partition, Offset: m.Offset, Err: err, Delay: v.delay})
	case actPark:
		r.park = true
		r.wait = max(g.RetryAfter(), time.Millisecond)
		tracePark(m, r.wait)
	case actSuspect:
		r.suspect = v.reason // judged at its next step, at once
	case actWait:
		c.wait(w, g, m, err)
	}
}

// wait starts a new round for a head without evidence: after a backoff that
// grows round to round, or behind the breaker if it is not closed.
func (c *Consumer) wait(w *worker, g *policy.Guard, m *Message, err error) {
	d := max(g.Backoff(g.MaxAttempts(), err, m.st.rd().backoff), time.Millisecond)
	v := decideWait(g.Closed(), d)
	m.st.attempts = 0
	m.st.wr().backoff = d
	r := &w.res
	if v.act == actPark {
		r.park = true
		r.wait = max(g.RetryAfter(), time.Millisecond)
		tracePark(m, r.wait)
		return
	}
	r.wait = v.delay
}

// judge runs a judge round on the suspect head. The permit covers the
// whole round; its outcome is the round's.
//
// A head that used all its attempts (or its policy's Deadline for the
// round) while the breaker stayed closed, or that failed PoisonProbes
// probes in a row, is suspect. Its round tries the messages behind it, in
// order, up to a span that starts at one and doubles each time they all
// fail (so a run of bad messages cannot stall a lane), stopping at the
// first success. If they all fail, it is an outage: nothing moves and the
// head starts over after a growing backoff. If one succeeds (the winner),
// the head gets one last attempt; if that fails, the messages behind the
// winner are tried the same way (see confirm), and one success among them
// dead-letters the head (reason exhausted, panic or poison), while all
// failing means the outage is back and the head starts over. With no
// message behind the winner, the head is dead-lettered at once. The
// messages that failed before the winner carry the same evidence and are
// judged next; as head, each is tried again, then the messages behind it,
// and if they all fail its evidence is dropped. So a run of poison
// messages needs a success behind each of them.
func (c *Consumer) judge(w *worker, g *policy.Guard, permit *policy.Permit, f judgeFacts, headFirst bool) {
	j, r := &w.job, &w.res
	m := j.m
	if headFirst {
		permit.Restart()
		err, panicked := c.call(w, g, m, true)
		o := outcome{err: err, panicked: panicked}
		if err != nil {
			c.noteFailure(w, m, err, panicked)
			o.permanent = policy.IsPermanent(err)
		}
		v := decideJudgeHead(o, f)
		if v.act != actJudgeNext {
			permit.Done(err)
			c.carryOut(w, g, m, err, v)
			return
		}
	}
	var lastErr error
	for i, alt := range j.span {
		permit.Restart() // the permit's outcome is timed as the winning (or last) call
		aerr, panicked := c.call(w, g, alt, true)
		if aerr != nil {
			c.noteFailure(w, alt, aerr, panicked)
			lastErr = aerr
			continue
		}
		// alt won: the head, and the messages that failed before alt in
		// this round, failed while the dependency worked.
		m.st.wr().evidence = true
		for _, bad := range j.span[:i] {
			bad.st.wr().evidence = true
		}
		permit.Done(nil)
		reordered := Event{Kind: EventReordered, Tenant: j.l.key, Partition: alt.Partition, Offset: alt.Offset, Reason: f.reason}
		last, err := g.Allow(c.hctx)
		if err != nil {
			// Refused (other lanes of the tenant are failing): the evidence
			// stays for the next judge.
			c.handled(w, alt)
			c.emit(reordered)
			c.parkRefused(w, g, err)
			return
		}
		// The head's last attempt follows alt's success at once: settling
		// alt (a Source call) and its event (a user callback) come after
		// it: an outage that ends and returns between the two calls would
		// have the head dead-lettered, and those calls in between would
		// widen that window.
		herr, hpanicked := c.call(w, g, m, true)
		last.Done(herr)
		c.handled(w, alt)
		c.emit(reordered)
		o := outcome{err: herr, panicked: hpanicked}
		if herr != nil {
			c.noteFailure(w, m, herr, hpanicked)
			o.permanent = policy.IsPermanent(herr)
		}
		v := decideJudgeEnd(true, o, false, f)
		if v.act == actDeadLetter && !o.permanent && (i+1 < len(j.span) || len(j.confirm) > 0) {
			c.confirm(w, g, herr, f, i)
			return
		}
		c.carryOut(w, g, m, herr, v)
		return
	}
	permit.Done(lastErr)
	// Everything failed: the tenant is failing broadly now.
	m.st.clearEvidence()
	for _, alt := range j.span {
		alt.st.clearEvidence()
	}
	r.cleared = true
	c.carryOut(w, g, m, lastErr, decideJudgeEnd(false, outcome{}, false, f))
}

// confirm decides a suspect head that failed its last attempt right after
// a winner: the outage may have come back between the two calls (a
// handler that takes a while gives it time to). So the
// messages behind the winner (rest of the span, then j.confirm) are tried,
// in order and under one permit, up to the round's span, until one
// succeeds: then the head failed between two successes and is
// dead-lettered. If they all fail, the dependency is failing again: the
// head's evidence, and that of the messages that failed before the winner,
// is dropped and it waits like a head whose round found no winner. With no
// message behind the winner the head is dead-lettered
// at once (the caller does not come here): waiting for one would hold a
// poison message at the end of its lane until its tenant's next message.
func (c *Consumer) confirm(w *worker, g *policy.Guard, herr error, f judgeFacts, winner int) {
	j, r := &w.job, &w.res
	m := j.m
	rest := j.span[winner+1:]
	permit, err := g.Allow(c.hctx)
	if err != nil {
		// Refused: the tenant's breaker opened (it is failing again). The
		// head parks with its evidence, checked again at its next judge.
		c.parkRefused(w, g, err)
		return
	}
	won := -1
	var lastErr error
	cand := func(k int) *Message {
		if k < len(rest) {
			return rest[k]
		}
		return j.confirm[k-len(rest)]
	}
	for k := range min(len(rest)+len(j.confirm), max(len(j.span), 1)) {
		cm := cand(k)
		permit.Restart()
		cerr, panicked := c.call(w, g, cm, true)
		if cerr != nil {
			c.noteFailure(w, cm, cerr, panicked)
			lastErr = cerr
			continue
		}
		won = k
		break
	}
	if won < 0 {
		permit.Done(lastErr)
		m.st.clearEvidence()
		for _, bad := range j.span[:winner] {
			bad.st.clearEvidence()
		}
		r.cleared = true
		c.carryOut(w, g, m, herr, decideConfirm(false, f))
		return
	}
	permit.Done(nil)
	for k := range won {
		cand(k).st.wr().evidence = true // failed while a later message succeeded
	}
	cm := cand(won)
	c.handled(w, cm)
	c.emit(Event{Kind: EventReordered, Tenant: j.l.key, Partition: cm.Partition, Offset: cm.Offset, Reason: f.reason})
	c.carryOut(w, g, m, herr, decideConfirm(true, f))
}

// call runs the handler on m under the attempt's context, turning a panic
// into an error. An attempt of a round gets AttemptTimeout, or what is left
// of the round's Deadline if less; a judge's attempt (judged) is a round of
// its own: a suspect head's last chance must not inherit the few
// milliseconds its spent round left, or the judge would take a timeout for
// evidence against it.
func (c *Consumer) call(w *worker, g *policy.Guard, m *Message, judged bool) (err error, panicked bool) {
	now := c.clock()
	roundStart := now // a fresh message's round begins with this call
	if judged || !w.job.fresh {
		if m.st.attempts == 0 || judged {
			m.st.roundStart = now
		}
		roundStart = m.st.roundStart
	}
	w.callAt = now
	timeout := g.AttemptTimeout()
	// hang: the attempt's time is its own AttemptTimeout, not what is left
	// of the round's Deadline. Only running out the former is a hang (as
	// policy.Run marks it); running out the Deadline is an ordinary failure.
	hang := timeout > 0
	if d := g.Deadline(); d > 0 {
		left := max(d-time.Duration(now-roundStart), time.Millisecond)
		if timeout <= 0 || left < timeout {
			timeout, hang = left, false
		}
	}
	var deadline int64
	if timeout > 0 {
		deadline = now + int64(timeout)
	}
	// A quick run's calls share one begin and one end of the worker's
	// context (two locked writes a call otherwise) while nothing observed
	// or cancelled it and the deadline a call would get is the same
	// (the engine clock moves once a tick): see worker.callOpen.
	keep := w.job.quick && len(w.job.run) > 0 && !judged
	ctx := w.ctx()
	if !w.callOpen || ctx.deadline.Load() != deadline || ctx.dirty.Load() || c.hdone.Load() {
		w.endCall()
		ctx = w.ctx()
		ctx.begin(deadline)
	}
	w.callOpen = false
	defer func() {
		r := recover()
		if r == nil && keep && !ctx.dirty.Load() {
			w.callOpen = true // ended by the run's next call or its end
		} else {
			w.closeCall(ctx)
		}
		if r != nil {
			buf := make([]byte, 2048)
			buf = buf[:runtime.Stack(buf, false)]
			err = &PanicError{Value: r, Stack: string(buf)}
			panicked = true
		}
	}()
	if m.st.traced {
		// The handler's own spans are children of the process span.
		err = c.cfg.Handler.Handle(trace.ContextWithSpan(ctx, m.st.fail.span), m)
	} else {
		err = c.cfg.Handler.Handle(ctx, m)
	}
	if err != nil && hang && ctx.expired.Load() {
		// The attempt ran out its AttemptTimeout: a hang, which the
		// breaker weighs as policy.Breaker.TimeoutFailures.
		err = policy.AttemptTimedOut(err)
	}
	return err, false
}

// PanicError is the failure recorded when a handler panics.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("consumer: handler panic: %v", e.Value) }

// noteFailure records a failed attempt of m.
func (c *Consumer) noteFailure(w *worker, m *Message, err error, panicked bool) {
	now := time.Now()
	w.n.failed.Add(1)
	m.st.lane.t.failed.Add(1)
	m.st.attempts++
	f := m.st.wr()
	f.total++
	if f.first.IsZero() {
		f.first = now
	}
	f.last = now
	f.lastErr = err
	f.panicked = panicked
	traceAttempt(m, f.total, err, panicked)
	if panicked {
		w.n.panics.Add(1)
		c.emit(Event{Kind: EventPanicked, Tenant: m.st.lane.key, Partition: m.Partition, Offset: m.Offset, Err: err})
	}
}

// handled settles m after its handler succeeded. A quick lane's run (see
// creditOf: at most runMax messages, about quickTurn by its estimate)
// counts its handled messages and settles them with the source together
// when the run ends (settleRun), as its watermark commit already does:
// one count-in for Revoked's wait and one locked add instead of one each
// per message.
func (c *Consumer) handled(w *worker, m *Message) {
	w.res.handled++ // the tenant's count: added in finish
	if !w.job.fresh {
		m.st.clearProbeFails()
	}
	if w.job.quick {
		w.runHandled++
		if !c.settleNoop {
			w.unsettled = append(w.unsettled, m)
		}
	} else {
		w.n.handled.Add(1)
		c.settleSource(m.st.lane.sh, m, &w.settling)
	}
	w.res.settled = append(w.res.settled, m)
	if m.st.traced {
		traceHandled(m)
	}
}
