package consumer_test

// Operator controls (SetControls) and the fleet's breaker seeds
// (SetBreakerSeeds).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// callLog counts a handler's calls per tenant and records each tenant's
// handled values in order.
type callLog struct {
	mu    sync.Mutex
	calls map[string]int
	order map[string][]string
	at    map[string][]time.Time
}

func newCallLog() *callLog {
	return &callLog{calls: map[string]int{}, order: map[string][]string{}, at: map[string][]time.Time{}}
}

func (l *callLog) call(m *consumer.Message) string {
	tn, _ := m.Header(consumertest.TenantHeader)
	l.mu.Lock()
	l.calls[string(tn)]++
	l.at[string(tn)] = append(l.at[string(tn)], time.Now())
	l.mu.Unlock()
	return string(tn)
}

func (l *callLog) handled(tenant string, m *consumer.Message) {
	l.mu.Lock()
	l.order[tenant] = append(l.order[tenant], string(m.Value))
	l.mu.Unlock()
}

func (l *callLog) callsOf(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[tenant]
}

func (l *callLog) handledOf(tenant string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.order[tenant]...)
}

// assertAllInOrder fails t unless tenant's n messages on partition p (see
// produce) were each handled once, in order.
func assertAllInOrder(t *testing.T, got []string, tenant string, p, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("%s: handled %d messages, want %d: %v", tenant, len(got), n, got)
	}
	for i, v := range got {
		if want := fmt.Sprintf("%s/%d/%06d", tenant, p, i); v != want {
			t.Fatalf("%s: message %d is %s, want %s", tenant, i, v, want)
		}
	}
}

func tenantStats(t *testing.T, c *consumer.Consumer, key string) consumer.TenantStats {
	t.Helper()
	ts, _ := c.Tenant(key)
	return ts
}

// A Hold stops new attempts at once: the call in flight finishes, no other
// starts; the tenant's messages wait in order (others flow) and are all
// handled, in order, once it is released. Nothing is dead-lettered.
func TestHoldStopsAttemptsAndReleaseResumesInOrder(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	entered := make(chan struct{})
	gate := make(chan struct{})
	var first sync.Once
	var events sync.Map
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn := log.call(m)
			if tn == "a" {
				first.Do(func() { close(entered); <-gate })
			}
			log.handled(tn, m)
			return nil
		}),
		OnEvent: func(ev consumer.Event) { events.Store(ev.Kind.String()+"/"+ev.Tenant, true) },
	})
	for i := range 10 {
		produce(h, "a", 0, i)
	}
	<-entered
	e.c.SetControls(map[string]consumer.Control{"a": {Hold: true, By: "ops", Reason: "test"}})
	callsAtSet := log.callsOf("a")
	close(gate)
	for i := 10; i < 20; i++ {
		produce(h, "a", 0, i)
	}
	for i := range 10 {
		produce(h, "b", 0, i)
	}
	consumertest.Eventually(t, "b flows while a is held", func() bool { return len(log.handledOf("b")) == 10 })
	consumertest.Eventually(t, "a's other 19 messages held", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.Held && ts.Parked == 19
	})
	if n := log.callsOf("a"); n != 1 || callsAtSet != 1 {
		t.Fatalf("a called %d times (%d when SetControls returned), want 1: a Hold must stop new attempts", n, callsAtSet)
	}
	s := e.c.Stats()
	if s.Controlled != 1 {
		t.Fatalf("Stats.Controlled %d, want 1", s.Controlled)
	}
	ts := tenantStats(t, e.c, "a")
	if ts.Control == nil || !ts.Control.Hold || ts.Control.By != "ops" {
		t.Fatalf("TenantStats.Control %+v, want the hold", ts.Control)
	}
	if err := consumer.CheckInvariants(e.c); err != nil {
		t.Fatal(err)
	}
	e.c.SetControls(nil)
	consumertest.Eventually(t, "a handled after release", func() bool { return len(log.handledOf("a")) == 20 })
	assertAllInOrder(t, log.handledOf("a"), "a", 0, 20)
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
	if ts := tenantStats(t, e.c, "a"); ts.Control != nil || ts.Held || ts.Parked != 0 {
		t.Fatalf("after release: control %v held %v parked %d", ts.Control, ts.Held, ts.Parked)
	}
	for _, k := range []string{"control-set/a", "control-cleared/a"} {
		if _, ok := events.Load(k); !ok {
			t.Errorf("no %s event", k)
		}
	}
}

