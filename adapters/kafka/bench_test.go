package kafka

import (
	"context"
	"fmt"
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

const (
	benchMsgs    = 100_000
	benchParts   = 4
	benchTenants = 20
)

// benchTopic fills one topic once; every row of BenchmarkConsume reads the
// same data with a fresh group.
func benchTopic(b *testing.B) (addrs []string, topic string) {
	b.Helper()
	c, err := kafkatest.Start(kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	topic = "bench"
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	ctx := context.Background()
	if err := createTopic(ctx, cl, topic, benchParts, -1); err != nil {
		b.Fatal(err)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(c.Addrs()...), Topic: topic, Balancer: &kafkago.RoundRobin{}, BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireAll}
	defer w.Close()
	value := make([]byte, 100)
	batch := make([]kafkago.Message, 0, 1000)
	for i := range benchMsgs {
		batch = append(batch, kafkago.Message{Key: []byte(fmt.Sprintf("tenant-%02d", i%benchTenants)), Value: value})
		if len(batch) == cap(batch) {
			if err := w.WriteMessages(ctx, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	return c.Addrs(), topic
}

// BenchmarkConsume reads the same 100,000 messages (4 partitions, 20
// tenants, 100-byte values) with a no-op handler: kafka-go's own group
// Reader (FetchMessage + CommitMessages, commits batched by
// CommitInterval), this package's Source driven by a minimal loop that
// commits every message, and the Source under the full engine. One op is
// the whole topic, group join and shutdown included; msgs/s is the figure
// to compare.
func BenchmarkConsume(b *testing.B) {
	addrs, topic := benchTopic(b)
	var groups atomic.Int64
	group := func() string { return fmt.Sprintf("bench-%d", groups.Add(1)) }
	// msgs/s counts from the first message to the last of each op, so the
	// group join and the shutdown (kafka-go's Close alone takes ~0.4s on
	// kfake) do not blur the comparison; ns/op includes them.
	var streaming time.Duration
	report := func(b *testing.B) {
		b.ReportMetric(float64(benchMsgs*b.N)/streaming.Seconds(), "msgs/s")
		b.ReportMetric(float64(streaming.Nanoseconds())/float64(benchMsgs*b.N), "ns/msg")
		streaming = 0
	}
	var first time.Time
	var firstOnce sync.Once
	mark := func() { firstOnce.Do(func() { first = time.Now() }) }
	lap := func() {
		streaming += time.Since(first)
		firstOnce = sync.Once{}
	}

	b.Run("kafka-go-reader", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			r := kafkago.NewReader(kafkago.ReaderConfig{
				Brokers:        addrs,
				GroupID:        group(),
				Topic:          topic,
				MinBytes:       1,
				MaxBytes:       1 << 20,
				MaxWait:        500 * time.Millisecond,
				CommitInterval: time.Second,
				StartOffset:    kafkago.FirstOffset,
			})
			ctx := context.Background()
			for range benchMsgs {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					b.Fatal(err)
				}
				mark()
				if err := r.CommitMessages(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			lap()
			if err := r.Close(); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})

	b.Run("ringfence-source", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			src, err := NewSource(addrs, topic, group())
			if err != nil {
				b.Fatal(err)
			}
			d := &loopDispatcher{src: src, done: make(chan struct{}), want: benchMsgs, mark: mark}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- src.Run(ctx, d) }()
			<-d.done
			lap()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})

	b.Run("ringfence-engine", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			src, err := NewSource(addrs, topic, group())
			if err != nil {
				b.Fatal(err)
			}
			var handled atomic.Int64
			done := make(chan struct{})
			c, err := consumer.New(consumer.Config{
				Tenant: consumer.FromKey(),
				DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
				Handler: consumer.HandlerFunc(func(context.Context, *consumer.Message) error {
					mark()
					if handled.Add(1) == benchMsgs {
						close(done)
					}
					return nil
				}),
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx, src) }()
			<-done
			lap()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
}

// loopDispatcher is the smallest possible engine: every delivered message
// is settled at once by committing past it.
type loopDispatcher struct {
	src  *Source
	want int64
	n    atomic.Int64
	once sync.Once
	done chan struct{}
	mark func()
}

func (d *loopDispatcher) Assigned(consumer.Partition) {}
func (d *loopDispatcher) Revoked(consumer.Partition)  {}
func (d *loopDispatcher) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		d.Deliver(m)
	}
}

func (d *loopDispatcher) Deliver(m *consumer.Message) {
	d.mark()
	_ = d.src.Commit(context.Background(), m.Partition, m.Offset+1)
	if d.n.Add(1) == d.want {
		d.once.Do(func() { close(d.done) })
	}
}
