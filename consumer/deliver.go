package consumer

import (
	"fmt"
	"time"
)

// Deliver implements Dispatcher. (A NATS source delivers one message at
// a time: DeliverBatch's array of keys would be cleared for each.)
//
// A partition fed this way counts one worker fewer on its quick lanes as
// enough (at least one; see runQuick): the source's goroutine spends a
// core on every message itself (the NATS client's dispatcher parses each
// and hands it over), and messages arrive one by one, each readying a lane,
// so a second quick worker would be woken for many of them, each wake-up a
// futex call and a thread brought back on another core, only to compete
// with that goroutine for the cores (the NATS adapter's BenchmarkConsume
// guards this). DeliverBatch delivers slices of a fetch: there every core's worker helps.
func (c *Consumer) Deliver(m *Message) {
	one := [1]*Message{m}
	key := [1]string{c.tenantOf(m)}
	c.deliverRun(one[:], key[:], true)
}

// deliverChunk is how many messages DeliverBatch takes at a time: their
// tenant keys are kept on its stack between extraction and queueing.
const deliverChunk = 64

// DeliverBatch implements Dispatcher. Tenant keys are extracted first, with
// no lock held; then each run of messages of one partition is queued under
// that partition's lock alone.
func (c *Consumer) DeliverBatch(ms []*Message) {
	var keys [deliverChunk]string
	for len(ms) > 0 {
		chunk := ms[:min(len(ms), deliverChunk)]
		ms = ms[len(chunk):]
		ks := keys[:len(chunk)]
		for i, m := range chunk {
			ks[i] = c.tenantOf(m)
		}
		for len(chunk) > 0 {
			n := 1
			for n < len(chunk) && chunk[n].Partition == chunk[0].Partition {
				n++
			}
			c.deliverRun(chunk[:n], ks[:n], false)
			chunk, ks = chunk[n:], ks[n:]
		}
	}
}

// tenantOf starts m's engine state and returns its tenant key (which may
// share m's memory), or records in the state why it has none.
func (c *Consumer) tenantOf(m *Message) string {
	key, err := c.cfg.Tenant(m)
	switch {
	case err != nil:
	case key == "":
		err = ErrNoTenant
	case len(key) > c.cfg.MaxTenantLen:
		err = fmt.Errorf("consumer: tenant key of %d bytes exceeds MaxTenantLen %d", len(key), c.cfg.MaxTenantLen)
	}
	// Its scalar fields are written, not compared first: a comparison
	// reads the state's line, cold in a message the source built long ago,
	// one stall per message, where stores to it go on in parallel
	// (BenchmarkEngine guards this). Its pointer fields are
	// not written at all: while the collector marks, a pointer store, even
	// of nil, first reads the old value for the write barrier, that same
	// stall. lane is set by deliverRun, lprev and lnext mean something only
	// while listed, and fail only while failSet.
	m.st.msgScalars = msgScalars{}
	if c.tr != nil {
		valid := key
		if err != nil {
			valid = ""
		}
		c.tr.start(m, valid, false)
	}
	if err != nil {
		m.st.wr().tenantErr = err
		return ""
	}
	return key
}

// warmTenants is how many tenants the engine tracks before deliverRun
// warms its runs (warmRun): with fewer, their lines are likely in cache.
const warmTenants = 4096

// warmRun hashes keys into hs and loads, for all of them at once, the
// lines that queueing them reads first: each key's slot in sh's lane table
// and its lane's key (in its tenant's first line), or, for a key whose
// lane is not there, its slot in the tenants table and its tenant's key;
// and, if new lanes will make the partition sweep (see addLane), the lines
// the sweep reads of the oldest lanes, which it drops first: each lane, its
// slot, and its tenant's first line. It compares no key and changes
// nothing. With many tenants those lines are cold, and queueing the
// messages one after another would wait for them one after another, each
// behind the last (a lane's key is read only once its slot is in; a tenant
// is looked up only once its lane is found missing); here the loads of
// different keys overlap (BenchmarkEngine at 100,000 tenants guards the
// gain). Called with sh.mu held; it takes tmu.
func (c *Consumer) warmRun(sh *shard, keys []string, hs []uint64) {
	var x byte
	missing := false
	for i, k := range keys {
		if k == "" {
			continue
		}
		h := keyHash(k)
		hs[i] = h
		if l := sh.lanes.byHash(h); l != nil {
			if len(l.key) > 0 {
				x += l.key[0]
			}
		} else {
			missing = true
		}
	}
	nv := 0 // the oldest lanes, at the sweep queue's front
	if missing && sh.sweep.q.len() >= c.laneBound() {
		nv = min(len(keys), sh.sweep.q.len())
		for j := range nv {
			v := sh.sweep.q.at(j)
			x += byte(v.h) + byte(v.state)
		}
	}
	if missing {
		c.tmu.Lock()
		for j := range nv {
			v := sh.sweep.q.at(j)
			x += sh.lanes.touch(v.h)
			if v.t != nil {
				x += byte(v.t.lanes)
			}
		}
		for i, k := range keys {
			if k == "" {
				continue
			}
			if t := c.tenants.byHash(hs[i]); t != nil && len(t.key) > 0 {
				x += t.key[0]
			}
		}
		c.tmu.Unlock()
	}
	sh.warmed = x
}

