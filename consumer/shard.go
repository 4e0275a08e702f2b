package consumer

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// shard is the engine's state of one assigned partition: its lanes, the
// queue of lanes ready to run, and its watermark. Deliveries, scheduling and
// settles of one partition take only its mu; the engine-wide structures
// (the tenant table, the scheduler's ring of shards) are touched only when a
// lane appears or leaves, or the shard runs out of ready lanes.
type shard struct {
	c         *Consumer
	p         Partition
	gen       uint64 // assignment generation
	maxQueued int    // MaxQueuedPerPartition, lowered to the source's capacity
	// maxParkedTenant and maxQueuedTenant are MaxParkedPerTenant and
	// MaxQueuedPerTenant, capped at a half and an eighth of maxQueued: a
	// broker window smaller than the configured bounds (a NATS consumer's
	// MaxAckPending) must make a stuck or hot tenant spill, not fill the
	// window and pause the partition.
	maxParkedTenant, maxQueuedTenant int
	// readAhead is Config.ReadAhead, or 0 (off) where it is not below
	// maxQueued.
	readAhead int

	mu    sync.Mutex
	dead  bool             // revoked
	lanes map[string]*lane // by tenant key
	none  *lane            // the no-tenant bucket's lane
	ready laneQueue        // lanes ready to run, in turn order
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
	late   []*Message
	next   int64 // offset after the last delivered message; -1 before any
	queued int   // messages in this partition's lanes (q and pend)
	parked int   // of them, those in parked lanes' q (see addParked)
	// quickQueued is how many of them count against readAhead: the sum of
	// the lanes' rq (see recount).
	quickQueued int
	aheadLanes  int // lanes whose rq is not zero
	// pausedAt is the engine clock when the engine last paused the
	// partition; aheadOff is set when housekeeping lifted a read-ahead
	// pause whose count did not fall (see maintain), and cleared once
	// quickQueued is down to half of readAhead.
	pausedAt int64
	aheadOff bool
	// pauseReason is why the engine wants the partition paused (zero: it
	// does not).
	pauseReason PauseReason
	sweepAt     int // lanes count that triggers an idle sweep
	// aside holds messages whose dead letter cannot be written: out of
	// their lanes, still unsettled (in wm and queued).
	aside     []*Message
	asideBusy atomic.Bool // a retry of aside runs

	inRing bool // in the scheduler's ring; guarded by sched.mu
	// quick counts the workers holding a quick lane of this shard (see
	// runQuick), quickMax how many of them are enough (quickFull: the
	// engine's quickWorkers, one fewer once a source delivered to it one
	// message at a time, see Consumer.Deliver); takes counts lanes taken,
	// for housekeeping to tell a shard whose workers all hang (see
	// sched.rescue).
	quick     int
	quickMax  int
	quickGen  uint64 // bumped when rescue forgets the count
	takes     uint64
	lastTakes uint64 // takes at the last rescue check; housekeeping's own
	rescues   uint64 // times rescue found it stuck (PartitionStats.Rescues)

	pause  pauseSync  // the wish applied to Source.Pause/Resume
	commit commitSync // watermark commits to Source.Commit

	// What a worker's run reads without the lock, at every message (see
	// runOn), on a line of its own: next to the counts that DeliverBatch
	// writes for every message, each read was a miss on the line the
	// other core had just written.
	_ [64]byte
	// readyHint is set whenever a lane joins ready and cleared (under mu)
	// only when ready is empty: a worker's run reads it without the lock
	// to yield to lanes that became ready meanwhile (see runOn).
	readyHint atomic.Bool
	gate      settleGate // Source.Settle calls in progress
	_         [64]byte
}

