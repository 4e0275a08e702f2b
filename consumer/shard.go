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
//
// Its state is grouped by what it serves: bounds (fixed at assignment),
// commit (the watermark, commit.go), count (queued, parked and read-ahead
// messages), pause (the engine's pause of the partition, park.go), aside
// (dead letters that cannot be written, deadletter.go) and the scheduling
// fields (sched.go). All of it is guarded by mu, except where noted.
type shard struct {
	c      *Consumer
	p      Partition
	gen    uint64 // assignment generation
	bounds shardBounds

	mu   sync.Mutex
	dead bool // revoked
	// warmed keeps what warmRun loaded, so that its loads are made.
	warmed byte
	// spills counts its lanes' spill jobs in progress: Revoked waits for
	// their SpillLog calls (see spillWork).
	spills settleGate
	lanes  keyTable[*lane] // by tenant key
	none   *lane           // the no-tenant bucket's lane
	ready  laneQueue       // lanes ready to run, in turn order
	sweep  laneSweep       // drops idle lanes past MaxIdleTenants (idle.go)
	alloc  laneAlloc       // memory for new lanes

	commit commitState
	count  queueCount
	pause  pauseState
	aside  asideState

	// Scheduling (sched.go, and runQuick in worker.go). inRing is guarded
	// by sched.mu. quick counts the workers holding a quick lane of this
	// shard (see runQuick), quickMax how many of them are enough
	// (quickFull: the engine's quickWorkers, one fewer once a source
	// delivered to it one message at a time, see Consumer.Deliver); takes
	// counts lanes taken, for housekeeping to tell a shard whose workers
	// all hang (see sched.rescue).
	inRing bool // in the scheduler's ring
	// quickPrior is whether the last lane that finished a job had a
	// quick tenant (lane.quickNow): a new lane starts with it, its tenant's
	// calls unknown to it until its first job ends (see addLane).
	quickPrior bool
	quick      int
	quickMax   int
	quickGen   uint64 // bumped when rescue forgets the count
	takes      uint64
	lastTakes  uint64 // takes at the last rescue check; housekeeping's own
	rescues    uint64 // times rescue found it stuck (PartitionStats.Rescues)

	// What a worker's run reads without the lock, at every message (see
	// runOn), on a line of its own: next to the counts that DeliverBatch
	// writes for every message, each read would be a miss on the line the
	// other core had just written (TestShardLayout checks the layout,
	// BenchmarkEngine guards the gain).
	_ [64]byte
	// readyHint is set whenever a lane joins ready and cleared (under mu)
	// only when ready is empty: a worker's run reads it without the lock
	// to yield to lanes that became ready meanwhile (see runOn).
	readyHint atomic.Bool
	gate      settleGate // Source.Settle calls in progress
	_         [64]byte

	// released: the tenants of lanes workers retired after their last job
	// (see moveOn), whose holds the next worker to leave the shard drops
	// (worker.release); each still counts the lane until then, and so do
	// the partition's stats (PartitionStats.Lanes). Guarded by mu; last,
	// so that it moves none of the fields above off their lines.
	released []*tenant
}

func newShard(c *Consumer, p Partition, gen uint64, maxQueued int) *shard {
	sh := &shard{c: c, p: p, gen: gen, quickMax: c.quickWorkers}
	sh.bounds.maxQueued = maxQueued
	sh.bounds.maxParkedTenant = min(c.cfg.MaxParkedPerTenant, max(maxQueued/2, 1))
	sh.bounds.maxQueuedTenant = min(c.cfg.MaxQueuedPerTenant, max(maxQueued/8, 1))
	if c.cfg.ReadAhead < maxQueued {
		sh.bounds.readAhead = c.cfg.ReadAhead
	}
	sh.commit.next, sh.commit.oldestAt = -1, -1
	sh.commit.src.init()
	return sh
}

// shardBounds are a partition's bounds, fixed when it is assigned.
type shardBounds struct {
	maxQueued int // MaxQueuedPerPartition, lowered to the source's capacity
	// maxParkedTenant and maxQueuedTenant are MaxParkedPerTenant and
	// MaxQueuedPerTenant, capped at a half and an eighth of maxQueued: a
	// broker window smaller than the configured bounds (a NATS consumer's
	// MaxAckPending) must make a stuck or hot tenant spill, not fill the
	// window and pause the partition.
	maxParkedTenant, maxQueuedTenant int
	// readAhead is Config.ReadAhead, or 0 (off) where it is not below
	// maxQueued.
	readAhead int
}