// deliverRun queues messages of one partition, in order; keys are their
// tenant keys (see tenantOf).
func (c *Consumer) deliverRun(ms []*Message, keys []string, single bool) {
	sh := c.shardOf(ms[0].Partition)
	var ev []Event
	pause := PauseReason(0)
	now := c.clock()
	sh.mu.Lock()
	if sh.dead {
		// Revoked meanwhile: the new owner reads these again.
		sh.mu.Unlock()
		return
	}
	if single && sh.quickMax == c.quickWorkers {
		sh.quickMax = max(c.quickWorkers-1, 1)
	}
	var hs [deliverChunk]uint64
	warm := len(ms) > 1 && c.ntenants.Load() >= warmTenants
	if warm {
		c.warmRun(sh, keys, hs[:len(ms)])
	}
	// prev is the lane of the last message with a tenant: a run of one
	// tenant's messages (a hot tenant, or a single one) finds its lane
	// without hashing the key again. It cannot be dropped meanwhile: it
	// holds that message.
	var prev *lane
	for i, m := range ms {
		none := m.st.rd().tenantErr != nil
		var l *lane
		switch {
		case none:
			l = sh.noneLane()
		case prev != nil && prev.key == keys[i]:
			l = prev
		default:
			h := hs[i] // hashed by warmRun
			if !warm {
				h = keyHash(keys[i])
			}
			l = sh.laneFor(keys[i], h)
			prev = l
		}
		m.st.lane, m.st.gen, m.st.at = l, uint32(sh.gen), now
		sh.commit.unsettled++
		if m.Offset >= sh.commit.next {
			sh.commit.next = m.Offset + 1
		} else {
			// A redelivery after later messages (JetStream after
			// AckWait): oldest cannot find it by the lanes' order.
			m.st.late = true
			sh.commit.late = append(sh.commit.late, m)
		}
		if l.hits < 2 {
			l.hits++
		}
		sh.count.queued++
		t := l.t
		if l.spill.on {
			m.st.spilled = true
			l.pend.push(m)
			c.ensureSpillJob(l)
		} else {
			l.q.push(m)
			if l.parked {
				c.addParked(l, 1)
			}
			if l.ahead {
				c.recount(l)
			}
			if l.state == laneIdle && !c.draining.Load() {
				c.makeReady(l)
			}
			switch {
			case l.parked && (t.parked.Load() >= int64(sh.bounds.maxParkedTenant) || c.parkedTotal.Load() >= int64(c.cfg.MaxParked)):
				if !c.requestSpill(l, SpillParked, &ev) && sh.pause.reason == 0 {
					pause = PauseParkedBound
				}
			case !none && l.q.len() > sh.bounds.maxQueuedTenant:
				c.requestSpill(l, SpillBacklog, &ev)
			}
		}
		if sh.count.queued >= sh.bounds.maxQueued && sh.pause.reason == 0 && pause == 0 {
			pause = PauseQueueFull
			if l.spill.on && l.spill.fails > 0 {
				pause = PauseSpillUnavailable
			}
		}
	}
	if pause == 0 && sh.pause.reason == 0 && c.aheadFull(sh) {
		pause = PauseReadAhead
	}
	if pause != 0 && sh.pause.reason == 0 {
		c.setPause(sh, pause)
	}
	var forgot []*tenant
	if len(sh.sweep.forgot) > 0 {
		forgot = sh.takeForgotten()
	}
	sh.mu.Unlock()
	c.unpinAll(forgot)
	if pause != 0 {
		c.syncPause(sh)
	}
	for i := range ev {
		c.emit(ev[i])
	}
}

// recount brings l's share of its partition's read-ahead count up to date:
// its queued messages while its tenant's calls are quick and it is neither
// parked nor spilling (see Config.ReadAhead). Called with l's shard mu
// held, after anything that changes one of those.
func (c *Consumer) recount(l *lane) {
	n := 0
	if l.ahead && !l.parked && !l.spill.on && !l.dead {
		n = l.q.len()
	}
	sh := l.sh
	switch {
	case n > 1 && l.rq <= 1:
		sh.count.aheadLanes++
	case n <= 1 && l.rq > 1:
		sh.count.aheadLanes--
	}
	sh.count.quickQueued += n - l.rq
	l.rq = n
	if sh.pause.aheadOff && sh.count.quickQueued <= c.aheadLimit(sh)/2 {
		sh.pause.aheadOff = false
	}
}

// aheadPerLane is how many messages each lane that counts against its
// partition's read-ahead may hold at least (see aheadLimit).
const aheadPerLane = 8

// aheadLimit is how many messages of quick tenants sh may hold: ReadAhead,
// or aheadPerLane for each lane holding more than one, if that is more. The
// bound is shared by the partition's quick lanes; with a thousand of them,
// ReadAhead alone is a few messages a lane, so that a lane's turn would
// serve fewer messages (BenchmarkEngine at 1000 tenants guards this). A
// lane holding one message gains nothing from a longer turn: counting
// those would let a stream of keys each seen once fill the partition to
// its MaxQueuedPerPartition, a tenant and a lane live for every message
// held (BenchmarkConsumeTenants guards this).
// Called with sh.mu held.
func (c *Consumer) aheadLimit(sh *shard) int {
	return max(sh.bounds.readAhead, aheadPerLane*sh.count.aheadLanes)
}

// aheadFull reports whether sh holds as many messages of quick tenants as
// it may (and the bound applies). Called with sh.mu held.
func (c *Consumer) aheadFull(sh *shard) bool {
	return sh.bounds.readAhead > 0 && !sh.pause.aheadOff && sh.count.quickQueued >= c.aheadLimit(sh)
}

// aheadStall is how long a read-ahead pause may last before housekeeping
// lifts it (see maintain): a healthy quick backlog halves in milliseconds.
const aheadStall = 100 * time.Millisecond
