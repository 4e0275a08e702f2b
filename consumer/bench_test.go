package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// sliceSource delivers a prepared slice of messages as fast as the engine
// takes them, honouring Pause, and signals when all are settled.
type sliceSource struct {
	msgs    []consumer.Message
	parts   int
	settled atomic.Int64
	done    chan struct{}
	mu      sync.Mutex
	cond    *sync.Cond
	paused  map[int32]bool
}

func (s *sliceSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	for p := range s.parts {
		d.Assigned(consumer.Partition{Topic: "t", ID: int32(p)})
	}
	for i := range s.msgs {
		m := &s.msgs[i]
		s.mu.Lock()
		for s.paused[m.Partition.ID] {
			s.cond.Wait()
		}
		s.mu.Unlock()
		d.Deliver(m)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *sliceSource) Settle(ctx context.Context, m *consumer.Message) error {
	if s.settled.Add(1) == int64(len(s.msgs)) {
		close(s.done)
	}
	return nil
}

func (s *sliceSource) Commit(context.Context, consumer.Partition, int64) error { return nil }

func (s *sliceSource) Pause(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = true
	s.mu.Unlock()
}

func (s *sliceSource) Resume(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// BenchmarkEngine measures the engine's overhead per message with a no-op
// handler: delivery, lane scheduling, the tenant's guard (breaker, budget,
// latency estimate), settle and watermark commit. ns/op and allocs/op are
// per message.
func BenchmarkEngine(b *testing.B) {
	for _, bc := range []struct {
		tenants, parts, concurrency int
	}{
		{1, 1, 1},
		{1, 4, 4},
		{100, 4, 8},
		{1000, 4, 64},
	} {
		b.Run(fmt.Sprintf("tenants=%d/partitions=%d/concurrency=%d", bc.tenants, bc.parts, bc.concurrency), func(b *testing.B) {
			keys := make([][]byte, bc.tenants)
			for i := range keys {
				keys[i] = []byte(fmt.Sprintf("tenant-%04d", i))
			}
			src := &sliceSource{msgs: make([]consumer.Message, b.N), parts: bc.parts, done: make(chan struct{}), paused: map[int32]bool{}}
			src.cond = sync.NewCond(&src.mu)
			offs := make([]int64, bc.parts)
			for i := range src.msgs {
				p := i % bc.parts
				src.msgs[i] = consumer.Message{Key: keys[i%bc.tenants], Topic: "t", Partition: consumer.Partition{Topic: "t", ID: int32(p)}, Offset: offs[p]}
				offs[p]++
			}
			c, err := consumer.New(consumer.Config{
				Scope:       scope.New(policy.Default(), scope.Options[string]{MaxKeys: 2 * bc.tenants}),
				Handler:     consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
				Tenant:      consumer.FromKey(),
				DLQ:         dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
				Concurrency: bc.concurrency,
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { errc <- c.Run(ctx, src) }()
			<-src.done
			b.StopTimer()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		})
	}
}

var _ = consumertest.FastPolicy
