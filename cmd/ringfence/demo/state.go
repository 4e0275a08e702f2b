package demo

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// TenantResult is one tenant's outcome in one run.
type TenantResult struct {
	Tenant string
	// Role is "outage", "slow", "hang", "hot", "poison" or "".
	Role string
	// Partition is where the producer put the tenant (-1: no partitions).
	Partition int
	// Mate says the tenant is healthy and shares the bad tenant's partition.
	Mate bool
	// Handled counts distinct messages handled by the run.
	Handled int
	// InWindow counts those first handled during the fault window.
	InWindow int
	// DeadLettered counts distinct messages read back from the DLQ.
	DeadLettered int
	// MaxParked is the most messages seen parked at once (-1 when the
	// engine did not track this tenant on its own: Shared).
	MaxParked int
	// Trips counts breaker openings of this tenant's guard (-1: Shared).
	Trips int
	// StallTrips counts those whose last outcome was a stall: a slow call
	// (a success over the slow-call threshold, see policy.SlowCall) or a
	// call past the policy's Deadline. A dependency, or a machine, stalled
	// (-1: Shared).
	StallTrips int
}

// RunResult is the outcome of one run: its figures (see figures) and the
// counters the run kept besides.
type RunResult struct {
	Mode Mode
	// Ran is false for a mode the demo did not run.
	Ran bool
	figures
	// Redelivered counts handler successes for a message already handled.
	Redelivered int
	// PartitionMismatches counts messages that reached the consumer on
	// another partition than the producer's key hash says (must be 0:
	// otherwise the partition-mates group is wrong).
	PartitionMismatches int
	// SharedTrips counts the shared breaker's openings (Shared only).
	SharedTrips int
	// MaxParked is the most messages parked at once, all tenants.
	MaxParked int
	// Rescues counts the engine's rescues of partitions whose workers on
	// quick lanes all hung: consumer.PartitionStats.Rescues summed over the
	// assigned partitions, the largest sum sampled.
	Rescues uint64
	Tenants []TenantResult
	// Elapsed is the run's wall time from the first message produced to
	// the end of the drain; Drained is how long of it came after the
	// deadline (production end + Settle).
	Elapsed, Drained time.Duration
	// ReadBack is the time the restart read-back took (0: not needed).
	ReadBack time.Duration
}

// Snapshot is the live state of a run, passed to the view.
type Snapshot struct {
	Broker    string
	Kind      Kind
	Mode      Mode
	Elapsed   time.Duration
	Duration  time.Duration
	FaultOn   bool
	Producing bool
	Rows      []Row
	// Totals.
	Produced, Handled, Dead, Parked, Backlog int
	// Lag is the largest partition's commit lag at the last sample.
	Lag int64
	// Heap is the process's live heap at the last GC.
	Heap uint64
	// SharedState is the shared breaker's state (Shared only).
	SharedState policy.State
}

// Row is one tenant in a Snapshot.
type Row struct {
	Tenant                         string
	Role                           string
	Handled, Backlog, Parked, Dead int
	State                          policy.State
	TrackedAlone                   bool // Parked and State are this tenant's own
}

// runState is the live bookkeeping of one run. The handler, the sink and
// the engine's event hook write it from many goroutines, so every slot is
// atomic; all of it is allocated before the consumer starts, so that the
// heap it takes is not counted as the consumer's.
type runState struct {
	p      *plan
	g      groups
	mode   Mode
	source string // the run's topic: its partitions are the keyed ones
	badKey string // the bad tenant's engine key; "" when it has none (Shared)
	start  atomic.Int64

	// By id. Times are elapsed ns + 1, so that 0 means "not yet".
	produced []atomic.Int64
	handled  []atomic.Int64
	latency  []atomic.Int64
	fromBrk  []atomic.Int64 // handled minus the message's broker timestamp
	order    []atomic.Uint64
	dead     []atomic.Int64
	part     []atomic.Uint32 // partition (partRef) of the first handling
	offset   []atomic.Int64  // offset of the first handling
	counted  []atomic.Bool   // settled counts the message (handled or dead-lettered)

	tProduced, tHandled, tDead []atomic.Int64 // per tenant
	settled, redeliv, mismatch atomic.Int64
	rank                       atomic.Uint64
	badParks                   atomic.Int64
	lastLag                    atomic.Int64
	trips                      sync.Map // engine key -> *atomic.Int64
	stallTrips                 sync.Map // the same, of trips on a stall (TenantResult.StallTrips)

	mu        sync.Mutex
	reordered []msgRef // EventReordered of the bad tenant (at most maxReordered)
}

