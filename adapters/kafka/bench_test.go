package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
)

// The comparison with kafka-go's Reader and franz-go's kgo
// (BenchmarkConsume) is in the bench module, bench/kafka.

// BenchmarkSpill measures the SpillLog on in-process kfake (one broker, so
// acks=all costs no replication): Append of batches of 256 messages with
// 1 KiB values to one lane, and the re-feed of such a lane as the engine
// reads it (Read of a window from the last position, then Commit), for
// the engine's default window (64) and a whole batch (256). msgs/s is the
// figure to read.
func BenchmarkSpill(b *testing.B) {
	const batch, valueSize = 256, 1 << 10
	c, err := kafkatest.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	ctx := context.Background()
	source := "bench-spill"
	if err := createTopic(ctx, &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}, source, 1, -1); err != nil {
		b.Fatal(err)
	}
	p := consumer.Partition{Topic: source}
	value := make([]byte, valueSize)
	msgs := make([]*consumer.Message, batch)
	var next int64
	fill := func() {
		for i := range msgs {
			msgs[i] = &consumer.Message{
				Key: []byte("order-" + strconv.FormatInt(next, 10)), Value: value,
				Headers: []consumer.Header{{Key: "tenant", Value: []byte("acme")}},
				Topic:   source, Partition: p, Offset: next, Time: time.Now(),
			}
			next++
		}
	}
	var lanes atomic.Int64
	newLane := func(b *testing.B) (*SpillLog, consumer.SpillLane) {
		l, err := NewSpillLog(c.Addrs(), source, "bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close() })
		lane := consumer.SpillLane{Tenant: fmt.Sprintf("tenant-%d", lanes.Add(1)), Partition: p}
		fill()
		if err := l.Append(ctx, lane, msgs); err != nil { // creates the topic
			b.Fatal(err)
		}
		return l, lane
	}

	b.Run("append-256x1KiB", func(b *testing.B) {
		l, lane := newLane(b)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			fill()
			if err := l.Append(ctx, lane, msgs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "msgs/s")
	})

	for _, window := range []int{64, 256} {
		b.Run(fmt.Sprintf("refeed-window-%d", window), func(b *testing.B) {
			l, lane := newLane(b)
			total := batch
			for total < b.N {
				fill()
				if err := l.Append(ctx, lane, msgs); err != nil {
					b.Fatal(err)
				}
				total += batch
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			read, from := 0, int64(-1)
			for read < b.N {
				ms, err := l.Read(ctx, lane, from, min(window, b.N-read))
				if err != nil {
					b.Fatal(err)
				}
				if len(ms) == 0 {
					b.Fatalf("the log ended after %d of %d", read, b.N)
				}
				read += len(ms)
				from = ms[len(ms)-1].SpillPos + 1
				if err := l.Commit(ctx, lane, from); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(read)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkSpillEngine measures spilling and re-feeding through the engine
// with the real Source and SpillLog on kfake: one op spills 10,000 messages
// (1 KiB values) of a tenant whose dependency is down, then, once the
// dependency is back, has them re-fed and handled. spill-msgs/s counts from
// the first delivered message until all are spilled; refeed-msgs/s from
// the recovery until all are handled.
func BenchmarkSpillEngine(b *testing.B) {
	const n, valueSize = 10_000, 1 << 10
	c, err := kafkatest.Start(kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	ctx := context.Background()
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	var spillTime, refeedTime time.Duration
	var spillStats SpillStats
	b.ReportAllocs()
	for i := range b.N {
		topic := fmt.Sprintf("bench-spill-engine-%d", i)
		if err := createTopic(ctx, cl, topic, 1, -1); err != nil {
			b.Fatal(err)
		}
		w := &kafkago.Writer{Addr: kafkago.TCP(c.Addrs()...), Topic: topic, BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireAll}
		value := make([]byte, valueSize)
		batch := make([]kafkago.Message, 0, 1000)
		for j := range n {
			batch = append(batch, kafkago.Message{Key: []byte("down"), Value: value})
			if len(batch) == cap(batch) || j == n-1 {
				if err := w.WriteMessages(ctx, batch...); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
		}
		_ = w.Close()
		src, err := NewSource(c.Addrs(), topic, "g")
		if err != nil {
			b.Fatal(err)
		}
		log, err := NewSpillLog(c.Addrs(), topic, "g")
		if err != nil {
			b.Fatal(err)
		}
		var down atomic.Bool
		down.Store(true)
		var handled atomic.Int64
		var first time.Time
		var firstOnce sync.Once
		cons, err := consumer.New(consumer.Config{
			Tenant:             consumer.FromKey(),
			Spill:              log,
			MaxParkedPerTenant: 100,
			DLQ:                dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
			Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error {
				firstOnce.Do(func() { first = time.Now() })
				if down.Load() {
					return errStuck
				}
				handled.Add(1)
				return nil
			}),
		})
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- cons.Run(rctx, src) }()
		wait := func(what string, cond func() bool) {
			deadline := time.Now().Add(2 * time.Minute)
			for !cond() {
				if time.Now().After(deadline) {
					b.Fatalf("timed out waiting for %s: %+v", what, cons.Stats())
				}
				time.Sleep(time.Millisecond)
			}
		}
		wait("everything spilled", func() bool { s := cons.Stats(); return int(s.Spilled)+s.Parked >= n && s.Parked < 200 })
		spillTime += time.Since(first)
		recovered := time.Now()
		down.Store(false)
		wait("everything handled", func() bool { return handled.Load() >= n })
		refeedTime += time.Since(recovered)
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		st := log.Stats()
		spillStats.Produces += st.Produces
		spillStats.Commits += st.Commits
		spillStats.AheadHits += st.AheadHits
		_ = log.Close()
	}
	b.ReportMetric(float64(n*b.N)/spillTime.Seconds(), "spill-msgs/s")
	b.ReportMetric(float64(n*b.N)/refeedTime.Seconds(), "refeed-msgs/s")
	b.ReportMetric(float64(spillStats.Produces)/float64(b.N), "produces/op")
	b.ReportMetric(float64(spillStats.Commits)/float64(b.N), "cursor-commits/op")
}
