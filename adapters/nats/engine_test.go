package nats

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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

// TestEngineServerRestartLosesNothing restarts the server under the engine
// while tenant t0 is down and spilled: every message is handled at least
// once, t0's in order once it is back, nothing is dead-lettered, and the
// spill stream ends empty.
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
	spill, err := src.SpillLog(testCtx(t), WithSpillTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	seen := map[string]bool{}
	var t0 []string
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			tn, _ := tenant(m)
			if tn == "t0" && down.Load() {
				return errors.New("t0's dependency is down")
			}
			mu.Lock()
			seen[string(m.Value)] = true
			if tn == "t0" {
				t0 = append(t0, string(m.Value))
			}
			mu.Unlock()
			return nil
		}),
		Tenant:             tenant,
		DLQ:                q,
		Spill:              spill,
		MaxParkedPerTenant: 8,
		Scope:              scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		DLQRetry:           10 * time.Millisecond,
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
	eventually(t, "the others handled and t0 spilled", func() bool { return count() >= n*4/5 && c.Stats().Spilled > 0 })
	srv.Restart()
	f.publishRetry(t, f.subject+".t1", "after-restart")
	f.publishRetry(t, f.subject+".t0", "m-99999")
	down.Store(false)
	eventually(t, "everything handled", func() bool { return count() == n+2 })
	mu.Lock()
	checkInOrder(t, "t0", t0)
	mu.Unlock()
	eventually(t, "nothing left pending", func() bool {
		info, err := f.consumer(t).Info(testCtx(t))
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && f.spillBacklog(t) == 0
	})
	if s := c.Stats(); s.DeadLettered != 0 {
		t.Fatalf("a restart dead-lettered %d messages", s.DeadLettered)
	}
}

// TestEngineSpillsMaxPayloadHostileTenant: messages at the server's max
// payload, of a tenant whose key (in a header) looks like wildcards, a path
// and another tenant's token, are spilled while the tenant is down and
// re-fed byte for byte, in order; the other tenant is untouched; the spill
// stream and its body bucket end empty.
func TestEngineSpillsMaxPayloadHostileTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, 5*time.Second, 100)
	q, err := NewDLQ(testCtx(t), f.js, WithDLQStream("MPDLQ"), WithDLQPrefix("mpdlq"))
	if err != nil {
		t.Fatal(err)
	}
	const hostile, other = "acme.*.> ../x \xff", "acme"
	tenant := consumer.FromHeader("tenant")
	var want [][]byte
	for i := range 6 {
		for _, tn := range []string{hostile, other} {
			h := nats.Header{"tenant": {tn}, "seq": {strconv.Itoa(i)}}
			v := make([]byte, f.nc.MaxPayload()-msgSize(h, nil))
			_, _ = rand.Read(v)
			if tn == hostile {
				want = append(want, v)
			}
			if _, err := f.js.PublishMsg(testCtx(t), &nats.Msg{Subject: f.subject + ".x", Header: h, Data: v}); err != nil {
				t.Fatal(err)
			}
		}
	}
	src := f.source(t)
	spill, err := src.SpillLog(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	var got [][]byte
	var others atomic.Int64
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			tn, _ := tenant(m)
			if tn == other {
				others.Add(1)
				return nil
			}
			if down.Load() {
				return errors.New("down")
			}
			mu.Lock()
			got = append(got, bytes.Clone(m.Value))
			mu.Unlock()
			return nil
		}),
		Tenant:             tenant,
		DLQ:                q,
		Spill:              spill,
		MaxParkedPerTenant: 2,
		Scope:              scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
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
	eventually(t, "the other tenant handled and the hostile one spilled", func() bool {
		return others.Load() == 6 && spill.Stats().Appended >= 4
	})
	if st := spill.Stats(); st.OutOfLine < st.Appended {
		t.Fatalf("spill log %+v: messages at max payload must go out of line", st)
	}
	down.Store(false)
	eventually(t, "the hostile tenant handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= len(want) })
	mu.Lock()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("message %d of the hostile tenant: %d bytes handled, not the %d published (or out of order)", i, len(got[i]), len(want[i]))
		}
	}
	mu.Unlock()
	eventually(t, "spill stream drained", func() bool { return f.spillBacklog(t) == 0 })
	store, err := f.js.ObjectStore(testCtx(t), spill.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	seen := ""
	eventually(t, "bodies deleted", func() bool {
		left := listBodies(t, store, spill.Bucket())
		if now := fmt.Sprintf("%v; spill log %+v", left, spill.Stats()); len(left) > 0 && now != seen {
			seen = now
			t.Logf("bodies left: %s", now) // shown if the wait fails
		}
		return len(left) == 0
	})
}
