package consumer_test

// Locks: no user callback and no source call runs under an engine lock.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// An OnEvent hook may call the consumer (Stats, Tenant: the obvious
// metrics hook): events are emitted with no engine lock held, so it does
// not deadlock.
func TestOnEventMayCallTheConsumer(t *testing.T) {
	const n = 3000
	var c *consumer.Consumer
	var events, resumed atomic.Int64
	var ready atomic.Bool
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%d", i%7), "v") })
	release := make(chan struct{})
	var handled atomic.Int64
	c = startWith(t, consumer.Config{
		Concurrency:           2,
		MaxQueuedPerPartition: 20, // pauses and resumes the partition over and over
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			<-release
			handled.Add(1)
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if !ready.Load() {
				return
			}
			_ = c.Stats()
			_, _ = c.Tenant(e.Tenant)
			events.Add(1)
			if e.Kind == consumer.EventResumedPartition {
				resumed.Add(1)
			}
		},
	}, src)
	ready.Store(true)
	close(release)
	if !within(20*time.Second, func() bool { return handled.Load() == n }) {
		t.Fatalf("not every message handled with a hook calling Stats: %d of %d; stats %+v; lanes %v", handled.Load(), n, c.Stats().Partitions, consumer.DumpLanes(c))
	}
	if resumed.Load() == 0 {
		t.Fatalf("the partition was never resumed (%d events): the test exercised nothing", events.Load())
	}
}

// Settle and Commit run under no engine lock: under the partition's lock
// (which delivery waits for) settles would be serial and Stats would stall
// behind a slow Settle. Settles of one partition must overlap, and Stats
// must answer while a Settle is blocked.
func TestSettleIsNotUnderALock(t *testing.T) {
	const tenants = 16
	var inSettle, most atomic.Int64
	block := make(chan struct{})
	src := newGenSource(tenants*4, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%02d", i%tenants), "v") })
	var settled atomic.Int64
	src.settle = func(m *consumer.Message) error {
		n := inSettle.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-block
		inSettle.Add(-1)
		settled.Add(1)
		return nil
	}
	c := startWith(t, consumer.Config{
		Concurrency: 8,
		Handler:     consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error { return nil }),
	}, src)
	consumertest.Eventually(t, "settles of one partition overlapping", func() bool { return most.Load() >= 4 })
	stats := make(chan consumer.Stats, 1)
	go func() { stats <- c.Stats() }()
	select {
	case s := <-stats:
		if s.Handled == 0 {
			t.Fatalf("stats %+v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stats did not return while Settle calls were blocked")
	}
	close(block)
	consumertest.Eventually(t, "every message settled", func() bool { return settled.Load() == tenants*4 })
}
