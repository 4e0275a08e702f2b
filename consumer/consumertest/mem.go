package consumertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// TenantHeader is the header the in-memory harness keeps the tenant in.
const TenantHeader = "tenant"

// Broker is an in-memory partitioned log with committed offsets per group.
// It is safe for concurrent use.
type Broker struct {
	topic string

	mu        sync.Mutex
	cond      *sync.Cond
	logs      [][]consumer.Message // per partition
	committed map[string][]int64   // group -> next offset per partition
	regress   []string             // commit regressions seen (must stay empty)
}

// NewBroker returns a broker with n partitions.
func NewBroker(topic string, partitions int) *Broker {
	b := &Broker{topic: topic, logs: make([][]consumer.Message, partitions), committed: make(map[string][]int64)}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Append adds a message to partition p and returns its offset.
func (b *Broker) Append(p int, key, value []byte, headers ...dlq.Header) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	off := int64(len(b.logs[p]))
	b.logs[p] = append(b.logs[p], consumer.Message{
		Key: key, Value: value, Headers: headers, Topic: b.topic,
		Partition: consumer.Partition{Topic: b.topic, ID: int32(p)}, Offset: off, Time: time.Now(),
	})
	b.cond.Broadcast()
	return off
}

// Committed returns the group's committed next offset for partition p.
func (b *Broker) Committed(group string, p int) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.committed[group]; c != nil {
		return c[p]
	}
	return 0
}

// Regressions lists commits that went backwards (a correct engine makes none).
func (b *Broker) Regressions() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.regress)
}

func (b *Broker) commit(group string, p int, next int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.committed[group]
	if c == nil {
		c = make([]int64, len(b.logs))
		b.committed[group] = c
	}
	if next < c[p] {
		b.regress = append(b.regress, fmt.Sprintf("partition %d: %d after %d", p, next, c[p]))
		return
	}
	c[p] = next
}

// Source returns a new source reading every partition for group, from the
// group's committed offsets.
func (b *Broker) Source(group string) *Source {
	s := &Source{b: b, group: group, paused: make(map[int32]bool), revoke: make(chan int32, 16), killed: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Source is an in-memory consumer.Source over a Broker: one goroutine per
// partition, Pause and Resume per partition, commits into the broker.
type Source struct {
	b     *Broker
	group string

	mu        sync.Mutex
	cond      *sync.Cond
	paused    map[int32]bool
	pauses    int
	settled   int
	delivered int
	revoke    chan int32

	killOnce sync.Once
	killed   chan struct{} // closed by Kill
	killErr  error         // written before killed is closed
}

// Kill makes the source dead, as a broker whose topic or consumer was
// deleted: Run stops delivering and returns err (which must not be nil).
func (s *Source) Kill(err error) {
	s.killOnce.Do(func() {
		s.killErr = err
		close(s.killed)
	})
}

// Pauses counts Pause calls.
func (s *Source) Pauses() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pauses
}

// Delivered counts messages delivered.
func (s *Source) Delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered
}

// Rebalance revokes every partition and assigns them again, as a consumer
// group rebalance that gives this member the same partitions would: the
// engine drops buffered and parked messages, and they are redelivered from
// the committed offsets.
func (s *Source) Rebalance() { s.revoke <- 0 }

