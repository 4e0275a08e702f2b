package consumer

import (
	"sync"
	"sync/atomic"
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
