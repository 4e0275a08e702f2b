package nats_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/cputime"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/internal/stripecount"
)

var streamSeq atomic.Int64

// fixture is a stream on an in-process server, its subjects
// "<subject>.<token>".
type fixture struct {
	js      jetstream.JetStream
	stream  string
	subject string
}

func newFixture(t testing.TB, srv *natstest.Server) *fixture {
	t.Helper()
	_, js := srv.JetStream(t)
	n := streamSeq.Add(1)
	f := &fixture{js: js, stream: fmt.Sprintf("SRC%d", n), subject: fmt.Sprintf("src%d", n)}
	cfg := jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.subject + ".>"}, Storage: jetstream.FileStorage}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

// benchStream is one stream of messages for 16 tenants, shared by every
// sub-benchmark of BenchmarkConsume: each run reads the same data from the
// start through a durable consumer of its own.
type benchStream struct {
	f *fixture
	n int // messages in the stream
}

const benchTenants = 16

func (bs *benchStream) ensure(b *testing.B, n int) *fixture {
	b.Helper()
	if bs.n >= n {
		return bs.f
	}
	b.StopTimer()
	defer b.StartTimer()
	publishBench(b, bs.f, bs.n, n)
	bs.n = n
	return bs.f
}

// publishBench writes messages from to n-1 of the benchmark's layout
// (128-byte payloads, benchTenants tenants round robin by subject token).
func publishBench(t testing.TB, f *fixture, from, n int) {
	t.Helper()
	payload := make([]byte, 128)
	// Chunks of 1000 async publishes, each waited for: a loaded machine
	// would otherwise stall the async publisher.
	for i := from; i < n; {
		end := min(n, i+1000)
		futs := make([]jetstream.PubAckFuture, 0, end-i)
		for ; i < end; i++ {
			fut, err := f.js.PublishAsync(fmt.Sprintf("%s.t%02d", f.subject, i%benchTenants), payload)
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, fut)
		}
		for _, fut := range futs {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				t.Fatal(err)
			case <-time.After(60 * time.Second):
				t.Fatal("no PubAck")
			}
		}
	}
}

var benchConsumerSeq atomic.Int64

// freshConsumer makes a durable consumer that starts at the stream's first
// message.
func freshConsumer(b testing.TB, f *fixture) jetstream.Consumer {
	b.Helper()
	name := fmt.Sprintf("bench%d", benchConsumerSeq.Add(1))
	ctx := context.Background()
	c, err := f.js.CreateOrUpdateConsumer(ctx, f.stream, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1000,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.js.DeleteConsumer(context.Background(), f.stream, name) })
	return c
}

// countingSource counts settled messages per tenant (stripecount: one
// counter that the engine's workers on both cores increment would charge
// the engine a line bouncing between them, where the other rows settle on
// one goroutine); Done is closed once each tenant's share of the first
// want messages (written round robin by benchStream) was settled.
type countingSource struct {
	*nats.Source
	*stripecount.Counts
}

func newCountingSource(src *nats.Source, want int) *countingSource {
	shares := make([]int64, benchTenants)
	for i := range shares {
		shares[i] = int64(want / benchTenants)
		if i < want%benchTenants {
			shares[i]++
		}
	}
	return &countingSource{Source: src, Counts: stripecount.New(shares)}
}

func (c *countingSource) Settle(ctx context.Context, m *consumer.Message) error {
	err := c.Source.Settle(ctx, m)
	s := m.Topic // "<subject>.tNN"
	c.Add(int(s[len(s)-2]-'0')*10 + int(s[len(s)-1]-'0'))
	return err
}

// settleLoop is the thinnest possible engine: it settles each message as
// it is delivered.
type settleLoop struct{ src consumer.Source }

func (settleLoop) Assigned(consumer.Partition) {}
func (settleLoop) Revoked(consumer.Partition)  {}
func (l settleLoop) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		l.Deliver(m)
	}
}

func (l settleLoop) Deliver(m *consumer.Message) {
	_ = l.src.Settle(context.Background(), m)
}

func waitDone(b *testing.B, done <-chan struct{}) {
	b.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("benchmark did not finish")
	}
}

// BenchmarkConsume reads the same stream (128-byte messages, 16 tenants
// round robin) with a no-op handler: nats.go's own Consume with Ack, the
// Source driven by a loop that settles at once, and the Source under the
// ringfence engine. Besides ns/op (wall time), cpu-ns/op is the process's
// CPU time per message, in-process server included: on a shared machine it
// moves far less with other processes' load. The rows run in a random
// order; run it alone, a process per round (bench/run.sh does), from
// bench/:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'Consume$' -benchtime 50000x ./nats/; done
func BenchmarkConsume(b *testing.B) {
	// The server outlives the sub-benchmarks: it stops when this one ends.
	bs := benchStream{f: newFixture(b, natstest.Start(b))}
	tenant := nats.FromSubjectToken(-1)

	var rows []benchRow
	rows = append(rows, benchRow{"nats.go-Consume-Ack", func(b *testing.B) {
		f := bs.ensure(b, b.N)
		cons := freshConsumer(b, f)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cputime.Process()
		var n atomic.Int64
		done := make(chan struct{})
		want := int64(b.N)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			_ = m.Ack()
			if n.Add(1) == want {
				close(done)
			}
		}, jetstream.PullMaxMessages(500))
		if err != nil {
			b.Fatal(err)
		}
		waitDone(b, done)
		b.StopTimer()
		b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N), "cpu-ns/op")
		cc.Stop()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
	}})

	rows = append(rows, benchRow{"ringfence-Source-loop", func(b *testing.B) {
		f := bs.ensure(b, b.N)
		src, err := nats.NewSource(context.Background(), f.js, freshConsumer(b, f))
		if err != nil {
			b.Fatal(err)
		}
		cs := newCountingSource(src, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cputime.Process()
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- src.Run(ctx, settleLoop{src: cs}) }()
		waitDone(b, cs.Done())
		b.StopTimer()
		b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N), "cpu-ns/op")
		cancel()
		<-ran
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
	}})

	rows = append(rows, benchRow{"ringfence-Source-engine", func(b *testing.B) {
		f := bs.ensure(b, b.N)
		src, err := nats.NewSource(context.Background(), f.js, freshConsumer(b, f))
		if err != nil {
			b.Fatal(err)
		}
		// The stream's first b.N messages are sequences 1 to b.N.
		end := consumertest.NewEndCounter(map[int32]int64{src.Partition().ID: int64(b.N)})
		c, err := consumer.New(consumer.Config{
			Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
				end.Saw(m)
				return nil
			}),
			Tenant: tenant,
			DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cputime.Process()
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- c.Run(ctx, src) }()
		// The end is read with consumertest.EndCounter: counting per
		// tenant in Settle wrote lines the workers of both cores share on
		// every message, where the other rows count on their one consume
		// goroutine, and reading the engine's count every millisecond
		// was up to a millisecond late.
		consumertest.WaitEnd(b, c, end, uint64(b.N))
		b.StopTimer()
		b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N), "cpu-ns/op")
		cancel()
		<-ran
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
		b.ReportMetric(float64(c.Stats().Spilled), "spilled")
	}})
	// The rows run in a random order: no row always runs first after the
	// data was written, or last on a broker that has served the others.
	// For interleaved medians, run the benchmark in a loop of processes
	// (bench/run.sh).
	for _, i := range rand.Perm(len(rows)) {
		b.Run(rows[i].name, rows[i].run)
	}
}

// benchRow is one row of BenchmarkConsume.
type benchRow struct {
	name string
	run  func(b *testing.B)
}
