package consumer_test

import (
	"context"
	"errors"
	"fmt"
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

// eventLog keeps a test engine's events.
type eventLog struct {
	mu sync.Mutex
	ev []consumer.Event
}

func (l *eventLog) add(e consumer.Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

// of returns the events of kind for tenant.
func (l *eventLog) of(kind consumer.EventKind, tenant string) []consumer.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []consumer.Event
	for _, e := range l.ev {
		if e.Kind == kind && e.Tenant == tenant {
			out = append(out, e)
		}
	}
	return out
}

// burstHandler fails the messages whose value starts with "poison" with a
// permanent error and counts the others, by tenant (the key).
type burstHandler struct {
	mu      sync.Mutex
	handled map[string]int
}

func (h *burstHandler) Handle(_ context.Context, m *consumer.Message) error {
	if len(m.Value) >= 6 && string(m.Value[:6]) == "poison" {
		return policy.Permanent(errors.New("cannot parse"))
	}
	h.mu.Lock()
	h.handled[string(m.Key)]++
	h.mu.Unlock()
	return nil
}

func (h *burstHandler) of(tenant string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.handled[tenant]
}

// A burst of messages that fail with policy.Permanent is the messages'
// fault, not the dependency's: each is dead-lettered at its first attempt
// and the tenant's breaker stays shut, so its good messages behind the
// burst are handled as soon as they come up, with no park in between.
// Breaker.CountPermanent restores the other reading: the burst opens the
// breaker and parks the tenant (every message is still dead-lettered).
func TestPermanentBurstKeepsTheBreakerClosed(t *testing.T) {
	t.Parallel()
	for _, count := range []bool{false, true} {
		t.Run(fmt.Sprintf("CountPermanent=%v", count), func(t *testing.T) {
			t.Parallel()
			const poison, good = 40, 10
			b := consumertest.NewBroker("orders", 1)
			for i := range poison + good {
				v := "good"
				if i < poison {
					v = "poison"
				}
				b.Append(0, []byte("a"), []byte(fmt.Sprintf("%s-%02d", v, i)))
				b.Append(0, []byte("b"), []byte("good"))
			}
			p := policy.Policy{
				Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: 5 * time.Millisecond, MaxOpenTimeout: 5 * time.Millisecond, CountPermanent: count},
				Retry:   policy.Retry{MaxAttempts: 3},
			}
			var opened atomic.Int64
			var events eventLog
			sink := consumertest.NewSink()
			h := &burstHandler{handled: map[string]int{}}
			startWith(t, consumer.Config{
				Scope: scope.New(p, scope.Options[string]{OnEvent: func(_ string, e policy.Event) {
					if e.Kind == policy.EventBreakerOpened {
						opened.Add(1)
					}
				}}),
				DLQ:     sink,
				Handler: h,
				OnEvent: events.add,
			}, b.Source("g"))
			consumertest.Eventually(t, "the burst dead-lettered and the good messages handled", func() bool {
				return len(sink.Records("a", false)) == poison && h.of("a") == good && h.of("b") == poison+good
			})
			for _, r := range sink.Records("a", false) {
				if r.Reason != dlq.ReasonPermanent || r.Attempts != 1 || string(r.Value[:6]) != "poison" {
					t.Fatalf("dead letter %q: reason %s after %d attempts", r.Value, r.Reason, r.Attempts)
				}
			}
			parks := len(events.of(consumer.EventParked, "a"))
			if !count && (opened.Load() != 0 || parks != 0) {
				t.Fatalf("a burst of permanent failures opened the breaker %d times and parked its tenant %d times", opened.Load(), parks)
			}
			if count && (opened.Load() == 0 || parks == 0) {
				t.Fatalf("CountPermanent: the burst opened the breaker %d times, parked %d times; want both", opened.Load(), parks)
			}
		})
	}
}

