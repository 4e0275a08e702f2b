package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// newTestConsumer is a Consumer that is never run, for tests of its
// bookkeeping.
// tenantFor is tenantLocked taking tmu itself: a tenant holding one lane
// count, as a lane of it would.
func (c *Consumer) tenantFor(key string, h uint64) *tenant {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	return c.tenantLocked(key, h)
}

func newTestConsumer(t *testing.T, cfg Config) *Consumer {
	t.Helper()
	cfg.Handler = HandlerFunc(func(context.Context, *Message) error { return nil })
	cfg.Tenant = FromKey()
	cfg.DLQ = dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil })
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A lane the sweep drops is the memory of the partition's next new lane,
// unless something may still hold it without the shard's lock (here a
// timer it had): such a lane is never handed out again. A reused lane
// starts from nothing but its timer sequence, which goes on, so that a
// late firing of an old timer cannot match it.
func TestSweptLaneMemoryIsReusedUnlessShared(t *testing.T) {
	c := newTestConsumer(t, Config{MaxIdleTenants: 2})
	sh := newShard(c, Partition{Topic: "t"}, 1, 100)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := laneOf(sh, "a")
	b := laneOf(sh, "b")
	c.arm(b, time.Hour)
	c.disarm(b)
	a.timerSeq = 7
	a.credit, a.judgeSpan = 3, 4
	// A third lane: the sweep drops a (idle, no message since it was
	// made), whose memory the new lane gets.
	e := laneOf(sh, "e")
	if e != a {
		t.Fatalf("the lane made past the bound is not the dropped lane's memory (a dead %v, free %d, b dead %v)", a.dead, len(sh.alloc.free), b.dead)
	}
	if e.dead || e.key != "e" || e.t.key != "e" || e.credit != 0 || e.judgeSpan != 0 || e.q.len() != 0 || !e.ahead || e.spill.readPos != -1 {
		t.Fatalf("reused lane not fresh: dead %v key %q credit %d judgeSpan %d queued %d ahead %v readPos %d",
			e.dead, e.key, e.credit, e.judgeSpan, e.q.len(), e.ahead, e.spill.readPos)
	}
	if sh.lanes.get("a", keyHash("a")) != nil || sh.lanes.get("e", keyHash("e")) != e {
		t.Fatalf("the partition's lanes by key are wrong after the reuse")
	}
	if e.timerSeq != 8 {
		t.Fatalf("reused lane's timer sequence is %d, want 8 (7, one more for its drop)", e.timerSeq)
	}
	laneOf(sh, "f") // drops b
	if !b.dead {
		t.Fatalf("b not dropped")
	}
	for i := range 64 {
		if l := laneOf(sh, fmt.Sprint("k", i)); l == b {
			t.Fatalf("a lane a timer held was handed out again")
		}
	}
}

// A lane's queue starts in memory of its partition's (shard.newLane); once
// it grows past it, the first slots keep no message.
func TestLaneQueueGrowthClearsItsFirstSlots(t *testing.T) {
	c := newTestConsumer(t, Config{})
	sh := newShard(c, Partition{Topic: "t"}, 1, 100)
	sh.mu.Lock()
	l := laneOf(sh, "a")
	sh.mu.Unlock()
	first := l.q.buf[:cap(l.q.buf)]
	for range laneSlots + 1 {
		l.q.push(new(Message))
	}
	for i, m := range first {
		if m != nil {
			t.Fatalf("first slot %d still holds a message after the queue grew", i)
		}
	}
}

// Each partition keeps at most laneBound lanes beyond those with
// messages: MaxIdleTenants, capped by its share over the partitions and
// by laneKeepMax.
func TestLaneBound(t *testing.T) {
	for _, tc := range []struct{ maxIdle, parts, want int }{
		{2, 1, 2},
		{2, 512, 2},
		{2000, 4, 2000},
		{2000, 512, laneKeepMin},
		{1024, 64, laneShare * 1024 / 64},
		{200000, 4, laneKeepMax},
	} {
		c := newTestConsumer(t, Config{MaxIdleTenants: tc.maxIdle})
		m := map[Partition]*shard{}
		for i := range tc.parts {
			p := Partition{Topic: "t", ID: int32(i)}
			m[p] = newShard(c, p, 1, 100)
		}
		c.setParts(m)
		if got := c.laneBound(); got != tc.want {
			t.Errorf("MaxIdleTenants %d over %d partitions: laneBound %d, want %d", tc.maxIdle, tc.parts, got, tc.want)
		}
	}
}

