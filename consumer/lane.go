package consumer

import (
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ringfence/ringfence/dlq"
)

// lane is one tenant's ordered stream from one partition. Every field is
// guarded by its shard's mu, except where noted.
//
// A lane's messages are in q (runnable, in order: messages re-fed from the
// spill log first, then live ones) and, while the lane spills, in pend (live
// messages waiting to be appended to the spill log, newer than everything
// in q). Only the worker that owns the lane (state laneRunning) touches the
// head's bookkeeping; the others only append.
type lane struct {
	sh  *shard
	t   *tenant
	key string // t.key, or "" for the no-tenant bucket
	h   uint64 // keyHash(key): where the lane is in its shard's lanes

	q    msgRing
	pend msgRing

	state  laneState
	parked bool // refused by the breaker; q's messages count as parked
	// holdPark: parked by its tenant's Hold or Quarantine, not by the
	// breaker; unparked when released (see releaseLane).
	holdPark bool
	dead     bool // dropped (partition revoked or lane swept)
	// hits counts the messages it received since it was made, up to 2; the
	// idle sweep sets it back to 1 when it looks at the lane, so 2 means a
	// message since (see sweepLanes).
	hits   uint8
	credit int // fair-share turns left before the lane yields its worker
	// quick: the credit was multiplied for a tenant of quick calls (see
	// creditOf); a run of the lane then counts as one job of its worker's
	// turn on the shard, not one per message.
	quick bool
	// quickNow: its tenant's calls were quick at the lane's last finish
	// (see quickNow, runQuick). Unlike quick, which holds for the turn
	// credit it came with, it is read again at every finish.
	quickNow bool
	// ahead: its messages count against its partition's ReadAhead while it
	// is neither parked nor spilling: its tenant's calls were quick at its
	// last finish, or it has not finished a job yet (a lane's first
	// messages must not pile up to MaxQueuedPerPartition before its first
	// call tells). rq is how many count now (see recount).
	ahead bool
	rq    int

	// judge, when set, means the head is suspect and says why (exhausted,
	// panic or poison); see Consumer.judge. judgeSpan is
	// how many of the following messages the next judge may try.
	judge     dlq.Reason
	judgeSpan int
	// tried: a message of q may have failed, been refused or been judged
	// (its state holds a failState, msgState.failSet). Set by msgState.wr,
	// cleared when q empties (finish); q only ever gains fresh messages.
	// While it is clear, a worker steps the lane's messages without reading
	// their states (see job.fresh). Written only on a change. The
	// no-tenant bucket is never stepped fresh, so its mark means nothing
	// (its messages get their state before their lane, in tenantOf).
	tried atomic.Bool

	// timer wakes the lane after a retry backoff, a park or a spill
	// back-off; timerSeq tells a stale firing from the current one.
	timer    *time.Timer
	timerSeq uint64

	// aside counts its messages set aside (their dead letters cannot be
	// written): out of q, still its tenant's, so the lane is kept.
	aside int

	// shared: the lane was handed to something that may hold it past its
	// drop without the shard's lock (a timer, its tenant's blocked list,
	// the spill queue or its log's commit loop), so a dropped lane's
	// memory is reused only if it is clear (see shard.freeLane).
	shared bool

	spill laneSpill
}

// idle reports whether the lane holds nothing and waits for nothing: no
// message queued, waiting to spill, re-fed or set aside, no job, timer,
// spill job or spill back-off, not spilling, and its spill cursor
// committed (no later lane of its tenant would commit it). Only such a
// lane is dropped by the sweep (see sweepLanes). Called with its shard's mu
// held.
func (l *lane) idle() bool {
	return l.state == laneIdle && l.q.len() == 0 && l.pend.len() == 0 && l.aside == 0 &&
		!l.spill.on && !l.spill.job && !l.spill.wait && l.spill.refed.n == 0 &&
		l.spill.commit.want.Load() <= l.spill.commit.done.Load()
}

// firstLive returns the lane's oldest live (not re-fed) message, or nil.
// Called with its shard's mu held.
func (l *lane) firstLive() *Message {
	for i := range l.q.len() {
		if m := l.q.at(i); !m.Refed {
			return m
		}
	}
	if l.pend.len() > 0 {
		return l.pend.front()
	}
	return nil
}

// laneState is where a lane is in the scheduler.
type laneState uint8

const (
	laneIdle    laneState = iota // nothing runnable, or nothing to do
	laneReady                    // in its shard's ready queue
	laneRunning                  // a worker owns the head
	laneTimer                    // waiting for its timer (retry, park)
	laneBlocked                  // its tenant is at its bulkhead limit
	laneHeld                     // its tenant's control holds or quarantines it (see holdLane)
)

func (s laneState) String() string {
	return [...]string{"idle", "ready", "running", "timer", "blocked", "held"}[s]
}

