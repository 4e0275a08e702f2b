package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/fleet"
	"github.com/ringfence/ringfence/policy"
)

func newEngine(t *testing.T) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:  consumer.FromKey(), DLQ: consumertest.NewSink(), Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startAgent(t *testing.T, st fleet.Store, c *consumer.Consumer, process string) *fleet.Agent {
	t.Helper()
	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: st, Group: "g", Process: process,
		Interval: 50 * time.Millisecond, TTL: 5 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// Start applies the control table before it returns; a record that does
// not decode is skipped and counted, the others applied; a release is
// applied as no control.
func TestAgentAppliesControls(t *testing.T) {
	t.Parallel()
	for _, mk := range backends(t) {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			st, err := b.open(t, "ga", true)
			if err != nil {
				t.Fatal(err)
			}
			if err := fleet.WriteControl(ctx, st, fleet.ControlRecord{Tenant: "held", Control: fleet.Control{Hold: true}, By: "ops", Reason: "r"}); err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, fleet.KindControl, "bad", []byte(`{"v":1,"tenant":"bad","breaker":"sideways"}`)); err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, fleet.KindControl, "x", []byte(`{"v":1,"tenant":"not-x","hold":true}`)); err != nil {
				t.Fatal(err)
			}
			c := newEngine(t)
			a := startAgent(t, st, c, "p")
			if got := c.Controls(); len(got) != 1 || !got["held"].Hold {
				t.Fatalf("controls after Start: %+v", got)
			}
			if s := a.Stats(); s.Skipped != 2 || s.ControlsApplied != 1 {
				t.Fatalf("stats after Start: %+v", s)
			}
			if err := fleet.WriteControl(ctx, st, fleet.ControlRecord{Tenant: "held", By: "ops", Reason: "done"}); err != nil {
				t.Fatal(err)
			}
			if err := fleet.WriteControl(ctx, st, fleet.ControlRecord{Tenant: "q", Control: fleet.Control{Quarantine: true, Breaker: "open"}, By: "ops", Reason: "r"}); err != nil {
				t.Fatal(err)
			}
			consumertest.Eventually(t, "the release and the quarantine applied", func() bool {
				got := c.Controls()
				return len(got) == 1 && got["q"].Quarantine && got["q"].Breaker == consumer.BreakerForceOpen
			})
		})
	}
}

// An agent gives its engine the breakers other processes report open
// until a time to come, and not its own nor those of expired statuses,
// which it deletes.
func TestAgentSeedsBreakers(t *testing.T) {
	t.Parallel()
	b := natsBackend(t)
	ctx := testCtx(t)
	st, err := b.open(t, "gs", true)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, s := range []fleet.Status{
		{Process: "other", TTL: time.Minute, UpdatedAt: now, Tenants: []fleet.TenantStatus{
			{Tenant: "down", State: "open", RetryAt: now.Add(time.Minute)},
			{Tenant: "past", State: "open", RetryAt: now.Add(-time.Minute)},
			{Tenant: "parked", State: "closed", Parked: 3},
		}},
		{Process: "dead", TTL: time.Second, UpdatedAt: now.Add(-time.Hour), Tenants: []fleet.TenantStatus{
			{Tenant: "stale", State: "open", RetryAt: now.Add(time.Minute)},
		}},
	} {
		if err := fleet.PublishStatus(ctx, st, s); err != nil {
			t.Fatal(err)
		}
	}
	a := startAgent(t, st, newEngine(t), "me")
	consumertest.Eventually(t, "seeds from the other process", func() bool {
		s := a.Stats()
		return s.Processes == 1 && s.Seeds == 1 && s.Published > 0 && s.Swept == 1
	})
	// The dead process's status was deleted, not only ignored.
	raw, err := st.Watch(ctx, fleet.KindStatus)
	if err != nil {
		t.Fatal(err)
	}
	for u := range raw {
		if u.Loaded {
			break
		}
		if u.Key == fleet.Key("dead") && u.Value != nil {
			t.Fatal("the dead process's status is still there")
		}
	}
}