// msgRef names a message by where the engine got it.
type msgRef struct {
	part   uint32
	offset int64
}

// partRef is a compact name of a partition.
func partRef(p consumer.Partition) uint32 {
	h := fnv.New32a()
	h.Write([]byte(p.Topic))
	h.Write([]byte{byte(p.ID >> 24), byte(p.ID >> 16), byte(p.ID >> 8), byte(p.ID)})
	return h.Sum32()
}

func newRunState(p *plan, g groups, mode Mode, source string) *runState {
	st := &runState{
		p: p, g: g, mode: mode, source: source,
		produced:  make([]atomic.Int64, p.total),
		handled:   make([]atomic.Int64, p.total),
		latency:   make([]atomic.Int64, p.total),
		fromBrk:   make([]atomic.Int64, p.total),
		order:     make([]atomic.Uint64, p.total),
		dead:      make([]atomic.Int64, p.total),
		part:      make([]atomic.Uint32, p.total),
		offset:    make([]atomic.Int64, p.total),
		counted:   make([]atomic.Bool, p.total),
		tProduced: make([]atomic.Int64, len(p.tenants)),
		tHandled:  make([]atomic.Int64, len(p.tenants)),
		tDead:     make([]atomic.Int64, len(p.tenants)),
	}
	if mode != Shared {
		st.badKey = p.tenants[p.bad]
	}
	return st
}

func (st *runState) elapsed() time.Duration {
	s := st.start.Load()
	if s == 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - s)
}

func (st *runState) faultOn(el time.Duration) bool {
	return st.mode != Baseline && el >= st.p.sc.FaultStart && el < st.p.sc.FaultEnd
}