// A hold set before the tenant is first seen applies to its first
// message; held past MaxParkedPerTenant its messages spill (the
// partition's commit moves on), and after release they are re-fed and
// handled in order.
func TestHoldPastParkedBoundSpillsAndRefeedsInOrder(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	e := run(t, h, fastPolicy(), consumer.Config{
		Spill:              h.Sp,
		MaxParkedPerTenant: 5,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	e.c.SetControls(map[string]consumer.Control{"a": {Hold: true}})
	const n = 50
	for i := range n {
		produce(h, "a", 0, i)
	}
	consumertest.Eventually(t, "a spilled while held", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.Spilled == n && ts.Held
	})
	consumertest.Eventually(t, "the partition's commit passes the spilled messages", func() bool { return h.B.Committed(h.Group, 0) == n })
	if c := log.callsOf("a"); c != 0 {
		t.Fatalf("a called %d times while held", c)
	}
	e.c.SetControls(map[string]consumer.Control{})
	consumertest.Eventually(t, "a re-fed and handled after release", func() bool { return len(log.handledOf("a")) == n })
	assertAllInOrder(t, log.handledOf("a"), "a", 0, n)
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
}

// A quarantined tenant's messages go to its spill log with no attempt
// (reason quarantine), whether it was in the engine already or not, and
// nothing is re-fed until the quarantine is cleared.
func TestQuarantineSpillsWithoutAttemptsAndRefeedsOnClear(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	var quarantined atomic.Int32
	e := run(t, h, fastPolicy(), consumer.Config{
		Spill: h.Sp,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventSpilling && ev.Spill == consumer.SpillQuarantine {
				quarantined.Add(1)
			}
		},
	})
	produce(h, "a", 0, 0)
	consumertest.Eventually(t, "a's first message handled", func() bool { return len(log.handledOf("a")) == 1 })
	e.c.SetControls(map[string]consumer.Control{"a": {Quarantine: true}, "q": {Quarantine: true}})
	for i := 1; i < 20; i++ {
		produce(h, "a", 0, i)
		produce(h, "q", 0, i-1)
		produce(h, "b", 0, i-1)
	}
	consumertest.Eventually(t, "a and q spilled", func() bool {
		return tenantStats(t, e.c, "a").Spilled == 19 && tenantStats(t, e.c, "q").Spilled == 19
	})
	consumertest.Eventually(t, "b flows", func() bool { return len(log.handledOf("b")) == 19 })
	if a, q := log.callsOf("a"), log.callsOf("q"); a != 1 || q != 0 {
		t.Fatalf("calls while quarantined: a %d (1 before), q %d", a, q)
	}
	if quarantined.Load() != 2 {
		t.Fatalf("%d spilling events of reason quarantine, want 2", quarantined.Load())
	}
	if ts := tenantStats(t, e.c, "a"); ts.Refed != 0 || !ts.Held {
		t.Fatalf("a while quarantined: refed %d held %v", ts.Refed, ts.Held)
	}
	e.c.SetControls(map[string]consumer.Control{"q": {Quarantine: true}})
	consumertest.Eventually(t, "a re-fed after clear", func() bool { return len(log.handledOf("a")) == 20 })
	assertAllInOrder(t, log.handledOf("a"), "a", 0, 20)
	if q := log.callsOf("q"); q != 0 {
		t.Fatalf("q called %d times while still quarantined", q)
	}
	e.c.SetControls(nil)
	consumertest.Eventually(t, "q re-fed after clear", func() bool { return len(log.handledOf("q")) == 19 })
	assertAllInOrder(t, log.handledOf("q"), "q", 0, 19)
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
}

