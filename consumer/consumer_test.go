package consumer_test

import (
	"context"
	"errors"
	"fmt"
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

func TestConformanceInMemory(t *testing.T) {
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return noTenantHarness{consumertest.NewMemHarness(4)} })
}

func TestSpillLogConformanceInMemory(t *testing.T) {
	consumertest.RunSpillLog(t, func(t testing.TB) consumertest.SpillLogHarness { return &memSpillHarness{s: consumertest.NewSpill()} })
}

// memSpillHarness runs the spill log suite on the in-memory log; every Open
// is the same log (it is its own durable state).
type memSpillHarness struct{ s *consumertest.Spill }

func (h *memSpillHarness) Open(testing.TB) consumer.SpillLog { return h.s }
func (h *memSpillHarness) Partition() consumer.Partition {
	return consumer.Partition{Topic: "orders", ID: 0}
}
func (h *memSpillHarness) Other() consumer.Partition {
	return consumer.Partition{Topic: "orders", ID: 3}
}

// noTenantHarness exposes the in-memory sink's no-tenant bucket to the suite.
type noTenantHarness struct{ *consumertest.MemHarness }

func (h noTenantHarness) NoTenantLetters(t testing.TB) []dlq.Record { return h.S.Records("", true) }

type engine struct {
	t      *testing.T
	h      *consumertest.MemHarness
	src    *consumertest.Source
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

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

func produce(h *consumertest.MemHarness, tenant string, p, seq int) {
	h.Produce(nil, consumertest.Msg{Tenant: tenant, Partition: p, Value: []byte(fmt.Sprintf("%s/%d/%06d", tenant, p, seq))})
}

func fastPolicy() policy.Policy { return consumertest.FastPolicy() }

// TestNoisyNeighbour: 20 tenants on 4 partitions; tenant A fails 100% with
// a transient error for a window, then recovers. The others finish while A
// is parked; afterwards every A message is handled, in order, and nothing
// is dead-lettered.
func TestNoisyNeighbour(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(4)
	const tenants, per = 20, 50
	for i := range per {
		for tn := range tenants {
			produce(h, fmt.Sprintf("t%02d", tn), (tn+i)%4, i)
		}
	}
	var down atomic.Bool
	down.Store(true)
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		tn, _ := m.Header(consumertest.TenantHeader)
		if string(tn) == "t00" && down.Load() {
			return errors.New("dependency of t00 is down")
		}
		rec.Add(string(tn), string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "the 19 healthy tenants finish", func() bool { return rec.Distinct() == (tenants-1)*per })
	ts, ok := e.c.Tenant("t00")
	if !ok || ts.Parked == 0 || rec.Count("t00") != 0 {
		t.Fatalf("t00 while down: tracked %v parked %d handled %d", ok, ts.Parked, rec.Count("t00"))
	}
	down.Store(false)
	consumertest.Eventually(t, "t00 drains after recovery", func() bool { return rec.Distinct() == tenants*per })
	assertPartitionOrder(t, rec.Order("t00"))
	if n := h.S.Total(); n != 0 {
		t.Fatalf("transient outage dead-lettered %d messages", n)
	}
	e.stop()
	for p := range 4 {
		if got, want := h.B.Committed(h.Group, p), int64(tenants*per/4); got != want {
			t.Errorf("partition %d committed %d, want %d", p, got, want)
		}
	}
	if r := h.B.Regressions(); len(r) != 0 {
		t.Fatalf("commit regressions: %v", r)
	}
}

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

// TestPoisonPermanent: one message of A fails permanently: exactly that one
// reaches A's DLQ, with reason and attempts; A's others are handled; no
// other tenant gets a dead letter.
func TestPoisonPermanent(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(2)
	for i := range 10 {
		produce(h, "A", 0, i)
		produce(h, "B", 1, i)
	}
	rec := consumertest.NewRecorder()
	run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000004" {
			return policy.Permanent(errors.New("schema violation"))
		}
		tn, _ := m.Header(consumertest.TenantHeader)
		rec.Add(string(tn), string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "19 handled and one dead letter", func() bool { return rec.Distinct() == 19 && h.S.Total() == 1 })
	got := h.S.Records("A", false)
	if len(got) != 1 || string(got[0].Value) != "A/0/000004" || got[0].Reason != dlq.ReasonPermanent || got[0].Attempts != 1 {
		t.Fatalf("A's DLQ = %+v", got)
	}
	if !strings.Contains(got[0].Error, "schema violation") || got[0].Offset != 4 || got[0].Group != "" && got[0].Group != h.Group {
		t.Fatalf("record fields: error %q offset %d", got[0].Error, got[0].Offset)
	}
	if n := len(h.S.Records("B", false)); n != 0 {
		t.Fatalf("B got %d dead letters", n)
	}
}