// laneSpill is a lane's spill state (guarded by the shard's mu, except the
// commit fields, see commitSync).
type laneSpill struct {
	on     bool        // spill mode: live messages go to pend, then the log
	want   bool        // a trigger asked for spill mode; entered when the lane is not running
	reason SpillReason // why it spilled, for events and stats
	job    bool        // a spill job for this lane is queued or running
	wait   bool        // the job backs off after a failure (timer armed)
	fails  int         // consecutive failed Append/Read calls
	// readPos is the next log position to read; -1 means from the
	// committed cursor (a lane recovered from Pending).
	readPos int64
	// refed lists the re-fed messages not yet settled, in log order; its
	// head is where the cursor may be committed to.
	refed msgList
	// refedIDs remembers the original offsets of the last refedMemory
	// messages re-fed: a second copy of one of them (a torn append, a
	// crash between an append and its settle) is dropped. Copies are found
	// by identity, never by order: a source may deliver a redelivery after
	// later messages (NATS after AckWait), so a lower offset is not a copy.
	refedIDs  map[int64]struct{}
	refedRing []int64
	refedNext int
	commit    commitSync
	// out counts the messages this lane appended to its log that are not
	// yet re-fed and settled (nor dropped as copies); born is the produce
	// time (engine clock, see bornOf) of the oldest of them, or of the
	// last one settled while the next is still in the log unread (whose
	// time is not known yet, and is no older).
	out  int
	born int64
	// kept is what the engine knew against the head it spilled, for that
	// message's re-fed copy (see spillVerdict); nil: nothing.
	kept *spillVerdict
}

// fifo is a queue that can also take out an element in the middle (a
// judge round handles a message behind the head) and put elements back in
// front: a lane's messages (msgRing) and a partition's ready lanes
// (laneQueue).
type fifo[T any] struct {
	buf  []T
	head int
}

// msgRing is a lane's queue of messages.
type msgRing = fifo[*Message]

func (r *fifo[T]) len() int   { return len(r.buf) - r.head }
func (r *fifo[T]) at(i int) T { return r.buf[r.head+i] }
func (r *fifo[T]) front() T   { return r.buf[r.head] }

func (r *fifo[T]) push(x T) {
	if r.head > 0 && len(r.buf) == cap(r.buf) && r.head*2 >= len(r.buf) {
		n := copy(r.buf, r.buf[r.head:])
		clear(r.buf[n:])
		r.buf = r.buf[:n]
		r.head = 0
	}
	if len(r.buf) == cap(r.buf) && cap(r.buf) > 0 {
		// Growing: the old array may be a lane's first slots, shared with
		// its partition's other lanes (see shard.newLane), which must not
		// keep the messages it held.
		old := r.buf
		r.buf = append(r.buf, x)
		clear(old)
		return
	}
	r.buf = append(r.buf, x)
}

// pop removes and returns the front.
func (r *fifo[T]) pop() T { return r.remove(0) }

// pushFront puts xs, in order, before the current front.
func (r *fifo[T]) pushFront(xs []T) {
	if len(xs) == 0 {
		return
	}
	if r.head >= len(xs) {
		r.head -= len(xs)
		copy(r.buf[r.head:], xs)
		return
	}
	rest := r.buf[r.head:]
	nb := make([]T, 0, len(xs)+len(rest)+4)
	nb = append(nb, xs...)
	nb = append(nb, rest...)
	r.buf, r.head = nb, 0
}

// remove takes out the i-th element from the front.
func (r *fifo[T]) remove(i int) T {
	var zero T
	j := r.head + i
	x := r.buf[j]
	if i == 0 {
		r.buf[j] = zero
		r.head++
	} else {
		copy(r.buf[j:], r.buf[j+1:])
		r.buf[len(r.buf)-1] = zero
		r.buf = r.buf[:len(r.buf)-1]
	}
	if r.head == len(r.buf) {
		r.buf = r.buf[:0]
		r.head = 0
	}
	return x
}

// takeFrom removes and returns the elements from index i to the end.
func (r *fifo[T]) takeFrom(i int, into []T) []T {
	j := r.head + i
	into = append(into, r.buf[j:]...)
	clear(r.buf[j:])
	r.buf = r.buf[:j]
	if r.head == len(r.buf) {
		r.buf = r.buf[:0]
		r.head = 0
	}
	return into
}

// reset drops everything.
func (r *fifo[T]) reset() {
	clear(r.buf)
	r.buf, r.head = nil, 0
}

// msgList is an intrusive doubly linked list of messages (through
// msgState.lprev/lnext): a lane's unsettled re-fed messages in log order.
// Its memory is the messages themselves, so it grows with what is
// unsettled, never with what was settled behind a stuck message.
type msgList struct {
	head, tail *Message
	n          int
}

