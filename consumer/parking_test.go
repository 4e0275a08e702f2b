package consumer_test

// Parking: a tenant whose breaker is open waits, in order, while the
// others flow.

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
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// The noisy neighbour: 20 tenants on 4 partitions; tenant t00 fails 100%
// with a transient error for a window, then recovers. The others finish
// while t00 is parked; afterwards every t00 message is handled, in order,
// nothing is dead-lettered, and every partition is committed to its end.
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
	// The others may finish before t00's first message used its attempts:
	// wait for the park rather than expect it by then.
	consumertest.Eventually(t, "t00 parked while down", func() bool { ts, _ := e.c.Tenant("t00"); return ts.Parked > 0 })
	if ts, ok := e.c.Tenant("t00"); !ok || rec.Count("t00") != 0 {
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

// A parked tenant past its bound (no spill log) pauses its own partition
// while the other partition keeps flowing; nothing is dropped.
func TestParkedBoundPausesOnlyThatPartition(t *testing.T) {
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

// With more active tenants than the scope keeps (MaxKeys 2), a failing
// tenant's guard stays between its failures: the engine pins the guards of
// the tenants it tracks, so the tenant trips its breaker and parks.
func TestFailingTenantTripsAmongManyTenants(t *testing.T) {
	const n = 4000 // every fourth message is t00's; the others each a new tenant
	src := newGenSource(n, func(i int) *consumer.Message {
		if i%4 == 0 {
			return tenantMsg("t00", "v")
		}
		return tenantMsg(fmt.Sprintf("u%05d", i), "v")
	})
	var parked atomic.Bool
	p := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 8, OpenTimeout: time.Hour},
		Retry:   policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
	}
	var good atomic.Int64
	startWith(t, consumer.Config{
		Scope:       scope.New(p, scope.Options[string]{MaxKeys: 2}),
		Concurrency: 8,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "t00" {
				return errors.New("t00's dependency is down")
			}
			good.Add(1)
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventParked && e.Tenant == "t00" {
				parked.Store(true)
			}
		},
	}, src)
	consumertest.Eventually(t, "the others handled", func() bool { return good.Load() == n*3/4 })
	consumertest.Eventually(t, "t00's breaker tripped and parked it", parked.Load)
}
