package consumer_test

// What the package's tests share: engines over the in-memory harness (run,
// startScripted) or over a generating source (startWith), scripted
// handlers, a clock that moves only when told to (stepClock) and a bounded
// poll (within).

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// engine is one Run of a consumer over a MemHarness's broker (see run).
type engine struct {
	t      *testing.T
	h      *consumertest.MemHarness
	src    *consumertest.Source
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

// run starts an engine over h with policy p for every tenant and cfg's
// handler and limits; it is stopped at the end of the test.
func run(t *testing.T, h *consumertest.MemHarness, p policy.Policy, cfg consumer.Config) *engine {
	t.Helper()
	cfg.Tenant = h.Tenant()
	if cfg.DLQ == nil {
		cfg.DLQ = h.S
	}
	cfg.Scope = scope.New(p, scope.Options[string]{})
	if cfg.DLQRetry == 0 {
		cfg.DLQRetry = time.Millisecond
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := h.B.Source(h.Group)
	ctx, cancel := context.WithCancel(context.Background())
	e := &engine{t: t, h: h, src: src, c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx, src) }()
	t.Cleanup(e.stop)
	return e
}

// stop cancels Run and waits for it (once).
func (e *engine) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("Run: %v", err)
		}
	case <-time.After(consumertest.WaitTimeout):
		e.t.Error("Run did not return after cancel")
	}
}

// produce appends message seq of tenant to partition p, valued
// "tenant/p/seq" (seq in six digits, so that values sort in order).
func produce(h *consumertest.MemHarness, tenant string, p, seq int) {
	h.Produce(nil, consumertest.Msg{Tenant: tenant, Partition: p, Value: []byte(fmt.Sprintf("%s/%d/%06d", tenant, p, seq))})
}

func fastPolicy() policy.Policy { return consumertest.FastPolicy() }

// assertPartitionOrder fails t unless the values (see produce) of each
// partition come in increasing order.
func assertPartitionOrder(t *testing.T, values []string) {
	t.Helper()
	last := map[string]string{}
	for _, v := range values {
		i := strings.LastIndexByte(v, '/')
		p := v[:i]
		if prev, ok := last[p]; ok && v < prev {
			t.Fatalf("%s handled after %s", v, prev)
		}
		last[p] = v
	}
}

// genSource delivers n generated messages on one partition, honouring
// Pause, keeping none of them: what the engine holds is all that is held.
type genSource struct {
	n      int
	gen    func(i int) *consumer.Message
	settle func(m *consumer.Message) error

	mu      sync.Mutex
	cond    *sync.Cond
	paused  bool
	commits atomic.Int64
}

func newGenSource(n int, gen func(i int) *consumer.Message) *genSource {
	s := &genSource{n: n, gen: gen}
	s.cond = sync.NewCond(&s.mu)
	s.commits.Store(-1)
	return s
}

var genPart = consumer.Partition{Topic: "gen", ID: 0}

func (s *genSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	d.Assigned(genPart)
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	batch := make([]*consumer.Message, 0, 64)
	for i := 0; i < s.n && ctx.Err() == nil; {
		s.mu.Lock()
		for s.paused && ctx.Err() == nil {
			s.cond.Wait()
		}
		s.mu.Unlock()
		batch = batch[:0]
		for ; i < s.n && len(batch) < cap(batch); i++ {
			m := s.gen(i)
			m.Partition, m.Offset, m.Topic = genPart, int64(i), genPart.Topic
			batch = append(batch, m)
		}
		d.DeliverBatch(batch)
	}
	<-ctx.Done()
	return nil
}

func (s *genSource) Settle(ctx context.Context, m *consumer.Message) error {
	if s.settle != nil {
		return s.settle(m)
	}
	return nil
}

func (s *genSource) Commit(ctx context.Context, p consumer.Partition, next int64) error {
	s.commits.Store(next)
	return nil
}

func (s *genSource) Pause(consumer.Partition) { s.mu.Lock(); s.paused = true; s.mu.Unlock() }

func (s *genSource) Resume(consumer.Partition) {
	s.mu.Lock()
	s.paused = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// tenantMsg is a message of tenant (its key, see consumer.FromKey).
func tenantMsg(tenant string, value string) *consumer.Message {
	return &consumer.Message{Key: []byte(tenant), Value: []byte(value)}
}

// startWith runs an engine over src and stops it at the end of the test.
func startWith(t *testing.T, cfg consumer.Config, src consumer.Source) *consumer.Consumer {
	t.Helper()
	if cfg.Tenant == nil {
		cfg.Tenant = consumer.FromKey()
	}
	if cfg.DLQ == nil {
		cfg.DLQ = consumertest.NewSink()
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return within 20s of cancel")
		}
	})
	return c
}

// stepClock is a policy.Clock that moves only when told to: the guards'
// latency estimates then read exactly the durations a test gives its calls.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) Now() time.Time {
	return time.Unix(1_800_000_000, 0).Add(time.Duration(c.ns.Load()))
}

func (c *stepClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// within polls cond every 2ms for up to d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// scripted is a handler whose outcome per message value is decided by fail
// (called with the value and its 1-based call number); successes are
// recorded in order.
type scripted struct {
	fail func(value string, call int) error

	mu      sync.Mutex
	calls   map[string]int
	handled []string
}

func newScripted(fail func(value string, call int) error) *scripted {
	return &scripted{fail: fail, calls: map[string]int{}}
}

func (s *scripted) Handle(ctx context.Context, m *consumer.Message) error {
	v := string(m.Value)
	s.mu.Lock()
	s.calls[v]++
	call := s.calls[v]
	s.mu.Unlock()
	if err := s.fail(v, call); err != nil {
		return err
	}
	s.mu.Lock()
	s.handled = append(s.handled, v)
	s.mu.Unlock()
	return nil
}

func (s *scripted) callsOf(v string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[v]
}

func (s *scripted) handledAll(vs ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if !slices.Contains(s.handled, v) {
			return false
		}
	}
	return true
}

func (s *scripted) handledList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handled)
}

// startScripted runs an engine over h with policy p and cfg's limits.
func startScripted(t *testing.T, h *consumertest.MemHarness, p policy.Policy, cfg consumer.Config, hd consumer.Handler) *runningEngine {
	t.Helper()
	cfg.Scope = scope.New(p, scope.Options[string]{})
	cfg.Handler = hd
	cfg.Tenant = h.Tenant()
	cfg.DLQ = h.S
	cfg.Group = h.Group
	cfg.DLQRetry = time.Millisecond
	cfg.DrainTimeout = 2 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := h.B.Source(h.Group)
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEngine{c: c, src: src, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx, src) }()
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// produceValues appends values, in order, to partition p for tenant.
func produceValues(h *consumertest.MemHarness, tenant string, p int, values ...string) {
	for _, v := range values {
		h.B.Append(p, nil, []byte(v), dlq.Header{Key: consumertest.TenantHeader, Value: []byte(tenant)})
	}
}

// dlqValues lists the values in tenant's DLQ, oldest first.
func dlqValues(h *consumertest.MemHarness, tenant string) []string {
	var out []string
	for _, r := range h.S.Records(tenant, false) {
		out = append(out, string(r.Value))
	}
	return out
}