func (l *msgList) pushBack(m *Message) {
	m.st.lprev, m.st.lnext = l.tail, nil
	if l.tail != nil {
		l.tail.st.lnext = m
	} else {
		l.head = m
	}
	l.tail = m
	m.st.listed = true
	l.n++
}

// remove unlinks m and reports whether it was the head.
func (l *msgList) remove(m *Message) (wasHead bool) {
	if !m.st.listed {
		return false
	}
	wasHead = l.head == m
	if m.st.lprev != nil {
		m.st.lprev.st.lnext = m.st.lnext
	} else {
		l.head = m.st.lnext
	}
	if m.st.lnext != nil {
		m.st.lnext.st.lprev = m.st.lprev
	} else {
		l.tail = m.st.lprev
	}
	m.st.lprev, m.st.lnext, m.st.listed = nil, nil, false
	l.n--
	return wasHead
}

// reset forgets every message.
func (l *msgList) reset() {
	for m := l.head; m != nil; {
		next := m.st.lnext
		m.st.lprev, m.st.lnext, m.st.listed = nil, nil, false
		m = next
	}
	*l = msgList{}
}

// msgState is the engine's bookkeeping for one message. Each field is
// guarded by the shard's mu or owned by the worker that runs the message's
// lane (never read under a lock by anyone else), as marked; lane, lprev and
// lnext by the shard's mu, fail by the worker.
//
// It is 64 bytes, the last of a 256-byte Message (a size class whose
// objects, and the elements of a source's []Message, start on a cache
// line): the delivering goroutine writes it and the worker reads it, so
// a message's state crosses between cores as one line, not two
// (BenchmarkEngine at 4 partitions guards this). Keep it at 64 bytes
// (TestMessageLayout).
type msgState struct {
	lane         *lane
	lprev, lnext *Message // meaningful only while listed
	fail         *failState
	// msgScalars are written whole when the message is delivered (see
	// tenantOf): two 16-byte stores, and none to the pointers above.
	msgScalars
}

// msgScalars are the pointer-free fields of a message's state.
type msgScalars struct {
	at         int64  // engine clock at delivery (ns)
	roundStart int64  // engine clock when the current round began (worker)
	gen        uint32 // partition assignment generation at delivery (low bits)
	attempts   int32  // attempts in the current round (worker)

	failSet bool // fail is this delivery's (else it means nothing) (worker)
	listed  bool // in its lane's re-fed list (shard mu)
	late    bool // delivered after a higher offset: in its shard's late (shard mu)
	spilled bool // in pend or being appended (not runnable) (shard mu)
	aside   bool // set aside: its dead letter cannot be written (shard mu)
	// traced: fail holds the message's process span (see tracer.start),
	// even while failSet is false. Set where the message reaches the
	// engine, before it is queued.
	traced bool
	// noted: fail holds the message's spill note (see Message.SpillNote),
	// even while failSet is false.
	noted bool
}

// failState is the part of a message's state that only a message that
// failed, was refused or has a bad tenant needs: allocated on the first
// write (wr), so that a message handled at its first attempt carries a
// small msgState (Message is a 256-byte allocation instead of 448).
type failState struct {
	tenantErr  error
	total      int           // attempts in all
	backoff    time.Duration // the last backoff
	first      time.Time
	last       time.Time
	lastErr    error
	panicked   bool
	probeFails int
	evidence   bool // failed in a judge round that a later message won
	tparked    bool // its span's last park event has no resume yet (see tracePark)
	dlqReason  dlq.Reason
	dlqFails   int
	asideAt    int64  // engine clock of its last set-aside write
	note       []byte // the spill note, while msgScalars.noted
	// span is the message's process span (see msgScalars.traced).
	span trace.Span
}

// noFail is what rd returns for a message that never failed. Never written.
var noFail failState

// rd returns the failure state for reading.
func (s *msgState) rd() *failState {
	if s.failSet {
		return s.fail
	}
	return &noFail
}

// failed returns the failure state, or nil if the message never failed.
func (s *msgState) failed() *failState {
	if s.failSet {
		return s.fail
	}
	return nil
}

// wr returns the failure state for writing, allocating it if needed.
func (s *msgState) wr() *failState {
	if !s.failSet {
		if s.traced {
			s.failSet = true // fail holds the span alone so far
		} else {
			s.fail, s.failSet = new(failState), true
		}
		if l := s.lane; l != nil && !l.tried.Load() {
			l.tried.Store(true)
		}
	}
	return s.fail
}

// clearProbeFails forgets the half-open probes it failed (it succeeded).
func (s *msgState) clearProbeFails() {
	if f := s.failed(); f != nil {
		f.probeFails = 0
	}
}

// clearEvidence forgets that a judge round had evidence against it.
func (s *msgState) clearEvidence() {
	if f := s.failed(); f != nil {
		f.evidence = false
	}
}