// Run implements consumer.Source.
func (s *Source) Run(ctx context.Context, d consumer.Dispatcher) error {
	for {
		gctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for p := range s.b.logs {
			part := consumer.Partition{Topic: s.b.topic, ID: int32(p)}
			d.Assigned(part)
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.feed(gctx, d, p)
			}()
		}
		stop := context.AfterFunc(gctx, func() {
			s.b.mu.Lock()
			s.b.cond.Broadcast()
			s.b.mu.Unlock()
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		})
		killed := false
		select {
		case <-ctx.Done():
		case <-s.revoke:
		case <-s.killed:
			killed = true
		}
		cancel()
		wg.Wait()
		stop()
		if killed {
			// A dead broker revokes nothing: the engine drains what it
			// holds, as it does after any source error.
			return s.killErr
		}
		for p := range s.b.logs {
			d.Revoked(consumer.Partition{Topic: s.b.topic, ID: int32(p)})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (s *Source) feed(ctx context.Context, d consumer.Dispatcher, p int) {
	next := s.b.Committed(s.group, p)
	for {
		s.mu.Lock()
		for s.paused[int32(p)] && ctx.Err() == nil {
			s.cond.Wait()
		}
		s.mu.Unlock()
		s.b.mu.Lock()
		for int64(len(s.b.logs[p])) <= next && ctx.Err() == nil {
			s.b.cond.Wait()
		}
		if ctx.Err() != nil {
			s.b.mu.Unlock()
			return
		}
		m := s.b.logs[p][next]
		s.b.mu.Unlock()
		mm := m
		d.Deliver(&mm)
		s.mu.Lock()
		s.delivered++
		s.mu.Unlock()
		next++
	}
}

// Settle implements consumer.Source.
func (s *Source) Settle(ctx context.Context, m *consumer.Message) error {
	s.mu.Lock()
	s.settled++
	s.mu.Unlock()
	return nil
}

// Commit implements consumer.Source.
func (s *Source) Commit(ctx context.Context, p consumer.Partition, next int64) error {
	s.b.commit(s.group, int(p.ID), next)
	return nil
}

// Pause implements consumer.Source.
func (s *Source) Pause(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = true
	s.pauses++
	s.mu.Unlock()
}

// Resume implements consumer.Source.
func (s *Source) Resume(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// ErrSinkDown is returned by a Sink that was set down.
var ErrSinkDown = errors.New("consumertest: DLQ sink is down")

// Sink is an in-memory dlq.Sink that can be taken down. Safe for
// concurrent use.
type Sink struct {
	mu      sync.Mutex
	down    bool
	fails   int
	records map[string][]dlq.Record // by token
}

// NewSink returns an empty, working sink.
func NewSink() *Sink { return &Sink{records: make(map[string][]dlq.Record)} }

// SetDown makes Write fail (true) or work (false).
func (s *Sink) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// Failures counts refused writes.
func (s *Sink) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fails
}

// Write implements dlq.Sink.
func (s *Sink) Write(ctx context.Context, r *dlq.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		s.fails++
		return ErrSinkDown
	}
	tok := dlq.NoTenantToken
	if r.Reason != dlq.ReasonNoTenant && r.Reason != dlq.ReasonInvalidTenant {
		tok = dlq.TenantToken(r.Tenant)
	}
	rec := *r
	rec.Time = time.Now()
	rec.Position = int64(len(s.records[tok]))
	s.records[tok] = append(s.records[tok], rec)
	return nil
}

// Records returns the tenant's dead letters (tenant "" with noTenant true
// for the no-tenant bucket).
func (s *Sink) Records(tenant string, noTenant bool) []dlq.Record {
	tok := dlq.TenantToken(tenant)
	if noTenant {
		tok = dlq.NoTenantToken
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.records[tok])
}

// Total counts every dead letter.
func (s *Sink) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.records {
		n += len(r)
	}
	return n
}

// MemHarness is the in-memory Harness: a Broker, a Sink and a Spill log.
// It implements Killer and Spiller.
type MemHarness struct {
	B     *Broker
	S     *Sink
	Sp    *Spill
	Group string

	mu      sync.Mutex
	sources []*Source // made by NewSource, for KillSource
	dead    bool
}

// ErrKilled is the error the in-memory harness's sources end with after
// KillSource.
var ErrKilled = errors.New("consumertest: source killed")

// NewMemHarness returns a harness with the given partitions.
func NewMemHarness(partitions int) *MemHarness {
	return &MemHarness{B: NewBroker("orders", partitions), S: NewSink(), Sp: NewSpill(), Group: "g"}
}

// SpillLog implements Spiller.
func (h *MemHarness) SpillLog(t testing.TB) consumer.SpillLog { return h.Sp }

// Partitions implements Harness.
func (h *MemHarness) Partitions() int { return len(h.B.logs) }

// Tenant implements Harness.
func (h *MemHarness) Tenant() consumer.TenantFunc { return consumer.FromHeader(TenantHeader) }

// Produce implements Harness.
func (h *MemHarness) Produce(t testing.TB, msgs ...Msg) {
	for _, m := range msgs {
		var hs []dlq.Header
		if m.Tenant != "" {
			hs = append(hs, dlq.Header{Key: TenantHeader, Value: []byte(m.Tenant)})
		}
		h.B.Append(m.Partition%h.Partitions(), nil, m.Value, hs...)
	}
}

// NewSource implements Harness.
func (h *MemHarness) NewSource(t testing.TB) consumer.Source {
	s := h.B.Source(h.Group)
	h.mu.Lock()
	h.sources = append(h.sources, s)
	if h.dead {
		s.Kill(ErrKilled)
	}
	h.mu.Unlock()
	return s
}

// KillSource implements Killer: every source made by NewSource, and every
// later one, ends Run with ErrKilled.
func (h *MemHarness) KillSource(t testing.TB) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dead = true
	for _, s := range h.sources {
		s.Kill(ErrKilled)
	}
	return ErrKilled
}

// Sink implements Harness.
func (h *MemHarness) Sink(t testing.TB) dlq.Sink { return h.S }

// DeadLetters implements Harness.
func (h *MemHarness) DeadLetters(t testing.TB, tenant string) []dlq.Record {
	return h.S.Records(tenant, false)
}

// StartSource runs src.Run(ctx, d) in the background for a test and returns
// a stop func that cancels it and waits (up to 30s) for Run to return,
// reporting any error Run returns (an adapter returns nil after a cancel).
// Stop runs at most once, and at the end of the test if not called before.
func StartSource(t testing.TB, src consumer.Source, d consumer.Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, d) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
