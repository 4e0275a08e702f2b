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
	consumertest.Eventually(t, "the seed given to the engine", func() bool { return a.Stats().Seeds == 1 })
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