func TestAgentConfigChecked(t *testing.T) {
	t.Parallel()
	c := newEngine(t)
	for i, cfg := range []fleet.AgentConfig{
		{Store: nil, Consumer: c},
		{Consumer: c, Store: fakeStore{}, Interval: time.Second, TTL: time.Second},
		{Consumer: c, Store: fakeStore{}, MaxTenants: -1},
		{Consumer: c, Store: fakeStore{}, BreakerQuorum: 1},
		{Consumer: c, Store: fakeStore{}, BreakerQuorum: -2},
	} {
		if _, err := fleet.NewAgent(cfg); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
	// Start fails when the table cannot be read.
	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: fakeStore{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(testCtx(t)); err == nil {
		t.Fatal("Start with a failing store succeeded")
	}
}

type fakeStore struct{}

func (fakeStore) Put(context.Context, fleet.Kind, string, []byte) error { return errors.New("down") }
func (fakeStore) Delete(context.Context, fleet.Kind, string) error      { return errors.New("down") }
func (fakeStore) Watch(context.Context, fleet.Kind) (<-chan fleet.Update, error) {
	return nil, fmt.Errorf("down")
}
func (fakeStore) Close() error { return nil }

// A status lists only the tenants not healthy (here: controlled), at most
// MaxTenants of them, and counts the rest; healthy tenants are counted
// only.
func TestAgentStatusBounded(t *testing.T) {
	t.Parallel()
	const tenants, controlled, maxListed = 1000, 300, 256
	b := consumertest.NewBroker("orders", 2)
	for i := range tenants {
		b.Append(i%2, []byte(fmt.Sprintf("t%04d", i)), []byte("v"))
	}
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:  consumer.FromKey(), DLQ: consumertest.NewSink(), Logger: quiet(), MaxIdleTenants: 2 * tenants,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, b.Source("g")) }()
	defer func() { cancel(); <-done }()
	consumertest.Eventually(t, "every message handled", func() bool { return c.Totals().Handled == tenants })
	m := map[string]consumer.Control{}
	for i := range controlled {
		m[fmt.Sprintf("t%04d", i)] = consumer.Control{Weight: 2, By: "test"}
	}
	c.SetControls(m)
	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: fakeStore{}, Process: "p"})
	if err != nil {
		t.Fatal(err)
	}
	s := a.Status()
	if s.Counts.Tenants != tenants || s.Counts.Unhealthy != controlled || s.Counts.Omitted != controlled-maxListed || len(s.Tenants) != maxListed {
		t.Fatalf("counts %+v with %d tenants listed; want %d tracked, %d not healthy, %d listed", s.Counts, len(s.Tenants), tenants, controlled, maxListed)
	}
	if len(s.Partitions) != 2 || s.Tenants[0].Control == nil || s.Tenants[0].Control.Weight != 2 {
		t.Fatalf("partitions %v, first tenant %+v", s.Partitions, s.Tenants[0])
	}
	if _, err := fleet.EncodeStatus(s); err != nil {
		t.Fatal(err)
	}
}

// A tenant another process reports open until a time to come starts open
// in this process's engine: its first message here waits, untried.
func TestAgentSeedOpensNewGuard(t *testing.T) {
	t.Parallel()
	st, err := natsBackend(t).open(t, "gso", true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	now := time.Now()
	if err := fleet.PublishStatus(ctx, st, fleet.Status{Process: "other", TTL: time.Minute, UpdatedAt: now,
		Tenants: []fleet.TenantStatus{{Tenant: "down", State: "open", RetryAt: now.Add(time.Minute)}}}); err != nil {
		t.Fatal(err)
	}
	var tried atomic.Int64
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			if string(m.Key) == "down" {
				tried.Add(1)
			}
			return nil
		}),
		Tenant: consumer.FromKey(), DLQ: consumertest.NewSink(), Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, st, c, "me")
	// Start gave the engine the seeds before it returned.
	if s := a.Stats(); s.Seeds != 1 || s.Processes != 1 {
		t.Fatalf("stats after Start: %+v, want 1 seed of 1 process", s)
	}
	b := consumertest.NewBroker("orders", 1)
	b.Append(0, []byte("down"), []byte("1"))
	b.Append(0, []byte("up"), []byte("1"))
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(rctx, b.Source("g")) }()
	defer func() { cancel(); <-done }()
	consumertest.Eventually(t, "up handled and down waiting behind its seeded breaker", func() bool {
		ts, ok := c.Tenant("down")
		return c.Totals().Handled == 1 && ok && ts.State == policy.Open && ts.Parked == 1
	})
	if n := tried.Load(); n != 0 {
		t.Fatalf("the seeded tenant was tried %d times", n)
	}
}

