package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// tracked reports whether the engine keeps state for tenant.
func tracked(c *consumer.Consumer, tenant string) bool {
	_, ok := c.Tenant(tenant)
	return ok
}

// checkInvariants fails t if the engine's invariant checker finds a
// problem.
func checkInvariants(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	if err := consumer.CheckInvariants(c); err != nil {
		t.Fatal(err)
	}
}

// produceMany produces one message for each of n tenants named
// prefix-0 ... over the harness's partitions.
func produceMany(h *consumertest.MemHarness, prefix string, n int) {
	for i := range n {
		produce(h, fmt.Sprintf("%s-%d", prefix, i), i%h.Partitions(), 0)
	}
}

// recordAll is a handler that records every message.
func recordAll(rec *consumertest.Recorder) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		tn, _ := m.Header(consumertest.TenantHeader)
		rec.Add(string(tn), string(m.Value))
		return nil
	})
}

// TestForgottenTenantStartsFresh: past MaxIdleTenants the tenant idle
// longest is forgotten; when its key comes back it gets fresh engine state
// (its handled count starts over) and the same guard, which the scope
// kept.
func TestForgottenTenantStartsFresh(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	rec := consumertest.NewRecorder()
	// seen is a's state in the engine as each of its calls began: the
	// engine's own view, read while a is surely tracked (its call in
	// flight), whatever its lanes and idle neighbours do after the call.
	var seen []consumer.TenantStats
	var e *engine
	e = run(t, h, fastPolicy(), consumer.Config{MaxIdleTenants: 2, Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if tn, _ := m.Header(consumertest.TenantHeader); string(tn) == "a" {
			ts, ok := e.c.Tenant("a")
			if !ok {
				t.Error("a not tracked during its own call")
			}
			seen = append(seen, ts)
		}
		return recordAll(rec).Handle(ctx, m)
	})})
	produce(h, "a", 0, 0)
	consumertest.Eventually(t, "a handled", func() bool { return rec.Count("a") == 1 })
	g, ok := e.c.Scope().Peek("a")
	if !ok {
		t.Fatal("a's guard is not in the scope")
	}
	// The other tenants hold guards, so that each is listed once idle and
	// pushes out the one idle longest: under the pressure of keys seen
	// once, a tenant that runs without a guard is forgotten at once
	// instead (see TestGuardlessTenantIsForgottenAtOnceUnderPressure).
	for i := range 20 {
		e.c.Scope().For(fmt.Sprintf("other-%d", i))
	}
	produceMany(h, "other", 20)
	consumertest.Eventually(t, "the other tenants handled", func() bool { return rec.Distinct() == 21 })
	consumertest.Eventually(t, "a forgotten", func() bool { return !tracked(e.c, "a") })
	// Lanes just handled are swept by the next lanes made or by
	// housekeeping's next ticks, so the bound holds once they have run.
	var s consumer.TrackedStats
	consumertest.Eventually(t, "at most 2 idle tenants and 2 lanes tracked", func() bool {
		s = e.c.Stats().Tracked
		return s.Idle <= 2 && s.Lanes <= 2 && s.Forgotten > 0 && s.MaxIdle == 2
	})
	checkInvariants(t, e.c)

	produce(h, "a", 0, 1)
	consumertest.Eventually(t, "a handled again", func() bool { return rec.Count("a") == 2 })
	// Its first state had handled one message when it was forgotten; the
	// state its second call began with is a fresh one.
	if len(seen) != 2 || seen[0].Handled != 0 || seen[1].Handled != 0 {
		t.Fatalf("a's handled count as each call began: %+v; want 0 both times (fresh state when it came back)", seen)
	}
	if g2, _ := e.c.Scope().Peek("a"); g2 != g {
		t.Fatal("a came back to another guard: the scope kept the old one")
	}
	checkInvariants(t, e.c)
}

// TestKeysSeenOnceKeepFewTenants: a stream of tenants each seen once, over
// several partitions, leaves the engine tracking at most about twice
// MaxIdleTenants tenants (the idle ones, and as many holding only lanes
// kept idle), not each partition's lane bound's worth on top: a lane made
// for one message is dropped as soon as it is handled once the engine is
// over that, so the tenants the engine keeps (and pins in its scope) do
// not grow with its partitions.
func TestKeysSeenOnceKeepFewTenants(t *testing.T) {
	t.Parallel()
	const maxIdle = 16
	h := consumertest.NewMemHarness(4)
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{MaxIdleTenants: maxIdle, Handler: recordAll(rec)})
	produceMany(h, "once", 2000)
	consumertest.Eventually(t, "every tenant handled", func() bool { return rec.Distinct() == 2000 })
	var s consumer.Stats
	consumertest.Eventually(t, "nothing in the engine", func() bool {
		s = e.c.Stats()
		return s.InFlight == 0 && s.Queued == 0
	})
	if s.Tracked.MaxLanes*h.Partitions() <= 2*maxIdle {
		t.Fatalf("lane bound %d a partition: the partitions' lanes would not exceed the bound this test checks", s.Tracked.MaxLanes)
	}
	if s.Tracked.Tenants > 2*maxIdle+1 {
		t.Fatalf("%d tenants tracked (%d idle, %d lanes), want at most %d", s.Tracked.Tenants, s.Tracked.Idle, s.Tracked.Lanes, 2*maxIdle+1)
	}
	if got := e.c.Scope().Stats().Pinned; got > 2*maxIdle+1 {
		t.Fatalf("%d keys pinned in the scope, want at most %d", got, 2*maxIdle+1)
	}
	checkInvariants(t, e.c)
}