// A tenant forgotten while a job of its lane dropped mid-run had not yet
// reported its end (the partition was revoked, and its other lane swept)
// is not listed as idle again when that job's end comes (zombieDone): the
// list would hold a tenant the table does not, and forgetting it a second
// time would release its key's pin twice.
func TestForgottenTenantIsNotListedAgain(t *testing.T) {
	c := newTestConsumer(t, Config{MaxIdleTenants: 1})
	a := c.tenantFor("a", keyHash("a"))
	b := c.tenantFor("b", keyHash("b"))
	if f := c.releaseTenant(a); f != nil {
		t.Fatalf("forgot %q with one idle tenant", f.key)
	}
	if f := c.releaseTenant(b); f != a {
		t.Fatalf("past the bound: forgot %v, want a", f)
	}
	c.zombieDone(a)
	c.tmu.Lock()
	defer c.tmu.Unlock()
	var listed []*tenant
	c.idle.each(func(t *tenant) { listed = append(listed, t) })
	if a.onIdle || c.idle.n != 1 || len(listed) != 1 || listed[0] != b || c.tenants.get("a", keyHash("a")) != nil {
		t.Fatalf("after a late job end of forgotten a: a listed %v, %d idle (%d in the queue), a in the table %v; want only b",
			a.onIdle, c.idle.n, len(listed), c.tenants.get("a", keyHash("a")) != nil)
	}
}

// The sweep keeps a lane whose spill cursor is not committed yet, or whose
// spill job backs off: its tenant's next lane starts from the log's
// committed cursor and does not know what this one read, so only this lane
// commits it. Once the cursor is committed and the back-off over, the lane
// goes.
func TestSweepKeepsLaneWithSpillCursorToCommit(t *testing.T) {
	c := newTestConsumer(t, Config{MaxIdleTenants: 2})
	sh := newShard(c, Partition{Topic: "t"}, 1, 100)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	a := laneOf(sh, "a")
	b := laneOf(sh, "b")
	a.spill.commit.raise(3)
	b.spill.wait = true
	for i := range 8 {
		laneOf(sh, fmt.Sprint("k", i))
	}
	if a.dead || sh.lanes.get("a", keyHash("a")) != a {
		t.Fatal("the sweep dropped a lane whose spill cursor was not committed")
	}
	if b.dead || sh.lanes.get("b", keyHash("b")) != b {
		t.Fatal("the sweep dropped a lane whose spill job backs off")
	}
	a.spill.commit.done.Store(3)
	b.spill.wait = false
	c.tmu.Lock()
	c.sweepLanes(sh, sweepChunk, sweepChunk, 0, c.laneBound())
	c.tmu.Unlock()
	if !a.dead || !b.dead {
		t.Fatalf("lanes done with their spill logs not dropped: a dead %v, b dead %v", a.dead, b.dead)
	}
}

// laneOf is sh.laneFor with the key hashed.
func laneOf(sh *shard, key string) *lane { return sh.laneFor(key, keyHash(key)) }

