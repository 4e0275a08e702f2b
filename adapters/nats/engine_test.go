package nats

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
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/scope"
)

// TestEngineParkedTenantIsolation runs the real engine on the Source with
// the spill log: a tenant whose dependency is down, with a backlog 10x
// MaxAckPending, parks in the engine and spills to the spill stream, and
// the other tenants are all handled meanwhile, with the engine's bound on
// the partition below MaxAckPending (PartitionCapacity). When the
// dependency is back, every parked message reaches the handler in order
// (or, by the engine's poison rule, the DLQ), and the spill stream ends
// empty.
func TestEngineParkedTenantIsolation(t *testing.T) {
	t.Parallel()
	const (
		maxAckPending = 32
		parkedBound   = 4
		backlog       = 10 * maxAckPending
		others        = 3 * maxAckPending
	)
	f := newFixture(t, nil, 5*time.Second, maxAckPending)
	q, err := NewDLQ(testCtx(t), f.js, WithDLQStream("ISODLQ"), WithDLQPrefix("isodlq"))
	if err != nil {
		t.Fatal(err)
	}
	noisy, calm := vals("noisy", 0, backlog), vals("calm", 0, others)
	for i := range backlog {
		f.publish(t, "noisy", noisy[i])
		if i < others {
			f.publish(t, "calm", calm[i])
		}
	}
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	spill, err := src.SpillLog(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	seen := map[string]bool{}
	var order []string
	var calmDone, paused atomic.Int64
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			tn, _ := tenant(m)
			if tn == "noisy" && down.Load() {
				return errors.New("dependency down")
			}
			mu.Lock()
			if !seen[string(m.Value)] && tn == "calm" {
				calmDone.Add(1)
			}
			if tn == "noisy" {
				order = append(order, string(m.Value))
			}
			seen[string(m.Value)] = true
			mu.Unlock()
			return nil
		}),
		Tenant:             tenant,
		DLQ:                q,
		Spill:              spill,
		Group:              f.durable,
		MaxParkedPerTenant: parkedBound,
		Scope:              scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		OnEvent: func(e consumer.Event) {
			// The engine's bound is MaxAckPending-1, the window the server
			// gives the consumer: a queue-full pause only mirrors the
			// server's own flow control while an append is in flight.
			// Any other pause would stop the partition on one tenant's
			// account.
			if e.Kind == consumer.EventPaused && e.Pause != consumer.PauseQueueFull {
				paused.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	eventually(t, "calm handled while noisy is down", func() bool { return calmDone.Load() == others })
	eventually(t, "noisy spilled", func() bool { return c.Stats().Spilled >= backlog-maxAckPending })
	if st := src.Stats(); st.Held >= maxAckPending {
		t.Fatalf("the engine holds %d messages, MaxAckPending is %d", st.Held, maxAckPending)
	}
	if n := paused.Load(); n != 0 {
		t.Fatalf("the partition was paused %d times for a tenant's bound: a spilling tenant must not stop the others", n)
	}
	t.Logf("engine isolation: noisy backlog %d > MaxAckPending %d; calm %d/%d handled; engine spilled %d; source %+v; spill log %+v",
		backlog, maxAckPending, calmDone.Load(), others, c.Stats().Spilled, src.Stats(), spill.Stats())

	down.Store(false)
	eventually(t, "every noisy message handled or dead-lettered", func() bool {
		dead, err := q.Peek(testCtx(t), "noisy", 0)
		if err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, r := range dead {
			seen[string(r.Value)] = true
		}
		for _, v := range noisy {
			if !seen[v] {
				return false
			}
		}
		return true
	})
	mu.Lock()
	checkInOrder(t, "noisy", order)
	mu.Unlock()
	eventually(t, "spill stream drained", func() bool { return f.spillBacklog(t) == 0 })
}

// TestEngineServerRestartLosesNothing restarts the server under the engine:
// every message is handled at least once and nothing is dead-lettered.
func TestEngineServerRestartLosesNothing(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	f := newFixture(t, srv, time.Second, 64)
	q, err := NewDLQ(testCtx(t), f.js, WithDLQStream("RSDLQ"), WithDLQPrefix("rsdlq"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		f.publish(t, fmt.Sprintf("t%d", i%5), fmt.Sprintf("m-%05d", i))
	}
	tenant := FromSubjectToken(-1)
	src := f.source(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			seen[string(m.Value)] = true
			mu.Unlock()
			return nil
		}),
		Tenant:   tenant,
		DLQ:      q,
		Scope:    scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		DLQRetry: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
	eventually(t, "a part handled", func() bool { return count() >= 20 })
	srv.Restart()
	f.publishRetry(t, f.subject+".t1", "after-restart")
	eventually(t, "everything handled", func() bool { return count() == n+1 })
	eventually(t, "nothing left pending", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if s := c.Stats(); s.DeadLettered != 0 {
		t.Fatalf("a restart dead-lettered %d messages", s.DeadLettered)
	}
}