// TestExhaustedWhileClosed: a message that always fails while the breaker
// stays closed is dead-lettered after max attempts, once the tenant's next
// message shows that the failure is the message's own.
func TestExhaustedWhileClosed(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 5 {
		produce(h, "A", 0, i)
	}
	p := fastPolicy()
	p.Breaker.ConsecutiveFailures = 10 // stays closed through 3 attempts
	var calls atomic.Int64
	rec := consumertest.NewRecorder()
	run(t, h, p, consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000001" {
			calls.Add(1)
			return errors.New("bad row")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "4 handled, 1 dead letter", func() bool { return rec.Distinct() == 4 && h.S.Total() == 1 })
	got := h.S.Records("A", false)[0]
	// 3 attempts, then one last attempt after the next message succeeded.
	if got.Reason != dlq.ReasonExhausted || got.Attempts != 4 || calls.Load() != 4 {
		t.Fatalf("reason %q attempts %d calls %d", got.Reason, got.Attempts, calls.Load())
	}
}

// TestJudgeGivesTheHeadALastChance: the head exhausts its attempts, the
// next message succeeds, and the head's last attempt succeeds too (the
// failure ended just then): nothing is dead-lettered.
func TestJudgeGivesTheHeadALastChance(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 3 {
		produce(h, "A", 0, i)
	}
	p := fastPolicy()
	p.Breaker.ConsecutiveFailures = 10
	var calls atomic.Int64
	rec := consumertest.NewRecorder()
	run(t, h, p, consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000000" && calls.Add(1) <= 3 {
			return errors.New("flaky")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "all three handled", func() bool { return rec.Distinct() == 3 })
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
	if got := rec.Order("A"); got[0] != "A/0/000001" || got[1] != "A/0/000000" {
		t.Fatalf("order %v: want the judge (000001) first, then the head", got)
	}
}

// TestLonePoisonDoesNotParkForever: a message that trips its tenant's
// breaker and fails every probe is dead-lettered as poison once the
// tenant's next message succeeds as a probe.
func TestLonePoisonDoesNotParkForever(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	produce(h, "A", 0, 0)
	rec := consumertest.NewRecorder()
	var poisonCalls atomic.Int64
	e := run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000000" {
			poisonCalls.Add(1)
			return errors.New("always fails")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	// Alone, it trips the breaker (3 consecutive) and is probed again and
	// again: it must not be dead-lettered as exhausted during what could be
	// an outage.
	consumertest.Eventually(t, "the lone message probed past PoisonProbes", func() bool { return poisonCalls.Load() >= 6 })
	if h.S.Total() != 0 {
		t.Fatal("lone failing message dead-lettered without evidence it is poison")
	}
	for i := 1; i <= 3; i++ {
		produce(h, "A", 0, i)
	}
	consumertest.Eventually(t, "the poison message dead-lettered, the others handled", func() bool {
		return h.S.Total() == 1 && rec.Distinct() == 3
	})
	got := h.S.Records("A", false)[0]
	if got.Reason != dlq.ReasonPoison || string(got.Value) != "A/0/000000" {
		t.Fatalf("dead letter reason %q value %q", got.Reason, got.Value)
	}
	assertPartitionOrder(t, rec.Order("A"))
	e.stop()
	if c := h.B.Committed(h.Group, 0); c != 4 {
		t.Fatalf("committed %d, want 4", c)
	}
}

// TestBoundPausesOnlyThatPartition: a parked tenant past its bound pauses
// its own partition while the other partition keeps flowing; nothing is
// dropped.
func TestBoundPausesOnlyThatPartition(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(2)
	for i := range 5 {
		produce(h, "stuck", 0, i)
	}
	var down atomic.Bool
	down.Store(true)
	rec := consumertest.NewRecorder()
	var pausedMu sync.Mutex
	paused := map[int32]int{}
	e := run(t, h, fastPolicy(), consumer.Config{
		MaxParkedPerTenant: 20,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header(consumertest.TenantHeader)
			if string(tn) == "stuck" && down.Load() {
				return errors.New("down")
			}
			rec.Add(string(tn), string(m.Value))
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventPaused {
				pausedMu.Lock()
				paused[ev.Partition.ID]++
				pausedMu.Unlock()
			}
		},
	})
	consumertest.Eventually(t, "stuck parked", func() bool { ts, _ := e.c.Tenant("stuck"); return ts.Parked > 0 })
	for i := 5; i < 300; i++ {
		produce(h, "stuck", 0, i)
	}
	consumertest.Eventually(t, "partition 0 paused", func() bool { return e.c.Stats().PausedPartitions == 1 })
	for i := range 100 {
		produce(h, "free", 1, i)
	}
	consumertest.Eventually(t, "partition 1 flows while 0 is paused", func() bool { return rec.Count("free") == 100 })
	pausedMu.Lock()
	if paused[1] != 0 || paused[0] == 0 {
		t.Fatalf("pauses by partition: %v", paused)
	}
	pausedMu.Unlock()
	if s := e.c.Stats(); s.Parked > 30 || e.src.Delivered() > 100+30 {
		t.Fatalf("parked %d, delivered %d: the pause did not stop fetching at the bound of 20", s.Parked, e.src.Delivered())
	}
	down.Store(false)
	consumertest.Eventually(t, "every stuck message handled", func() bool { return rec.Count("stuck") == 300 })
	assertPartitionOrder(t, rec.Order("stuck"))
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
}