// Handle is the demo's handler. Poison messages always fail: the bad
// tenant's (a poison burst) with policy.Permanent, the poison tenant's
// with a plain error. During the
// fault window the bad tenant's calls fail (outage, long-outage), take
// SlowLatency (slow) or block until their ctx ends (hang); every other call
// reaches a dependency that takes Latency to 2*Latency (or returns at once,
// Instant). A hot tenant's
// calls are ordinary: its fault is its traffic.
func (st *runState) Handle(ctx context.Context, m *consumer.Message) error {
	p := st.p
	v, ok := decodeValue(m.Value)
	if !ok || v.id >= p.total || p.tenants[p.owner[v.id]] != v.tenant {
		return policy.Permanent(errMalformed)
	}
	if v.kind == kindPoison {
		if int(p.owner[v.id]) == p.bad {
			// A poison burst: the message's own fault, as its handler
			// knows (it cannot be parsed, say).
			return policy.Permanent(errPoison)
		}
		return errPoison // the outage's poison tenant: found by evidence
	}
	if int(p.owner[v.id]) == p.bad && st.faultOn(st.elapsed()) {
		switch p.sc.Kind {
		case KindOutage, KindLongOutage:
			return errDependencyDown
		case KindSlow:
			if err := sleepCtx(ctx, p.sc.SlowLatency); err != nil {
				return err
			}
			st.done(m, v)
			return nil
		case KindHang:
			<-ctx.Done()
			return ctx.Err()
		}
	}
	if !p.sc.Instant {
		if err := sleepCtx(ctx, p.sc.Latency+rand.N(p.sc.Latency+1)); err != nil {
			return err
		}
	}
	st.done(m, v)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// done records a successful handling of v.
func (st *runState) done(m *consumer.Message, v decodedValue) {
	el := st.elapsed()
	if !st.handled[v.id].CompareAndSwap(0, int64(el)+1) {
		st.redeliv.Add(1)
		return
	}
	st.order[v.id].Store(st.rank.Add(1))
	now := time.Now().UnixNano()
	st.latency[v.id].Store(now - v.stamp)
	from := now - v.stamp // without a broker timestamp, end to end
	if !m.Time.IsZero() {
		from = max(now-m.Time.UnixNano(), 0)
	}
	st.fromBrk[v.id].Store(from)
	st.part[v.id].Store(partRef(m.Partition))
	st.offset[v.id].Store(m.Offset)
	t := int(st.p.owner[v.id])
	st.tHandled[t].Add(1)
	if st.counted[v.id].CompareAndSwap(false, true) {
		st.settled.Add(1)
	}
	// Partitions of the run's own topic are keyed; others (a spill or
	// re-feed partition) are not checked.
	if st.g.keyed && m.Partition.Topic == st.source && int(m.Partition.ID) != st.g.part[t] {
		st.mismatch.Add(1)
	}
}

// onEvent keeps what the figures need of the engine's events.
func (st *runState) onEvent(e consumer.Event) {
	if st.badKey == "" || e.Tenant != st.badKey {
		return
	}
	switch e.Kind {
	case consumer.EventParked:
		st.badParks.Add(1)
	case consumer.EventReordered:
		st.mu.Lock()
		if len(st.reordered) < maxReordered {
			st.reordered = append(st.reordered, msgRef{partRef(e.Partition), e.Offset})
		}
		st.mu.Unlock()
	}
}

// countingSink counts dead letters by the real tenant, read from the value.
type countingSink struct {
	next dlq.Sink
	st   *runState
}

func (s countingSink) Write(ctx context.Context, r *dlq.Record) error {
	if err := s.next.Write(ctx, r); err != nil {
		return err
	}
	st := s.st
	if v, ok := decodeValue(r.Value); ok && v.id < st.p.total {
		if st.dead[v.id].CompareAndSwap(0, int64(st.elapsed())+1) {
			st.tDead[st.p.owner[v.id]].Add(1)
			if st.counted[v.id].CompareAndSwap(false, true) {
				st.settled.Add(1)
			}
		}
	}
	return nil
}

// errDLQDown is what the DLQ answers during a DLQ outage.
var errDLQDown = errors.New("demo: the dead-letter queue is unreachable")

// outageSink refuses every write during the fault of a dlq-outage run, as
// a DLQ that cannot be reached: the demo's brokers serve the source too,
// so the DLQ alone is taken away here. Other runs pass every write on.
type outageSink struct {
	next dlq.Sink
	st   *runState
}

func (s outageSink) Write(ctx context.Context, r *dlq.Record) error {
	if s.st.p.sc.Kind.dlqDown() && s.st.faultOn(s.st.elapsed()) {
		return errDLQDown
	}
	return s.next.Write(ctx, r)
}

// readySource tells when the source has its first partition.
type readySource struct {
	consumer.Source
	once  sync.Once
	ready chan struct{}
}

// MessagingSystem passes on the wrapped source's (consumer.SystemNamer),
// which the embedded interface does not promote.
func (s *readySource) MessagingSystem() string {
	if n, ok := s.Source.(consumer.SystemNamer); ok {
		return n.MessagingSystem()
	}
	return ""
}

type readyDispatcher struct {
	consumer.Dispatcher
	s *readySource
}

func (d readyDispatcher) Assigned(p consumer.Partition) {
	d.Dispatcher.Assigned(p)
	d.s.once.Do(func() { close(d.s.ready) })
}

func (s *readySource) Run(ctx context.Context, d consumer.Dispatcher) error {
	return s.Source.Run(ctx, readyDispatcher{d, s})
}