// queueCount counts a partition's messages in memory, for its bounds and
// its read-ahead (see deliverRun, recount, pressureGone).
type queueCount struct {
	queued int // messages in this partition's lanes (q and pend) and aside
	parked int // of them, those in parked lanes' q (see addParked)
	// quickQueued is how many of them count against readAhead: the sum of
	// the lanes' rq (see recount).
	quickQueued int
	aheadLanes  int // lanes whose rq is over one (see aheadLimit)
}

// eachLane calls f for each of sh's lanes, the no-tenant bucket's
// included. Called with sh.mu held.
func (sh *shard) eachLane(f func(*lane)) {
	for l := range sh.lanes.all() {
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
	for _, m := range sh.aside.msgs {
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

// laneFor returns the lane of key, whose hash is h (keyHash), in sh,
// making it on first sight. Called with sh.mu held; it takes the tenant
// table's lock when it makes a lane, once for finding the tenant and for
// the sweep that may drop other lanes (releasing their tenants).
func (sh *shard) laneFor(key string, h uint64) *lane {
	if l := sh.lanes.get(key, h); l != nil {
		return l
	}
	c := sh.c
	c.tmu.Lock()
	l := sh.addLane(c.tenantLocked(key, h), h)
	c.tmu.Unlock()
	return l
}

// noneLane returns sh's lane of the no-tenant bucket, making it on first
// sight. Called with sh.mu held.
func (sh *shard) noneLane() *lane {
	if sh.none == nil {
		sh.none = &lane{sh: sh, t: sh.c.holdNoTenant()}
	}
	return sh.none
}

// A partition allocates its lanes laneChunk at a time, each with
// laneSlots first slots of its queue, and reuses the memory of the lanes
// it drops (free): with many tenants, most lanes are made for a message or
// two and dropped by the sweep, and one allocation per lane (or two, with
// its queue) was most of the cost of a message (BenchmarkEngine at many
// tenants or partitions guards this).
const (
	laneChunk = 32
	laneSlots = 2
)

// laneAlloc is a partition's supply of lane memory (guarded by its mu).
type laneAlloc struct {
	chunk []lane     // not yet used
	slots []*Message // not yet used: laneSlots per lane
	free  []*lane    // dropped lanes whose memory may be reused
}

// newLane returns a zeroed lane of sh, reusing a dropped one's memory if
// there is one. Called with sh.mu held.
func (sh *shard) newLane() *lane {
	a := &sh.alloc
	var l *lane
	var q []*Message
	if n := len(a.free); n > 0 {
		l = a.free[n-1]
		a.free[n-1] = nil
		a.free = a.free[:n-1]
		q = l.q.buf[:0]
		// timerSeq goes on counting: a firing of a timer the lane had
		// before it was dropped must never match its new sequence.
		*l = lane{timerSeq: l.timerSeq}
	} else {
		if len(a.chunk) == 0 {
			a.chunk = make([]lane, laneChunk)
			a.slots = make([]*Message, laneChunk*laneSlots)
		}
		l = &a.chunk[0]
		a.chunk = a.chunk[1:]
		q = a.slots[:0:laneSlots]
		a.slots = a.slots[laneSlots:]
	}
	l.sh, l.ahead, l.q.buf = sh, true, q
	l.spill.readPos = -1
	l.spill.commit.init()
	return l
}

// freeLane keeps the memory of l, just dropped, for sh's next new lane,
// unless something may still hold l (shared) or its queue's array grew
// past its first slots (it would stay that big). Called with sh.mu held.
func (sh *shard) freeLane(l *lane) {
	if l.shared || cap(l.q.buf) > laneSlots || l.spill.refedIDs != nil {
		return
	}
	sh.alloc.free = append(sh.alloc.free, l)
}

// laneQueue is a partition's queue of ready lanes.
type laneQueue = fifo[*lane]