// TestMissingAndInvalidTenant: no tenant key, or one over MaxTenantLen,
// goes to the no-tenant DLQ bucket with a reason, never dropped.
func TestMissingAndInvalidTenant(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	h.Produce(t, consumertest.Msg{Value: []byte("orphan")})
	h.Produce(t, consumertest.Msg{Tenant: strings.Repeat("k", 5000), Value: []byte("huge-key")})
	produce(h, "A", 0, 0)
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{MaxTenantLen: 4096, Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		rec.Add("", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "two no-tenant letters and one handled", func() bool {
		return len(h.S.Records("", true)) == 2 && rec.Distinct() == 1
	})
	got := h.S.Records("", true)
	if got[0].Reason != dlq.ReasonNoTenant || string(got[0].Value) != "orphan" {
		t.Fatalf("first: reason %q value %q", got[0].Reason, got[0].Value)
	}
	if got[1].Reason != dlq.ReasonInvalidTenant || !strings.Contains(got[1].Error, "MaxTenantLen") {
		t.Fatalf("second: reason %q error %q", got[1].Reason, got[1].Error)
	}
	e.stop()
	if c := h.B.Committed(h.Group, 0); c != 3 {
		t.Fatalf("committed %d, want 3", c)
	}
}

// TestHandlerPanic: a panic is recovered, counted as a failure, and the
// message is retried; the process survives.
func TestHandlerPanic(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	produce(h, "A", 0, 0)
	produce(h, "A", 0, 1)
	var calls atomic.Int64
	var panics atomic.Int64
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "A/0/000000" && calls.Add(1) == 1 {
				panic("nil map write")
			}
			rec.Add("A", string(m.Value))
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventPanicked {
				panics.Add(1)
			}
		},
	})
	consumertest.Eventually(t, "both handled", func() bool { return rec.Distinct() == 2 })
	if s := e.c.Stats(); s.Panics != 1 || s.Failed != 1 || panics.Load() != 1 {
		t.Fatalf("panics %d failed %d events %d", s.Panics, s.Failed, panics.Load())
	}
	if h.S.Total() != 0 {
		t.Fatal("a panic that succeeded on retry was dead-lettered")
	}
}

// TestDLQDown: while the sink fails, the poison message stays unsettled
// (the commit does not pass it) and is retried; once the sink is back it
// lands there and the commit moves on. Nothing is lost.
func TestDLQDown(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	h.S.SetDown(true)
	produce(h, "A", 0, 0)
	produce(h, "A", 0, 1)
	produce(h, "A", 0, 2)
	rec := consumertest.NewRecorder()
	run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000001" {
			return policy.Permanent(errors.New("bad"))
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "DLQ writes refused a few times", func() bool { return h.S.Failures() >= 3 })
	if c := h.B.Committed(h.Group, 0); c > 1 {
		t.Fatalf("committed %d past the message whose dead letter was not written", c)
	}
	if rec.Has("A/0/000002") {
		t.Fatal("a later message of the tenant was handled before the earlier one was settled")
	}
	h.S.SetDown(false)
	consumertest.Eventually(t, "dead letter written and the rest handled", func() bool {
		return h.S.Total() == 1 && rec.Distinct() == 2 && h.B.Committed(h.Group, 0) == 3
	})
}

// TestConfigValidation: required fields and negative limits are refused.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	ok := consumer.Config{
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:  consumer.FromKey(),
		DLQ:     consumertest.NewSink(),
	}
	cases := []struct {
		name  string
		edit  func(*consumer.Config)
		field string
	}{
		{"no handler", func(c *consumer.Config) { c.Handler = nil }, "Handler"},
		{"no tenant", func(c *consumer.Config) { c.Tenant = nil }, "Tenant"},
		{"no dlq", func(c *consumer.Config) { c.DLQ = nil }, "DLQ"},
		{"negative concurrency", func(c *consumer.Config) { c.Concurrency = -1 }, "Concurrency"},
		{"negative parked", func(c *consumer.Config) { c.MaxParked = -5 }, "MaxParked"},
		{"negative DLQ probe", func(c *consumer.Config) { c.DLQProbe = -time.Second }, "DLQProbe"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			_, err := consumer.New(cfg)
			if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	if _, err := consumer.New(ok); err != nil {
		t.Fatal(err)
	}
}

func TestTenantExtractors(t *testing.T) {
	t.Parallel()
	m := &consumer.Message{Key: []byte("k1"), Headers: []dlq.Header{{Key: "x-tenant", Value: []byte("acme")}}}
	if got, err := consumer.FromHeader("x-tenant")(m); err != nil || got != "acme" {
		t.Fatalf("FromHeader = %q, %v", got, err)
	}
	if _, err := consumer.FromHeader("absent")(m); !errors.Is(err, consumer.ErrNoTenant) {
		t.Fatalf("missing header err = %v", err)
	}
	if got, err := consumer.FromKey()(m); err != nil || got != "k1" {
		t.Fatalf("FromKey = %q, %v", got, err)
	}
	if _, err := consumer.FromKey()(&consumer.Message{}); !errors.Is(err, consumer.ErrNoTenant) {
		t.Fatalf("empty key err = %v", err)
	}
}