// While the engine tracks more than twice MaxIdleTenants tenants, a tenant
// that never made a guard is forgotten as soon as it is idle, never listed:
// a stream of such tenants leaves the listed idle tenant, which holds a
// guard, where it is. Without that pressure it is listed as any other.
func TestGuardlessTenantIsForgottenAtOnceUnderPressure(t *testing.T) {
	c := newTestConsumer(t, Config{MaxIdleTenants: 2})
	keeper := c.tenantFor("keeper", keyHash("keeper"))
	c.guard(keeper)
	if f := c.releaseTenant(keeper); f != nil {
		t.Fatalf("forgot %q with one idle tenant", f.key)
	}
	for i := range 5 { // a lane each: 6 tracked
		k := fmt.Sprint("busy", i)
		c.tenantFor(k, keyHash(k))
	}
	for i := range 3 {
		k := fmt.Sprint("once", i)
		o := c.tenantFor(k, keyHash(k))
		if f := c.releaseTenant(o); f != o {
			t.Fatalf("under pressure, the release of guardless %q forgot %v, want %q itself", k, f, k)
		}
		if o.onIdle || c.tenants.get(k, keyHash(k)) != nil {
			t.Fatalf("forgotten %q: listed %v, in the table %v", k, o.onIdle, c.tenants.get(k, keyHash(k)) != nil)
		}
	}
	if !keeper.onIdle || c.idle.n != 1 || c.tenants.get("keeper", keyHash("keeper")) != keeper {
		t.Fatalf("keeper listed %v, %d listed, keeper in the table %v: want keeper alone, listed",
			keeper.onIdle, c.idle.n, c.tenants.get("keeper", keyHash("keeper")) != nil)
	}

	calm := newTestConsumer(t, Config{MaxIdleTenants: 2})
	x := calm.tenantFor("x", keyHash("x"))
	if f := calm.releaseTenant(x); f != nil || !x.onIdle {
		t.Fatalf("without pressure, guardless x: forgot %v, listed %v; want it listed", f, x.onIdle)
	}
}

// A tenant's first message runs without its guard once the engine tracks
// more than one and a half times MaxIdleTenants tenants, below the twice
// MaxIdleTenants at which a stream of keys each seen once holds it (and
// past which a guardless idle tenant is forgotten at once).
func TestLoneFromOneAndAHalfTimesMaxIdle(t *testing.T) {
	c := newTestConsumer(t, Config{MaxIdleTenants: 4})
	if c.lone == nil {
		t.Fatal("no lone guard with the default scope")
	}
	fresh := c.tenantFor("fresh", keyHash("fresh"))
	for i := range 5 {
		c.tenantFor(fmt.Sprint("t", i), keyHash(fmt.Sprint("t", i)))
	}
	if n := c.ntenants.Load(); n != 6 || c.loneOK(fresh) {
		t.Fatalf("%d tenants tracked (1.5x MaxIdleTenants 4 is 6): lone %v, want false", n, c.loneOK(fresh))
	}
	c.tenantFor("t5", keyHash("t5"))
	if c.overTracked() || !c.loneOK(fresh) {
		t.Fatalf("7 tenants tracked: over twice MaxIdleTenants %v (want false), lone %v (want true)", c.overTracked(), c.loneOK(fresh))
	}
	fresh.handled.Add(1)
	if c.loneOK(fresh) {
		t.Fatal("a tenant that had a message handled runs lone")
	}
}

// The idle list forgets in the order tenants were released, whatever
// tenants left it and came back meanwhile, and its queue of entries stays
// within its bound however often tenants come and go.
func TestIdleListOrderAndBound(t *testing.T) {
	var l idleList
	ts := make([]*tenant, 50)
	for i := range ts {
		ts[i] = &tenant{key: fmt.Sprint(i)}
	}
	want := map[*tenant]int{} // tenant -> its last release
	tick := 0
	for round := range 2000 {
		// Tenants 0-9 come back and go idle again every round; the others
		// once in a while.
		for i, x := range ts {
			if i >= 10 && (round+i)%37 != 0 {
				continue
			}
			if x.onIdle {
				l.remove(x)
			}
			tick++
			l.push(x)
			want[x] = tick
		}
		if bound := 2*len(ts) + idleSlack; l.q.len() > bound {
			t.Fatalf("round %d: %d entries for %d tenants, more than %d", round, l.q.len(), l.n, bound)
		}
	}
	if l.n != len(ts) {
		t.Fatalf("%d listed, want %d", l.n, len(ts))
	}
	last := 0
	for l.n > 0 {
		x := l.oldest()
		if x.onIdle || want[x] <= last {
			t.Fatalf("oldest gave %s (released at %d, listed %v) after one released at %d", x.key, want[x], x.onIdle, last)
		}
		last = want[x]
	}
}
