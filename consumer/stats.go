package consumer

import (
	"cmp"
	"slices"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// TenantStats is a snapshot of one tenant.
type TenantStats struct {
	Tenant string
	// NoTenant marks the reserved bucket of messages without a usable
	// tenant key (Tenant is then "").
	NoTenant     bool
	Handled      uint64
	Failed       uint64
	DeadLettered uint64
	Retried      uint64
	// Spilled counts its messages appended to its spill logs; Refed those
	// read back. SpillLag is how many of the messages it spilled are not
	// yet re-fed and settled (counted by this process: entries an earlier
	// process left are not in it).
	Spilled, Refed uint64
	SpillLag       int64
	// Unwritable counts its dead letters the DLQ refused for good (set
	// aside).
	Unwritable uint64
	// DLQUnavailable says its DLQ refuses its dead letters now, and has
	// for DLQUnavailableFor: a write failed (not for good) and none has
	// succeeded since. That is why its messages wait: each lane with a
	// dead letter to write writes it again at most Config.DLQProbe apart,
	// the messages behind it wait (and spill, reason dlq-unavailable). No
	// other tenant waits for it. DLQFailures counts its failed dead-letter
	// writes.
	DLQUnavailable    bool
	DLQUnavailableFor time.Duration
	DLQFailures       uint64
	// Parked is how many of its messages wait behind an open breaker, or
	// because of its control's Hold or Quarantine, now.
	Parked int
	// Queued is how many of its messages are in the engine now (parked and
	// waiting-to-spill ones included).
	Queued int
	// InFlight is how many of its messages are being handled now; Limit its
	// bulkhead limit now.
	InFlight, Limit int
	// Spilling is how many of its lanes (one per partition) spill now.
	Spilling int
	// CommitLag is how many offsets of its partitions' logs its oldest
	// unsettled messages hold back from being committed.
	CommitLag int64
	State     policy.State
	// Latency is its guard's latency estimate.
	Latency time.Duration

	// TimeLag is how long ago its oldest unsettled message in the engine
	// was produced (Message.Time, or its receipt when it has none): the
	// oldest head of its lanes' queues and set-aside messages. Zero when it
	// has none.
	TimeLag time.Duration
	// OldestParked is how long ago its oldest parked message was
	// produced; zero when none is parked.
	OldestParked time.Duration
	// SpillBacklogAge is how long ago the oldest of the messages it
	// spilled that are not yet re-fed and settled was produced (counted by
	// this process, as SpillLag); zero when there are none.
	SpillBacklogAge time.Duration
	// OpenSince is when the engine first found its breaker not closed (it
	// parked the tenant) since the breaker last closed, at the engine
	// clock's resolution; zero while the breaker is closed.
	OpenSince time.Time
	// Dwell counts its messages handled or dead-lettered by their time
	// from produce to settle (a spilled message once, when its re-fed copy
	// settles).
	Dwell Histogram
	// Control is its operators' control (a copy; nil when none), see
	// SetControls. Held says messages of it wait because of the control's
	// Hold or Quarantine: in the engine or in its spill log.
	Control *Control
	Held    bool
}

// PartitionStats is a snapshot of one assigned partition.
type PartitionStats struct {
	Partition Partition
	// Queued is how many of its messages are in memory; Unsettled how many
	// delivered messages are not settled (in memory, being spilled, or set
	// aside).
	Queued, Unsettled int
	// QuickQueued is how many of the queued messages count against
	// Config.ReadAhead (quick tenants', not parked or spilling).
	QuickQueued int
	// Paused says the engine asked the source to stop fetching it, and
	// PauseReason why.
	Paused      bool
	PauseReason PauseReason
	// Committed is the last commit point passed to Source.Commit (-1 none);
	// Next the offset after the last delivered message (-1 none).
	Committed, Next int64
	// CommitLag is Next minus the commit point: how many offsets a crash
	// now would deliver again.
	CommitLag int64
	// Oldest is how long its oldest unsettled message has been in the
	// engine, and OldestTenant whose it is. TimeLag is how long ago that
	// message was produced (Message.Time, or its receipt when it has none).
	Oldest       time.Duration
	OldestTenant string
	TimeLag      time.Duration
	// Lanes is how many tenants it has lanes for (a lane dropped after
	// its last message counts until its tenant's hold on it is released,
	// a worker's turn on the partition later at most).
	Lanes int
	// QuickWorkers is how many workers hold a quick lane of it now (a
	// tenant whose calls take under 5µs by its guard's estimate). Once
	// GOMAXPROCS of them do (one fewer, at least one, on a partition its
	// source delivers one message at a time, as NATS does), they wake no
	// other worker for its lanes (see Config.Concurrency). Rescues counts
	// the times housekeeping woke one anyway because the partition took no
	// lane in a tick while lanes were ready (its workers' calls hung).
	QuickWorkers int
	Rescues      uint64
}

// Totals are the engine's counters since it was made.
type Totals struct {
	Handled, Failed, DeadLettered, Retried, Panics uint64
	// Spilled, Refed: messages appended to and read back from spill logs;
	// SpillFailures: failed spill log calls; Duplicates: copies dropped on
	// re-feed.
	Spilled, Refed, SpillFailures, Duplicates uint64
	// Unwritable counts dead letters the DLQ refused for good;
	// DLQFailures failed dead-letter writes (to be written again).
	Unwritable, DLQFailures uint64
	// Dwell counts the messages handled or dead-lettered, all tenants, by
	// their time from produce to settle. Filled by Stats (the tenants'
	// histograms summed, forgotten ones included), not by Totals.
	Dwell Histogram
}

// Stats is a snapshot of the engine.
type Stats struct {
	Totals
	Parked, Queued, InFlight int
	PausedPartitions         int
	SpillingTenants          int
	// DLQUnavailableTenants counts the tenants whose DLQ refuses their
	// dead letters now (TenantStats.DLQUnavailable).
	DLQUnavailableTenants int
	// Controlled counts the tenants with a control now (SetControls),
	// whether the engine has them or not.
	Controlled int
	// Partitions lists the assigned partitions, in order.
	Partitions []PartitionStats
	// Tenants lists the tenants the engine tracks now, sorted by key (the
	// no-tenant bucket first). Idle tenants are dropped from it past
	// Config.MaxIdleTenants; the totals above stay.
	Tenants []TenantStats
	// Tracked counts the tenants and lanes the engine keeps state for.
	Tracked TrackedStats
}

// TrackedStats counts what the engine keeps per tenant, against its bound
// (Config.MaxIdleTenants).
type TrackedStats struct {
	// Tenants is how many tenants the engine keeps state for (the
	// no-tenant bucket aside), Idle how many of them have nothing in it (no
	// lane on any partition, nothing in flight). Idle is at most MaxIdle.
	Tenants, Idle, MaxIdle int
	// Lanes is how many lanes the partitions hold (see PartitionStats.Lanes):
	// each partition about MaxLanes at most beyond those holding messages
	// (lanes whose messages were just handled may stay above it until the
	// next lanes made, or housekeeping's next ticks, sweep them). MaxLanes
	// is MaxIdle, or less with many partitions (see
	// Config.MaxIdleTenants).
	Lanes, MaxLanes int
	// Forgotten counts the idle tenants forgotten since New (a tenant that
	// comes back is counted again when it is forgotten again).
	Forgotten uint64
}

// Totals returns the engine's counters but Dwell. It reads atomics only: no
// lock is taken, so it may be polled as often as a caller likes (Stats
// takes each partition's lock and walks its oldest messages).
func (c *Consumer) Totals() Totals {
	var n [7]uint64
	for _, x := range append([]*counters{&c.stats}, c.counterSets()...) {
		n[0] += x.handled.Load()
		n[1] += x.failed.Load()
		n[2] += x.dead.Load()
		n[3] += x.retried.Load()
		n[4] += x.panics.Load()
		n[5] += x.unwritable.Load()
		n[6] += x.dlqFails.Load()
	}
	return Totals{
		Handled:       n[0],
		Failed:        n[1],
		DeadLettered:  n[2],
		Retried:       n[3],
		Panics:        n[4],
		Unwritable:    n[5],
		DLQFailures:   n[6],
		Spilled:       c.stats.spilled.Load(),
		Refed:         c.stats.refed.Load(),
		SpillFailures: c.stats.spillFails.Load(),
		Duplicates:    c.stats.duplicates.Load(),
	}
}

// Stats returns a snapshot of the engine and its tenants. It takes each
// partition's lock briefly, one at a time, and calls no user code.
func (c *Consumer) Stats() Stats {
	var inflight int64
	if ws := c.workerList.Load(); ws != nil {
		for _, w := range *ws {
			if w.ctx().inCall() {
				inflight++
			}
		}
	}
	s := Stats{
		Totals:   c.Totals(),
		InFlight: int(inflight),
		Parked:   int(c.parkedTotal.Load()),
	}
	lag := map[*tenant]int64{}
	var held []heldRef
	queued := map[*tenant]int{}
	times := map[*tenant]*tenantTimes{}
	timesOf := func(t *tenant) *tenantTimes {
		x := times[t]
		if x == nil {
			x = &tenantTimes{}
			times[t] = x
		}
		return x
	}
	now := c.clock()
	for _, sh := range c.shards() {
		ps := PartitionStats{Partition: sh.p, Committed: sh.commit.src.done.Load()}
		sh.mu.Lock()
		ps.Queued, ps.Unsettled, ps.Next, ps.Lanes = sh.count.queued, sh.commit.unsettled, sh.commit.next, sh.lanes.len()+len(sh.released)
		ps.QuickWorkers, ps.Rescues, ps.QuickQueued = sh.quick, sh.rescues, sh.count.quickQueued
		ps.PauseReason = sh.pause.reason
		ps.Paused = sh.pause.reason != 0
		held = sh.heldRefs(held[:0]) // sorted below, with no lock held
		next := sh.commit.next
		for l := range sh.lanes.all() {
			if n := l.q.len() + l.pend.len(); n > 0 {
				queued[l.t] += n
				c.laneTimes(l, now, timesOf(l.t))
			} else if l.spill.out > 0 {
				c.laneTimes(l, now, timesOf(l.t))
			}
		}
		if sh.none != nil {
			queued[sh.none.t] += sh.none.q.len()
			c.laneTimes(sh.none, now, timesOf(sh.none.t))
		}
		for _, m := range sh.aside.msgs {
			queued[m.st.lane.t]++
			timesOf(m.st.lane.t).lag(now, c.bornOf(m))
		}
		if m := sh.oldest(); m != nil {
			ps.TimeLag = age(now, c.bornOf(m))
		}
		sh.mu.Unlock()
		slices.SortFunc(held, func(a, b heldRef) int { return cmp.Compare(a.off, b.off) })
		if len(held) > 0 {
			h := held[0]
			if next >= 0 {
				ps.CommitLag = next - h.off
			}
			ps.Oldest = time.Duration(max(now-h.at, 0))
			ps.OldestTenant = h.key
			// The lag is held by the tenants of the oldest messages: each
			// unsettled message holds back the offsets up to the next one.
			// (The first 1024 unsettled messages are looked at.)
			for i, m := range held[:min(len(held), 1024)] {
				to := next
				if i+1 < len(held) {
					to = held[i+1].off
				}
				lag[m.t] += to - m.off
			}
		}
		s.Queued += ps.Queued
		s.Tracked.Lanes += ps.Lanes
		if ps.Paused {
			s.PausedPartitions++
		}
		s.Partitions = append(s.Partitions, ps)
	}
	slices.SortFunc(s.Partitions, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Partition.Topic, b.Partition.Topic), cmp.Compare(a.Partition.ID, b.Partition.ID))
	})
	c.tmu.Lock()
	ts := make([]*tenant, 0, c.tenants.len()+1)
	if c.noTenant.lanes > 0 || c.noTenant.dead.Load() > 0 {
		ts = append(ts, c.noTenant)
	}
	for t := range c.tenants.all() {
		ts = append(ts, t)
	}
	s.Tracked.Tenants, s.Tracked.Idle, s.Tracked.Forgotten = c.tenants.len(), c.idle.n, c.forgotten
	dwell, dwellSum := c.goneDwell, c.goneDwellSum
	c.tmu.Unlock()
	s.Tracked.MaxIdle, s.Tracked.MaxLanes = c.maxIdle, c.laneBound()
	for _, t := range ts {
		x := c.tenantStats(t)
		x.CommitLag = lag[t]
		x.Queued = queued[t]
		x.Held = x.Control.stops() && (x.Queued > 0 || x.SpillLag > 0)
		if tt := times[t]; tt != nil {
			x.TimeLag, x.OldestParked, x.SpillBacklogAge = tt.timeLag, tt.parked, tt.spill
		}
		t.dwell.addTo(&dwell, &dwellSum)
		if x.Spilling > 0 {
			s.SpillingTenants++
		}
		if x.DLQUnavailable {
			s.DLQUnavailableTenants++
		}
		s.Tenants = append(s.Tenants, x)
	}
	slices.SortFunc(s.Tenants, func(a, b TenantStats) int {
		if a.NoTenant != b.NoTenant {
			if a.NoTenant {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	s.Dwell = histogram(&dwell, dwellSum)
	if tab := c.ctls.Load(); tab != nil {
		s.Controlled = len(*tab)
	}
	return s
}

// tenantTimes are the ages Stats gathers for one tenant from its lanes.
type tenantTimes struct {
	timeLag, parked, spill time.Duration
}

// lag raises the tenant's TimeLag to the age of a message produced at born.
func (x *tenantTimes) lag(now, born int64) {
	x.timeLag = max(x.timeLag, age(now, born))
}

// laneTimes adds l's ages to x: its queue's head (re-fed messages come
// first, then live ones in order) or else the front of its pend, parked if
// l is, and its spilled backlog. Called with l's shard mu held.
func (c *Consumer) laneTimes(l *lane, now int64, x *tenantTimes) {
	var head *Message
	switch {
	case l.q.len() > 0:
		head = l.q.front()
		if l.parked {
			x.parked = max(x.parked, age(now, c.bornOf(head)))
		}
	case l.pend.len() > 0:
		head = l.pend.front()
	}
	if head != nil {
		x.lag(now, c.bornOf(head))
	}
	x.spill = max(x.spill, c.spillAge(l, now))
}

// tenantStats reads one tenant's counters (without its commit lag and
// queued count, which come from its lanes).
func (c *Consumer) tenantStats(t *tenant) TenantStats {
	x := TenantStats{
		Tenant:       t.key,
		NoTenant:     t.none,
		Handled:      t.handled.Load(),
		Failed:       t.failed.Load(),
		DeadLettered: t.dead.Load(),
		Retried:      t.retried.Load(),
		Spilled:      t.spilled.Load(),
		Refed:        t.refed.Load(),
		SpillLag:     max(int64(t.spilled.Load())-int64(t.spillDone.Load()), 0),
		Unwritable:   t.unwritable.Load(),
		DLQFailures:  t.dlqFails.Load(),
		Parked:       int(t.parked.Load()),
		InFlight:     int(t.inflight.Load()),
		Spilling:     int(t.spillLanes.Load()),
		State:        policy.Closed,
	}
	if !t.none {
		x.Limit = int(c.limitOf(t))
	}
	if at := t.dlqDownAt.Load(); at != 0 {
		x.DLQUnavailable, x.DLQUnavailableFor = true, time.Duration(max(c.clock()-at, 0))
	}
	if g := t.peekGuard(); g != nil && g != c.fallback {
		x.State = g.State()
		x.Latency = g.Latency()
	}
	if ct := t.ctl.Load(); ct != nil {
		cp := *ct
		x.Control = &cp
	}
	if at := t.openSince.Load(); at != 0 && x.State != policy.Closed {
		x.OpenSince = c.epoch.Add(time.Duration(at))
	}
	var n [len(dwellBounds) + 1]uint64
	var sum int64
	t.dwell.addTo(&n, &sum)
	x.Dwell = histogram(&n, sum)
	return x
}

// Tenant returns the snapshot of one tenant, if the engine tracks it. Its
// CommitLag, TimeLag, OldestParked and SpillBacklogAge are not computed
// (see Stats).
func (c *Consumer) Tenant(key string) (TenantStats, bool) {
	h := keyHash(key)
	c.tmu.Lock()
	t := c.tenants.get(key, h)
	c.tmu.Unlock()
	if t == nil {
		return TenantStats{}, false
	}
	x := c.tenantStats(t)
	for _, sh := range c.parts.Load().m {
		sh.mu.Lock()
		if l := sh.lanes.get(key, h); l != nil {
			x.Queued += l.q.len() + l.pend.len()
		}
		for _, m := range sh.aside.msgs {
			if m.st.lane.t == t {
				x.Queued++
			}
		}
		sh.mu.Unlock()
	}
	x.Held = x.Control.stops() && (x.Queued > 0 || x.SpillLag > 0)
	return x, true
}

// counterSets are the workers' counters (none before Run).
func (c *Consumer) counterSets() []*counters {
	ws := c.workerList.Load()
	if ws == nil {
		return nil
	}
	out := make([]*counters, len(*ws))
	for i, w := range *ws {
		out[i] = &w.n
	}
	return out
}
