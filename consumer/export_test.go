package consumer

import (
	"fmt"
	"time"
)

// CheckInvariants exposes the engine's invariant checker to the tests of
// package consumer_test.
func CheckInvariants(c *Consumer) error { return c.checkInvariants() }

// DumpLanes describes every lane that holds messages, for failing tests.
func DumpLanes(c *Consumer) []string {
	var out []string
	for _, sh := range c.shards() {
		sh.mu.Lock()
		for l := range sh.lanes.all() {
			if l.q.len()+l.pend.len() == 0 && !l.spill.on {
				continue
			}
			g := l.t.peekGuard()
			closed := g == nil || g.Closed()
			out = append(out, fmt.Sprintf("%v/%s state=%v parked=%v q=%d pend=%d spill{on=%v want=%v job=%v wait=%v fails=%d readPos=%d refed=%d} judge=%q span=%d closed=%v inflight=%d blocked=%d",
				sh.p, l.key, l.state, l.parked, l.q.len(), l.pend.len(), l.spill.on, l.spill.want, l.spill.job, l.spill.wait, l.spill.fails, l.spill.readPos, l.spill.refed.n, l.judge, l.judgeSpan, closed, l.t.inflight.Load(), l.t.nblocked.Load()))
		}
		sh.mu.Unlock()
	}
	return out
}

// DumpReady lists each shard's ready queue.
func DumpReady(c *Consumer) []string {
	var out []string
	for _, sh := range c.shards() {
		sh.mu.Lock()
		s := fmt.Sprintf("%v inRing=%v ready:", sh.p, sh.inRing)
		for i := sh.ready.head; i < len(sh.ready.buf) && i < sh.ready.head+12; i++ {
			l := sh.ready.buf[i]
			s += fmt.Sprintf(" %s/%v", l.key, l.state)
		}
		s += fmt.Sprintf(" (%d)", sh.ready.len())
		out = append(out, s)
		sh.mu.Unlock()
	}
	return out
}

// RunMax is the most messages of a lane one run steps (see runMax).
const RunMax = runMax

// SlowTurn is how long a turn of a lane whose calls are not quick may take
// by its estimate (see slowTurn); ShardTurn caps its calls (shardTurn).
const (
	SlowTurn  = slowTurn
	ShardTurn = shardTurn
)

// UseWallClock makes c's housekeeping read now instead of the wall clock,
// with c's epoch at now's reading. Call it before Run.
func UseWallClock(c *Consumer, now func() time.Time) {
	c.wall = now
	c.epoch = now()
	c.epochNano = c.epoch.UnixNano()
}

// WarmTenants is how many tenants the engine tracks before it warms the
// runs it queues (see warmRun).
const WarmTenants = warmTenants