// Without a spill log a quarantine holds the tenant in memory; a hold
// survives a rebalance: the control is consulted when the partition's new
// lanes are made.
func TestQuarantineWithoutSpillLogHoldsAcrossRebalance(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	e.c.SetControls(map[string]consumer.Control{"a": {Quarantine: true}})
	for i := range 10 {
		produce(h, "a", 0, i)
	}
	consumertest.Eventually(t, "a held in memory", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.Held && ts.Parked == 10
	})
	produce(h, "b", 0, 0)
	consumertest.Eventually(t, "b handled", func() bool { return len(log.handledOf("b")) == 1 })
	e.src.Rebalance()
	// b's message, behind a's, is delivered again after the rebalance
	// (a held the partition's commit) and handled again.
	consumertest.Eventually(t, "b, behind a after the rebalance, handled", func() bool { return len(log.handledOf("b")) == 2 })
	consumertest.Eventually(t, "a held again after the rebalance", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.Held && ts.Parked == 10
	})
	if c := log.callsOf("a"); c != 0 {
		t.Fatalf("a called %d times while quarantined", c)
	}
	e.c.SetControls(nil)
	consumertest.Eventually(t, "a handled after clear", func() bool { return len(log.handledOf("a")) == 10 })
	assertAllInOrder(t, log.handledOf("a"), "a", 0, 10)
}

// A breaker forced open parks the tenant with no probe until the override
// is cleared; then a probe closes it and the rest follow in order.
func TestBreakerForceOpenParksUntilCleared(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	produce(h, "a", 0, 0)
	consumertest.Eventually(t, "a's first handled", func() bool { return len(log.handledOf("a")) == 1 })
	e.c.SetControls(map[string]consumer.Control{"a": {Breaker: consumer.BreakerForceOpen}})
	for i := 1; i < 10; i++ {
		produce(h, "a", 0, i)
	}
	consumertest.Eventually(t, "a parked behind its forced breaker", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.Parked == 9 && ts.State == policy.Open
	})
	// Refused again after a forced open period (the policy's
	// MaxOpenTimeout, when the lane asks again): still no probe.
	consumertest.Eventually(t, "a refused again after an open period", func() bool {
		return e.c.Scope().For("a").Stats().Rejected >= 2
	})
	if c := log.callsOf("a"); c != 1 {
		t.Fatalf("a called %d times, want 1 (before the override)", c)
	}
	e.c.SetControls(nil)
	consumertest.Eventually(t, "a handled after the override is cleared", func() bool { return len(log.handledOf("a")) == 10 })
	assertAllInOrder(t, log.handledOf("a"), "a", 0, 10)
	if ts := tenantStats(t, e.c, "a"); ts.State != policy.Closed {
		t.Fatalf("a's breaker %v after the probe succeeded", ts.State)
	}
}

// A breaker forced closed never opens: the tenant's failures are retried
// (and never park it) until they pass; nothing is dead-lettered.
func TestBreakerForceClosedNeverParks(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	var parked atomic.Int32
	var fails atomic.Int32
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn := log.call(m)
			if fails.Add(1) <= 12 { // four times what trips the policy's breaker
				return errors.New("transient")
			}
			log.handled(tn, m)
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventParked {
				parked.Add(1)
			}
		},
	})
	e.c.SetControls(map[string]consumer.Control{"a": {Breaker: consumer.BreakerForceClosed}})
	// One message: with none behind it, its failures are never evidence
	// against it (a judge round would reorder), only retries.
	produce(h, "a", 0, 0)
	consumertest.Eventually(t, "a handled", func() bool { return len(log.handledOf("a")) == 1 })
	if parked.Load() != 0 {
		t.Fatalf("a parked %d times with its breaker forced closed", parked.Load())
	}
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
}

// A Concurrency override raises the tenant's bulkhead limit at once: lanes
// waiting for a slot run.
func TestConcurrencyOverrideRaisesBulkhead(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(4)
	gate := make(chan struct{})
	var inflight, peak atomic.Int32
	e := run(t, h, fastPolicy(), consumer.Config{
		Concurrency:       8,
		TenantConcurrency: 1,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			n := inflight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-gate
			inflight.Add(-1)
			return nil
		}),
	})
	for p := range 4 {
		produce(h, "a", p, 0)
	}
	consumertest.Eventually(t, "one call of a in flight", func() bool { return inflight.Load() == 1 })
	if ts := tenantStats(t, e.c, "a"); ts.Limit != 1 {
		t.Fatalf("limit %d, want 1", ts.Limit)
	}
	e.c.SetControls(map[string]consumer.Control{"a": {Concurrency: 3}})
	consumertest.Eventually(t, "three calls of a in flight", func() bool { return inflight.Load() == 3 })
	if ts := tenantStats(t, e.c, "a"); ts.Limit != 3 {
		t.Fatalf("limit %d, want 3", ts.Limit)
	}
	close(gate)
	consumertest.Eventually(t, "all handled", func() bool { return tenantStats(t, e.c, "a").Handled == 4 })
	if peak.Load() != 3 {
		t.Fatalf("peak %d in flight, want 3", peak.Load())
	}
}

