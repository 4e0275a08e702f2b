package console_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/console"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// sliceSource delivers a prepared slice of messages as fast as the engine
// takes them (as consumer's BenchmarkEngine does), honouring Pause.
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

func (s *sliceSource) Settle(context.Context, *consumer.Message) error {
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

// BenchmarkEngine is consumer's BenchmarkEngine (per message: delivery,
// lanes, the tenant's guard, settle, commit; a no-op handler) run three
// ways: bare; with a console mounted on a live HTTP server and chained
// into OnEvent, nobody looking ("idle"); and with one browser-like viewer
// streaming /live at a 100ms Refresh ("watched"). ns/op is per message.
func BenchmarkEngine(b *testing.B) {
	for _, bc := range []struct{ tenants, parts, concurrency int }{
		{1, 1, 1},
		{100, 4, 8},
		{1000, 4, 64},
	} {
		for _, mode := range []string{"bare", "idle", "watched"} {
			name := fmt.Sprintf("tenants=%d/partitions=%d/concurrency=%d/console=%s", bc.tenants, bc.parts, bc.concurrency, mode)
			b.Run(name, func(b *testing.B) { benchEngine(b, bc.tenants, bc.parts, bc.concurrency, mode) })
		}
	}
}

func benchEngine(b *testing.B, tenants, parts, concurrency int, mode string) {
	keys := make([][]byte, tenants)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "tenant-%04d", i)
	}
	src := &sliceSource{msgs: make([]consumer.Message, b.N), parts: parts, done: make(chan struct{}), paused: map[int32]bool{}}
	src.cond = sync.NewCond(&src.mu)
	offs := make([]int64, parts)
	for i := range src.msgs {
		p := i % parts
		src.msgs[i] = consumer.Message{Key: keys[i%tenants], Topic: "t", Partition: consumer.Partition{Topic: "t", ID: int32(p)}, Offset: offs[p]}
		offs[p]++
	}
	cfg := consumer.Config{
		Scope:       scope.New(policy.Default(), scope.Options[string]{MaxKeys: 2 * tenants}),
		Handler:     consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:      consumer.FromKey(),
		DLQ:         dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
		Concurrency: concurrency,
	}
	var con *console.Console
	if mode != "bare" {
		var err error
		if con, err = console.New(console.Options{Refresh: 100 * time.Millisecond}); err != nil {
			b.Fatal(err)
		}
		cfg.OnEvent = con.OnEvent
	}
	c, err := consumer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var viewers sync.WaitGroup
	if con != nil {
		con.SetEngine(c, "bench")
		srv := httptest.NewServer(con)
		defer srv.Close()
		defer con.Close()
		if mode == "watched" {
			var stats atomic.Int64
			viewers.Add(1)
			go func() {
				defer viewers.Done()
				sseReader(ctx, srv.URL+"/live", &stats, nil)
			}()
			for stats.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}
	errc := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { errc <- c.Run(ctx, src) }()
	<-src.done
	b.StopTimer()
	cancel()
	viewers.Wait()
	if err := <-errc; err != nil && err != context.Canceled {
		b.Fatal(err)
	}
}