func newShard(c *Consumer, p Partition, gen uint64, maxQueued int) *shard {
	sh := &shard{c: c, p: p, gen: gen, maxQueued: maxQueued, lanes: make(map[string]*lane), next: -1, oldestAt: -1, sweepAt: 1024, quickMax: c.quickWorkers}
	sh.maxParkedTenant = min(c.cfg.MaxParkedPerTenant, max(maxQueued/2, 1))
	sh.maxQueuedTenant = min(c.cfg.MaxQueuedPerTenant, max(maxQueued/8, 1))
	if c.cfg.ReadAhead < maxQueued {
		sh.readAhead = c.cfg.ReadAhead
	}
	sh.commit.init()
	return sh
}

// eachLane calls f for each of sh's lanes, the no-tenant bucket's
// included. Called with sh.mu held.
func (sh *shard) eachLane(f func(*lane)) {
	for _, l := range sh.lanes {
		f(l)
	}
	if sh.none != nil {
		f(sh.none)
	}
}

// oldest returns the partition's oldest unsettled live message, or nil:
// the first live message of a lane's queue (re-fed ones come first), else
// the front of its pend (newer than its queue), a set-aside one, or a late
// one. Offsets grow in delivery order but for the late ones, so it is the
// one of least offset. Called with sh.mu held.
func (sh *shard) oldest() *Message {
	o := sh.oldestInOrder()
	for _, m := range sh.late {
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
	for _, m := range sh.aside {
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

// heldRef is what Stats needs of an unsettled message: copied under the
// shard's lock, sorted after it.
type heldRef struct {
	off, at int64
	t       *tenant
	key     string
}

// heldRefs appends the partition's unsettled live messages to into, in no
// particular order (for Stats). Called with sh.mu held.
func (sh *shard) heldRefs(into []heldRef) []heldRef {
	add := func(m *Message) {
		l := m.st.lane
		into = append(into, heldRef{off: m.Offset, at: m.st.at, t: l.t, key: l.key})
	}
	for _, m := range sh.aside {
		add(m)
	}
	sh.eachLane(func(l *lane) {
		for i := range l.q.len() {
			if m := l.q.at(i); !m.Refed {
				add(m)
			}
		}
		for i := range l.pend.len() {
			add(l.pend.at(i))
		}
	})
	return into
}

// settled counts a live message of sh as settled, and marks the commit
// point for a new scan if m may have been the oldest (see refreshCommit).
// Called with sh.mu held.
func (sh *shard) settled(m *Message) {
	sh.unsettled--
	if len(sh.late) > 0 && m.st.late {
		m.st.late = false
		if i := slices.Index(sh.late, m); i >= 0 {
			sh.late = slices.Delete(sh.late, i, i+1)
		}
	}
	if !sh.stale && (sh.oldestAt < 0 || m.Offset <= sh.oldestAt) {
		sh.stale = true
	}
}

// scanLanes is how many lanes a partition may hold for its commit point to
// be found at every tick. With more, the scans are spaced out in proportion,
// up to scanMax apart: a scan reads each lane's head, cold lines, and at
// every tick the 250 lanes a partition of BenchmarkHandler's 1000 tenants
// holds cost that row ~3% of its throughput. A later commit costs nothing
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
	if !force && (!sh.stale || now-sh.scannedAt < min(int64(tick)*int64(len(sh.lanes)/scanLanes), int64(scanMax))) {
		return
	}
	sh.stale, sh.scannedAt = false, now
	p := sh.next
	sh.oldestAt = -1
	if m := sh.oldest(); m != nil {
		p, sh.oldestAt = m.Offset, m.Offset
	}
	sh.commit.raise(p)
}

// laneFor returns the lane of key in sh, making it on first sight. Called
// with sh.mu held; it takes the tenant table's lock when it makes a lane.
func (sh *shard) laneFor(key string, none bool) *lane {
	if none {
		if sh.none == nil {
			sh.none = &lane{sh: sh, t: sh.c.tenantFor("", true)}
		}
		return sh.none
	}
	if l := sh.lanes[key]; l != nil {
		return l
	}
	t := sh.c.tenantFor(key, false)
	l := &lane{sh: sh, t: t, key: t.key, ahead: true}
	l.spill.readPos = -1
	l.spill.commit.init()
	sh.lanes[t.key] = l
	return l
}

// laneQueue is a partition's queue of ready lanes.
type laneQueue = fifo[*lane]

// sched hands shards with ready lanes to workers. Its ring holds exactly
// the shards whose ready queue is not empty (kept so under both locks: a
// shard enters or leaves only while its own mu and sched.mu are held). Idle
// workers wait on cond; a shard entering the ring wakes one, and a worker
// that takes a lane while more are ready wakes the next (a chain), so a
// burst wakes workers without a signal per message.
//
// A woken worker is searching until it takes a lane or waits again. A lane
// made ready wakes a worker only if none is searching, and a worker that
// takes a lane while n more of its partition are ready wakes another only
// if n is more than the workers searching (they will take those): the
// searchers take the work that would have woken more. A searcher that
// takes a lane wakes the next if any lane is still ready and no other
// worker searches (stopSearching). So a ready lane always has a worker
// awake and not in a handler to take it while any sleeps; a backlog wakes
// workers as fast as they take lanes; and a stream of messages that one
// worker keeps up with, arriving one at a time, does not wake a second per
// message (Go's scheduler keeps its spinning threads the same way).
//
// Workers on quick lanes are the exception (see runQuick): once a
// partition has as many of them as cores, a worker that takes a quick lane
// wakes no other, and a worker that comes to the partition waits instead.
// They are not waiting for a dependency, so they take the partition's
// ready lanes themselves; if their calls all hang, housekeeping sees the
// partition take no lane for a tick and wakes one (rescue).
type sched struct {
	mu     sync.Mutex
	ring   []*shard
	cursor int
	// sleepers are the idle workers not yet signalled, the most recently
	// idle last: a signal wakes the last (see wakeFor).
	sleepers []*worker
	idle     int // workers waiting for a signal
	// signalled of them were signalled and have not yet returned from
	// the wait (idle - signalled is len(sleepers) until shutdown, which
	// wakes every sleeper without counting it).
	signalled int
	stop      bool // draining: workers return
	// wakeable mirrors idle - signalled for a lock-free look: the idle
	// workers a Signal would wake. A lane made ready while workers sleep
	// must wake one even if its shard is in the ring; and a worker that took
	// a lane while more are ready (chain) need not take mu when every idle
	// worker is signalled already (with many tenants that was most calls:
	// ~60 ns a message on mu's line, for no wake-up).
	wakeable atomic.Int32
	// searching counts woken workers that have not taken a lane yet.
	// Raised by the waker, under mu; lowered by the worker.
	searching atomic.Int32
	checked   []*shard // rescue's copy of the ring; housekeeping's own
}

// enter adds sh to the ring (if it is not in it) and, with wake, wakes an
// idle worker for the lane that was just made ready. Called with sh.mu
// held.
func (s *sched) enter(sh *shard, wake bool) {
	s.mu.Lock()
	if !sh.inRing {
		sh.inRing = true
		s.ring = append(s.ring, sh)
	}
	if wake {
		s.wakeFor(1, sh)
	}
	s.mu.Unlock()
}

// wakeFor wakes an idle worker if more than the searching workers are
// needed for n ready lanes. Called with s.mu held; it reports whether it
// woke one.
func (s *sched) wakeFor(n int, sh *shard) bool {
	if len(s.sleepers) == 0 || int(s.searching.Load()) >= n {
		return false
	}
	s.signalled++
	s.wakeable.Add(-1)
	s.searching.Add(1)
	s.signal(sh)
	return true
}

// signal wakes the idle worker that went idle last (its stack and job are
// the likeliest still in a cache; sync.Cond wakes the one idle longest)
// and tells it which shard it was woken for, so that it goes there rather
// than to the ring's next: woken for a partition with ready lanes, a worker
// that went to one with enough workers waited again (see runQuick). Called
// with s.mu held, with a sleeper.
func (s *sched) signal(sh *shard) {
	last := len(s.sleepers) - 1
	w := s.sleepers[last]
	s.sleepers[last] = nil
	s.sleepers = s.sleepers[:last]
	w.wake <- sh
}

// stopSearching ends w's search (it took a lane, or found none and is
// about to wait) and wakes the next worker if lanes are still ready.
func (s *sched) stopSearching(w *worker, sh *shard) {
	if !w.searching {
		return
	}
	w.searching = false
	s.searching.Add(-1)
	if !w.enough {
		s.chain(1, sh)
	}
}

// rescue wakes a worker for each shard in the ring that took no lane since
// the last call (every tick) while lanes were ready: workers on quick lanes
// wake no other once there are enough of them (see runQuick), so if their
// calls all hang, the lanes still ready would wait for them. Called by
// housekeeping with no lock held.
func (s *sched) rescue() {
	s.mu.Lock()
	s.checked = append(s.checked[:0], s.ring...)
	s.mu.Unlock()
	defer clear(s.checked)
	stuck := s.checked[:0]
	for _, sh := range s.checked {
		sh.mu.Lock()
		if sh.ready.len() > 0 && sh.takes == sh.lastTakes {
			// Its workers on quick lanes hang: they count no more (see
			// runQuick), so workers that come take its lanes.
			sh.quick = 0
			sh.quickGen++
			sh.rescues++
			stuck = append(stuck, sh)
		}
		sh.lastTakes = sh.takes
		sh.mu.Unlock()
	}
	if len(stuck) == 0 {
		return
	}
	s.mu.Lock()
	for i, sh := range stuck {
		s.wakeFor(i+1, sh) // one more searching worker for each
	}
	s.mu.Unlock()
}

// leave removes sh from the ring. Called with sh.mu held.
func (s *sched) leave(sh *shard) {
	s.mu.Lock()
	if sh.inRing {
		sh.inRing = false
		for i, x := range s.ring {
			if x == sh {
				last := len(s.ring) - 1
				s.ring[i] = s.ring[last]
				s.ring[last] = nil
				s.ring = s.ring[:last]
				break
			}
		}
	}
	s.mu.Unlock()
}

// chain wakes one more idle worker if any waits and the n lanes still
// ready need more than the workers searching: called by a worker that took
// a lane while n more of its partition were ready, and with n = 1 by a
// searcher that took one (any lane still ready then needs a worker). It
// reports whether it woke one.
func (s *sched) chain(n int, sh *shard) bool {
	if s.wakeable.Load() <= 0 || int(s.searching.Load()) >= n {
		return false
	}
	s.mu.Lock()
	woke := len(s.ring) > 0 && s.wakeFor(n, sh)
	s.mu.Unlock()
	return woke
}

// next returns a shard with ready lanes, waiting while there is none (or,
// with rest, until a signal): the one w was woken for if it still has
// some, else the ring's next; nil once the engine drains. A worker woken
// from the wait is searching (see sched) until it takes a lane or waits
// again.
func (s *sched) next(w *worker, rest bool) *shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	var woken *shard
	for (len(s.ring) == 0 || rest) && !s.stop {
		rest = false
		if w.searching { // found nothing: no longer searching
			w.searching = false
			s.searching.Add(-1)
		}
		s.idle++
		s.wakeable.Add(1)
		s.sleepers = append(s.sleepers, w)
		s.mu.Unlock()
		woken = <-w.wake
		s.mu.Lock()
		s.idle--
		if s.stop {
			s.wakeable.Store(int32(s.idle - s.signalled))
			break // woken by shutdown
		}
		s.signalled--      // and wakeable went down when it was signalled
		w.searching = true // woken by wakeFor, which counted it
	}
	if s.stop {
		return nil
	}
	if woken != nil && woken.inRing {
		return woken // woken for its lanes
	}
	s.cursor++
	return s.ring[s.cursor%len(s.ring)]
}

// shutdown makes every worker return once it finishes its job.
func (s *sched) shutdown() {
	s.mu.Lock()
	s.stop = true
	for _, w := range s.sleepers {
		w.wake <- nil
	}
	clear(s.sleepers)
	s.sleepers = s.sleepers[:0]
	s.mu.Unlock()
}