// While a tenant's DLQ refuses its dead letters, the dead letter waits at
// the head of its lane and is written again after a wait that doubles from
// DLQRetry and never passes DLQProbe (a probe of the DLQ, not a per-message
// backoff that grows to minutes); Stats says the DLQ is why the tenant
// waits; other tenants flow. When the DLQ takes writes again, the dead
// letter is written and the messages behind it are handled.
func TestDLQOutageProbesTheDLQ(t *testing.T) {
	t.Parallel()
	const probe = 3 * time.Millisecond
	b := consumertest.NewBroker("orders", 1)
	b.Append(0, []byte("a"), []byte("poison"))
	for range 3 {
		b.Append(0, []byte("a"), []byte("good"))
		b.Append(0, []byte("b"), []byte("good"))
	}
	sink := consumertest.NewSink()
	sink.SetDown(true)
	var events eventLog
	h := &burstHandler{handled: map[string]int{}}
	c := startWith(t, consumer.Config{
		DLQ: sink, DLQRetry: time.Millisecond, DLQProbe: probe,
		Handler: h,
		OnEvent: events.add,
	}, b.Source("g"))
	consumertest.Eventually(t, "b handled while a's DLQ refuses writes", func() bool {
		ts, _ := c.Tenant("a")
		return h.of("b") == 3 && ts.DLQUnavailable && ts.DLQFailures >= 10
	})
	s := c.Stats()
	if s.DLQUnavailableTenants != 1 || s.DLQFailures < 10 || h.of("a") != 0 {
		t.Fatalf("while the DLQ is down: %d tenants with it unavailable, %d failed writes, %d of a handled; want 1, >= 10, 0",
			s.DLQUnavailableTenants, s.DLQFailures, h.of("a"))
	}
	for _, ts := range s.Tenants {
		if ts.Tenant == "a" && (!ts.DLQUnavailable || ts.Parked != 0 || ts.State != policy.Closed) {
			t.Fatalf("a: %+v; want its DLQ unavailable, nothing parked, its breaker closed", ts)
		}
		if ts.Tenant == "b" && ts.DLQUnavailable {
			t.Fatalf("b's DLQ reported unavailable: %+v", ts)
		}
	}
	fails := events.of(consumer.EventDLQFailed, "a")
	capped := 0
	for _, e := range fails {
		if e.Delay > probe {
			t.Fatalf("a dead letter waits %v before its next write, past DLQProbe %v", e.Delay, probe)
		}
		if e.Delay == probe {
			capped++
		}
	}
	if capped == 0 {
		t.Fatalf("none of %d failed writes waited DLQProbe: the doubling never reached it", len(fails))
	}

	sink.SetDown(false)
	consumertest.Eventually(t, "the dead letter written and a's messages behind it handled", func() bool {
		return len(sink.Records("a", false)) == 1 && h.of("a") == 3
	})
	if ts, _ := c.Tenant("a"); ts.DLQUnavailable || ts.DeadLettered != 1 {
		t.Fatalf("after the DLQ's return: %+v", ts)
	}
	if s := c.Stats(); s.DLQUnavailableTenants != 0 {
		t.Fatalf("%d tenants still with their DLQ unavailable", s.DLQUnavailableTenants)
	}
}

// A tenant stuck behind a dead letter its DLQ refuses spills after
// StuckAfter, and says why (dlq-unavailable), so that its partition's
// commit moves on; once the DLQ is back, its spill log drains: the poison
// is dead-lettered once and every good message handled.
func TestDLQOutageSpillsWithItsReason(t *testing.T) {
	t.Parallel()
	b := consumertest.NewBroker("orders", 1)
	b.Append(0, []byte("a"), []byte("poison-0"))
	for range 20 {
		b.Append(0, []byte("a"), []byte("good"))
		b.Append(0, []byte("b"), []byte("good"))
	}
	b.Append(0, []byte("a"), []byte("poison-1"))
	b.Append(0, []byte("a"), []byte("good"))
	sink := consumertest.NewSink()
	sink.SetDown(true)
	var events eventLog
	h := &burstHandler{handled: map[string]int{}}
	startWith(t, consumer.Config{
		DLQ: sink, DLQRetry: time.Millisecond, DLQProbe: 2 * time.Millisecond,
		Spill: consumertest.NewSpill(), StuckAfter: 20 * time.Millisecond,
		Handler: h,
		OnEvent: events.add,
	}, b.Source("g"))
	consumertest.Eventually(t, "a spilling for its DLQ", func() bool { return len(events.of(consumer.EventSpilling, "a")) > 0 })
	if e := events.of(consumer.EventSpilling, "a")[0]; e.Spill != consumer.SpillDLQUnavailable || e.Spill.String() != "dlq-unavailable" {
		t.Fatalf("a spilled for %v, want dlq-unavailable", e.Spill)
	}
	consumertest.Eventually(t, "b handled, and the partition's commit past a's messages", func() bool {
		return h.of("b") == 20 && b.Committed("g", 0) > 2
	})
	sink.SetDown(false)
	consumertest.Eventually(t, "a's spill log drained", func() bool {
		return len(sink.Records("a", false)) == 2 && h.of("a") == 21 && len(events.of(consumer.EventSpillDrained, "a")) > 0
	})
}