// A process that leaves (deletes its status while live) keeps seeding its
// open breakers until their RetryAt: the next owner of its partitions
// starts their tenants open. One whose status expired does not.
func TestAgentKeepsALeaversSeeds(t *testing.T) {
	t.Parallel()
	st, err := natsBackend(t).open(t, "gl", true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	now := time.Now()
	for _, p := range []string{"leaver", "crashed"} {
		ttl := time.Minute
		if p == "crashed" {
			ttl = time.Second
		}
		if err := fleet.PublishStatus(ctx, st, fleet.Status{Process: p, TTL: ttl, UpdatedAt: now,
			Tenants: []fleet.TenantStatus{{Tenant: "down-" + p, State: "open", RetryAt: now.Add(time.Minute)}}}); err != nil {
			t.Fatal(err)
		}
	}
	a := startAgent(t, st, newEngine(t), "me")
	if s := a.Stats(); s.Seeds < 1 || s.Processes < 1 {
		t.Fatalf("stats after Start: %+v, want the leaver's seed", s)
	}
	if err := st.Delete(ctx, fleet.KindStatus, fleet.Key("leaver")); err != nil {
		t.Fatal(err)
	}
	consumertest.Eventually(t, "the leaver departed and the crashed process expired", func() bool {
		s := a.Stats()
		return s.Processes == 0 && s.Departed == 1 && s.Seeds == 1
	})
}

// With BreakerQuorum 2, one process reporting a tenant's breaker open
// leaves this engine's existing, closed guard alone (a seed applies only
// to a new guard); a second one trips it, until the later time both
// report it open until (the earlier of the two).
func TestAgentBreakerQuorum(t *testing.T) {
	t.Parallel()
	st, err := natsBackend(t).open(t, "gq", true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	var tried atomic.Int64
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error { tried.Add(1); return nil }),
		Tenant:  consumer.FromKey(), DLQ: consumertest.NewSink(), Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	b := consumertest.NewBroker("orders", 1)
	b.Append(0, []byte("shared"), []byte("1"))
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(rctx, b.Source("g")) }()
	defer func() { cancel(); <-done }()
	consumertest.Eventually(t, "the tenant handled", func() bool { return tried.Load() == 1 })

	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: st, Group: "g", Process: "me",
		Interval: 50 * time.Millisecond, TTL: 5 * time.Second, Logger: quiet(), BreakerQuorum: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	report := func(process string, until time.Time) {
		t.Helper()
		if err := fleet.PublishStatus(ctx, st, fleet.Status{Process: process, TTL: time.Minute, UpdatedAt: time.Now(),
			Tenants: []fleet.TenantStatus{{Tenant: "shared", State: "open", RetryAt: until}}}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	report("p1", now.Add(time.Hour))
	consumertest.Eventually(t, "one process's report seen", func() bool {
		s := a.Stats()
		return s.Processes == 1 && s.Seeds == 1
	})
	if s, ts := a.Stats(), tenantOf(t, c, "shared"); s.Quorum != 0 || s.QuorumTrips != 0 || ts.State != policy.Closed {
		t.Fatalf("one process alone: quorum %d, trips %d, breaker %v; want 0, 0, closed", s.Quorum, s.QuorumTrips, ts.State)
	}
	report("p2", now.Add(time.Minute))
	consumertest.Eventually(t, "the quorum's trip", func() bool {
		s := a.Stats()
		return s.Processes == 2 && s.Quorum == 1 && s.QuorumTrips == 1
	})
	g, ok := c.Scope().Peek("shared")
	if !ok || g.State() != policy.Open {
		t.Fatal("the tenant's breaker is not open")
	}
	if d := g.RetryAfter(); d > time.Minute {
		t.Fatalf("open for %v, want until the earlier report (within a minute)", d)
	}
	b.Append(0, []byte("shared"), []byte("2"))
	consumertest.Eventually(t, "the next message waiting behind the breaker", func() bool {
		return tenantOf(t, c, "shared").Parked == 1
	})
	if n := tried.Load(); n != 1 {
		t.Fatalf("the tenant was tried %d times, want 1", n)
	}
}

func tenantOf(t *testing.T, c *consumer.Consumer, key string) consumer.TenantStats {
	t.Helper()
	ts, ok := c.Tenant(key)
	if !ok {
		t.Fatalf("no tenant %q", key)
	}
	return ts
}
