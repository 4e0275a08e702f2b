package consumer_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// poolSource delivers n messages spread over partitions and tenants, in
// batches of batch per partition (as a Kafka fetch does), from a fixed pool
// of message structs that it reuses once the engine settled them: the
// benchmark measures the engine, not the garbage collector scanning a
// million prepared messages.
type poolSource struct {
	n, parts, batch int
	keys            [][]byte
	pool            []consumer.Message
	free            []atomic.Bool // pool slot i may be reused
	settled         atomic.Int64
	done            chan struct{}

	mu     sync.Mutex
	cond   *sync.Cond
	paused map[int32]bool
}

func newPoolSource(n, parts, tenants, batch int) *poolSource {
	s := &poolSource{n: n, parts: parts, batch: batch, done: make(chan struct{}), paused: map[int32]bool{}}
	s.cond = sync.NewCond(&s.mu)
	for i := range tenants {
		s.keys = append(s.keys, []byte(fmt.Sprintf("tenant-%04d", i)))
	}
	size := min(n, 1<<16)
	s.pool = make([]consumer.Message, size)
	s.free = make([]atomic.Bool, size)
	for i := range s.free {
		s.free[i].Store(true)
	}
	return s
}

func (s *poolSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	for p := range s.parts {
		d.Assigned(consumer.Partition{Topic: "t", ID: int32(p)})
	}
	offs := make([]int64, s.parts)
	batch := make([]*consumer.Message, 0, s.batch)
	for i := 0; i < s.n; {
		p := (i / s.batch) % s.parts
		s.mu.Lock()
		for s.paused[int32(p)] {
			s.cond.Wait()
		}
		s.mu.Unlock()
		batch = batch[:0]
		for ; i < s.n && len(batch) < s.batch; i++ {
			slot := i % len(s.pool)
			for !s.free[slot].Load() {
				runtime.Gosched() // the engine still holds this slot's message
			}
			s.free[slot].Store(false)
			m := &s.pool[slot]
			*m = consumer.Message{
				Key:       s.keys[i%len(s.keys)],
				Topic:     "t",
				Partition: consumer.Partition{Topic: "t", ID: int32(p)},
				Offset:    offs[p],
				Handle:    slot,
			}
			offs[p]++
			batch = append(batch, m)
		}
		d.DeliverBatch(batch)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *poolSource) Settle(ctx context.Context, m *consumer.Message) error {
	s.free[m.Handle.(int)].Store(true)
	if s.settled.Add(1) == int64(s.n) {
		close(s.done)
	}
	return nil
}

func (s *poolSource) Commit(context.Context, consumer.Partition, int64) error { return nil }

func (s *poolSource) Pause(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = true
	s.mu.Unlock()
}

func (s *poolSource) Resume(p consumer.Partition) {
	s.mu.Lock()
	s.paused[p.ID] = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// BenchmarkEngine measures the engine's overhead per message with a no-op
// handler: delivery in batches, lane scheduling, the tenant's guard
// (breaker, budget, latency estimate, bulkhead), settle and watermark
// commit. ns/op and allocs/op are per message.
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
			src := newPoolSource(b.N, bc.parts, bc.tenants, 256)
			p := policy.Default()
			p.AttemptTimeout = 0 // measure the engine, not the guard's attempt timer (reported separately)
			c, err := consumer.New(consumer.Config{
				Scope:       scope.New(p, scope.Options[string]{MaxKeys: 2 * bc.tenants}),
				Handler:     consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
				Tenant:      consumer.FromKey(),
				DLQ:         dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
				Concurrency: bc.concurrency,
				// The bulkhead is the workers here: one tenant may use them all.
				TenantConcurrency: bc.concurrency,
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { errc <- c.Run(ctx, src) }()
			select {
			case <-src.done:
			case <-time.After(10 * time.Minute):
				b.Fatal("not every message settled")
			}
			b.StopTimer()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		})
	}
}