// TestTenantWithMessagesIsNeverForgotten: with MaxIdleTenants 1, a stream
// of one-message tenants forgets nearly all of them, but never one that
// holds messages: parked behind its open breaker, spilling (parked past
// MaxParkedPerTenant), with a call that hangs, or with a dead letter the
// DLQ can never write (set aside, unsettled). Once they recover, all their
// messages are handled and nothing else is dead-lettered.
func TestTenantWithMessagesIsNeverForgotten(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	release := make(chan struct{})
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{
		MaxIdleTenants:     1,
		MaxParkedPerTenant: 4,
		Spill:              h.Sp,
		DLQ: dlq.SinkFunc(func(ctx context.Context, r *dlq.Record) error {
			if r.Tenant == "aside" {
				return fmt.Errorf("record over the topic's limit: %w", dlq.ErrUnwritable)
			}
			return h.S.Write(ctx, r)
		}),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header(consumertest.TenantHeader)
			switch string(tn) {
			case "parked", "spilling":
				if down.Load() {
					return errors.New("dependency down")
				}
			case "hung":
				<-release
			case "aside":
				return policy.Permanent(errors.New("cannot parse"))
			}
			rec.Add(string(tn), string(m.Value))
			return nil
		}),
	})
	defer close(release)
	for i := range 2 {
		produce(h, "parked", 0, i)
	}
	for i := range 10 {
		produce(h, "spilling", 0, i)
	}
	produce(h, "hung", 1, 0)
	produce(h, "aside", 1, 0)
	held := func() (parked, spilling, hung, aside consumer.TenantStats) {
		parked, _ = e.c.Tenant("parked")
		spilling, _ = e.c.Tenant("spilling")
		hung, _ = e.c.Tenant("hung")
		aside, _ = e.c.Tenant("aside")
		return
	}
	consumertest.Eventually(t, "a tenant parked, one spilling, one in a call, one set aside", func() bool {
		p, s, hu, a := held()
		return p.Parked > 0 && s.Spilling > 0 && hu.InFlight == 1 && a.Unwritable == 1
	})

	const n = 400
	produceMany(h, "one", n)
	consumertest.Eventually(t, "the stream handled", func() bool { return rec.Distinct() == n })
	consumertest.Eventually(t, "the stream's tenants forgotten", func() bool {
		return e.c.Stats().Tracked.Forgotten >= n-4
	})
	checkInvariants(t, e.c)
	for _, tn := range []string{"parked", "spilling", "hung", "aside"} {
		if !tracked(e.c, tn) {
			t.Fatalf("%s was forgotten while it held messages", tn)
		}
	}
	if p, s, hu, a := held(); p.Parked == 0 || s.Spilling == 0 || hu.InFlight != 1 || a.Queued != 1 {
		t.Fatalf("after the stream: parked %d, spilling lanes %d, hung in flight %d, aside queued %d", p.Parked, s.Spilling, hu.InFlight, a.Queued)
	}

	down.Store(false)
	release <- struct{}{}
	consumertest.Eventually(t, "every held message handled", func() bool {
		return rec.Count("parked") == 2 && rec.Count("spilling") == 10 && rec.Count("hung") == 1
	})
	assertPartitionOrder(t, rec.Order("spilling"))
	if n := h.S.Total(); n != 0 {
		t.Fatalf("dead-lettered %d", n)
	}
	checkInvariants(t, e.c)
}

// TestRevokedJobKeepsItsTenant: a tenant whose partition is revoked while
// its call hangs keeps its state until that call ends, even once it has no
// lane left (its redelivered message handled, its new lane swept); then it
// is idle like any other and may be forgotten.
func TestRevokedJobKeepsItsTenant(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	release := make(chan struct{})
	var calls atomic.Int32
	rec := consumertest.NewRecorder()
	e := run(t, h, fastPolicy(), consumer.Config{
		MaxIdleTenants: 1,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := m.Header(consumertest.TenantHeader)
			if string(tn) == "hung" && calls.Add(1) == 1 {
				<-release
			}
			rec.Add(string(tn), string(m.Value))
			return nil
		}),
	})
	defer close(release)
	produce(h, "hung", 0, 0)
	consumertest.Eventually(t, "hung in its call", func() bool { ts, _ := e.c.Tenant("hung"); return ts.InFlight == 1 })
	e.src.Rebalance()
	consumertest.Eventually(t, "hung's message handled again after the rebalance", func() bool { return rec.Count("hung") == 1 })
	produceMany(h, "one", 50)
	consumertest.Eventually(t, "the stream handled", func() bool { return rec.Distinct() == 51 })
	consumertest.Eventually(t, "hung's new lane swept", func() bool { return e.c.Stats().Partitions[0].Lanes <= 1 })
	checkInvariants(t, e.c)
	if ts, ok := e.c.Tenant("hung"); !ok || ts.InFlight != 1 {
		t.Fatalf("hung while its revoked call hangs: tracked %v, in flight %d", ok, ts.InFlight)
	}

	release <- struct{}{}
	// Idle once its call ended, and then forgotten like any other: pushed
	// out by newer idle tenants that hold guards, if a tenant of the
	// stream that ran with one has not pushed it out already.
	consumertest.Eventually(t, "hung's call ended", func() bool {
		ts, ok := e.c.Tenant("hung")
		return !ok || ts.InFlight == 0
	})
	for i := range 10 {
		e.c.Scope().For(fmt.Sprintf("more-%d", i))
	}
	produceMany(h, "more", 10)
	consumertest.Eventually(t, "hung forgotten once its call ended", func() bool { return !tracked(e.c, "hung") })
	checkInvariants(t, e.c)
}