// A seed in the future opens a tenant's new guard: no attempt before it,
// then one probe, then the rest.
func TestBreakerSeedOpensNewTenantUntilItPasses(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	until := time.Now().Add(100 * time.Millisecond)
	e.c.SetBreakerSeeds(map[string]time.Time{"a": until, "old": time.Now().Add(-time.Hour)})
	for i := range 3 {
		produce(h, "a", 0, i)
		produce(h, "old", 0, i)
	}
	consumertest.Eventually(t, "all handled", func() bool {
		return len(log.handledOf("a")) == 3 && len(log.handledOf("old")) == 3
	})
	assertAllInOrder(t, log.handledOf("a"), "a", 0, 3)
	log.mu.Lock()
	at := append([]time.Time(nil), log.at["a"]...)
	log.mu.Unlock()
	if len(at) != 3 || at[0].Before(until) {
		t.Fatalf("a's calls at %v, want 3, none before the seed %v", at, until)
	}
}

// A Weight override changes a tenant's share of its partition's turns:
// with one worker and two backlogged tenants, the one of weight 3 makes
// three calls a turn to the other's one. (Each call takes 1ms on the
// guards' clock, over half of SlowTurn: a turn is then the weight alone.)
func TestWeightOverrideSetsTheShareOfTurns(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	p := fastPolicy()
	clk := &stepClock{}
	p.Clock = clk
	entered := make(chan struct{})
	gate := make(chan struct{})
	var mu sync.Mutex
	var order []string
	e := run(t, h, p, consumer.Config{
		Concurrency: 1,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header(consumertest.TenantHeader)
			if string(tn) == "gate" {
				close(entered)
				<-gate
				return nil
			}
			mu.Lock()
			order = append(order, string(tn))
			mu.Unlock()
			clk.advance(time.Millisecond) // over half of SlowTurn: a call a turn per unit of weight
			return nil
		}),
	})
	e.c.SetControls(map[string]consumer.Control{"a": {Weight: 3}})
	produce(h, "gate", 0, 0)
	<-entered // the one worker is held: a's and b's backlogs queue up
	for i := range 30 {
		produce(h, "a", 0, i)
	}
	for i := range 30 {
		produce(h, "b", 0, i)
	}
	consumertest.Eventually(t, "the backlogs delivered", func() bool { return e.src.Delivered() == 61 })
	close(gate)
	consumertest.Eventually(t, "all handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 60 })
	mu.Lock()
	first := append([]string(nil), order[:20]...)
	mu.Unlock()
	var a int
	for _, tn := range first {
		if tn == "a" {
			a++
		}
	}
	if a != 15 {
		t.Fatalf("a made %d of the first 20 calls, want 15 (3 a turn to b's 1): %v", a, first)
	}
}

// TripBreakers opens the existing guard of a tenant the engine has, closed,
// until its time: its next message waits, untried. A seed given to an
// existing guard does not (SetBreakerSeeds applies only to new ones), and
// a tenant the engine has not met is skipped.
func TestTripBreakersOpensExistingGuards(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	log := newCallLog()
	e := run(t, h, fastPolicy(), consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	produce(h, "a", 0, 0)
	consumertest.Eventually(t, "a handled", func() bool { return len(log.handledOf("a")) == 1 })
	until := time.Now().Add(time.Minute)
	e.c.SetBreakerSeeds(map[string]time.Time{"a": until})
	produce(h, "a", 0, 1)
	consumertest.Eventually(t, "a handled again past its seed", func() bool { return len(log.handledOf("a")) == 2 })
	if n := e.c.TripBreakers(map[string]time.Time{"a": until, "unknown": until}); n != 1 {
		t.Fatalf("TripBreakers opened %d breakers, want 1", n)
	}
	if n := e.c.TripBreakers(map[string]time.Time{"a": until}); n != 0 {
		t.Fatalf("TripBreakers again opened %d breakers, want 0", n)
	}
	produce(h, "a", 0, 2)
	consumertest.Eventually(t, "a's message parked behind its breaker", func() bool {
		ts := tenantStats(t, e.c, "a")
		return ts.State == policy.Open && ts.Parked == 1
	})
	if n := len(log.handledOf("a")); n != 2 {
		t.Fatalf("a handled %d times, want 2", n)
	}
	if _, ok := e.c.Tenant("unknown"); ok {
		t.Fatal("TripBreakers made a tenant")
	}
}

// A message judged for the DLQ while the DLQ is down keeps its verdict when
// its tenant is quarantined and its messages spill: once released, its
// re-fed copy goes to the DLQ as soon as the DLQ takes it, although the
// messages whose success convicted it were handled long before and nothing
// is left behind it to judge it by again.
func TestQuarantineKeepsAPendingDeadLetter(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	h.S.SetDown(true)
	log := newCallLog()
	var failedDLQ atomic.Int32
	var verdict atomic.Value // the reason of its refused dead letter
	e := run(t, h, fastPolicy(), consumer.Config{
		Spill: h.Sp, DLQRetry: time.Millisecond, DLQProbe: 2 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn := log.call(m)
			if strings.HasSuffix(string(m.Value), "poison") {
				return errors.New("cannot be processed")
			}
			log.handled(tn, m)
			return nil
		}),
		OnEvent: func(ev consumer.Event) {
			if ev.Kind == consumer.EventDLQFailed && ev.Tenant == "a" {
				verdict.Store(ev.Reason)
				failedDLQ.Add(1)
			}
		},
	})
	produceValues(h, "a", 0, "a/poison", "a/1", "a/2")
	consumertest.Eventually(t, "a's poison message judged, its dead letter refused", func() bool {
		return len(log.handledOf("a")) == 2 && failedDLQ.Load() > 0
	})
	e.c.SetControls(map[string]consumer.Control{"a": {Quarantine: true}})
	consumertest.Eventually(t, "a's poison message spilled", func() bool { return tenantStats(t, e.c, "a").Spilled == 1 })
	calls := log.callsOf("a")
	h.S.SetDown(false)
	e.c.SetControls(nil)
	consumertest.Eventually(t, "the poison message dead-lettered", func() bool { return len(h.S.Records("a", false)) == 1 })
	if n := log.callsOf("a") - calls; n != 0 {
		t.Fatalf("the re-fed poison message was called %d times: its verdict was lost in the spill log", n)
	}
	if r, want := h.S.Records("a", false)[0], verdict.Load().(dlq.Reason); string(r.Value) != "a/poison" || r.Reason != want {
		t.Fatalf("dead letter %q for %q, want a/poison for %q, the reason it was refused for", r.Value, r.Reason, want)
	}
}

// A spill record whose note does not decode (another writer's, or damaged)
// still re-feeds its message, judged afresh, with a warning.
func TestBadSpillNoteKeepsTheMessage(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	p := consumer.Partition{Topic: "orders", ID: 0}
	m := &consumer.Message{Value: []byte("a/spilled"), Topic: "orders", Partition: p, Offset: 0,
		Headers: []consumer.Header{{Key: consumertest.TenantHeader, Value: []byte("a")}}}
	m.SetSpillNote([]byte("not a note the engine wrote"))
	if err := h.Sp.Append(context.Background(), consumer.SpillLane{Tenant: "a", Partition: p}, []*consumer.Message{m}); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := newCallLog()
	run(t, h, fastPolicy(), consumer.Config{
		Spill:  h.Sp,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			log.handled(log.call(m), m)
			return nil
		}),
	})
	consumertest.Eventually(t, "the spilled message handled", func() bool { return len(log.handledOf("a")) == 1 })
	if got := log.handledOf("a")[0]; got != "a/spilled" {
		t.Fatalf("handled %q, want a/spilled", got)
	}
	if !strings.Contains(logs.String(), "note does not decode") {
		t.Fatalf("no warning about the bad note in %q", logs.String())
	}
}
