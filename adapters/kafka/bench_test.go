package kafka

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/cputime"
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
// commits every message, the Source with each delivered slice handed whole
// to one goroutine that commits past its messages (handoff-floor: what
// running handlers off the fetch goroutine costs at the least), the Source
// under the full engine, and franz-go's kgo client in a group (a
// PollFetches loop, committed by kgo's default autocommit: every 5s, only
// what earlier polls returned, so a record is committed only once the loop
// has handled it and polled again). One op is
// the whole topic, group join and shutdown included; msgs/s is the figure
// to compare. The rows run in a random order in one invocation, each row's
// -count repetitions back to back; for medians and the ratios of issue 18,
// interleave the rows with a process per round:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'Consume$' -benchtime 1x -count 3 ./adapters/kafka/; done
func BenchmarkConsume(b *testing.B) {
	addrs, topic := benchTopic(b)
	var groups atomic.Int64
	group := func() string { return fmt.Sprintf("bench-%d", groups.Add(1)) }
	// msgs/s counts from the first message to the last of each op, so the
	// group join and the shutdown (kafka-go's Close alone takes ~0.4s on
	// kfake) do not blur the comparison; ns/op includes them. It flatters a
	// client whose first delivery is large: kgo's first poll hands over
	// about a third of the topic already fetched and decoded, which that
	// window never sees. incl-join-msgs/s counts from the client's creation
	// to the last message instead (group join and first fetch included,
	// shutdown not): read both. cpu-ns/msg is the process's CPU time over
	// that same span, the in-process broker included: what a row costs
	// the machine, which load from other processes distorts far less.
	// faults/op is the process's page faults over the same span: on this
	// project's VM a fault costs ~11 us (the CPU a message of either
	// Source row rises by ~0.11 ns for each fault an op of 100k messages
	// takes), and an op takes from a few to a few thousand, as often as
	// the runtime's scavenger returned the pages the fetch path allocates
	// from; it explains more of an op's CPU than anything else that varies.
	// gc-ns/msg is the part of cpu-ns/msg the collector took (the runtime's
	// estimate, idle-time marking included) and gcs/op the cycles it
	// completed: a row that keeps more heap live, or allocates more, pays
	// for it there (the engine row kept ~150 vs the source's ~90-110).
	var streaming, sinceStart time.Duration
	var cpu, cpu0 time.Duration     // process CPU time, creation to last message
	var faults, faults0 int64       // the process's page faults, the same span
	var gcCPU, gcCPU0 time.Duration // the collector's CPU (cputime.GC), the same span
	var gcs, gcs0 uint64            // GC cycles completed, the same span
	report := func(b *testing.B) {
		b.ReportMetric(float64(benchMsgs*b.N)/streaming.Seconds(), "msgs/s")
		b.ReportMetric(float64(streaming.Nanoseconds())/float64(benchMsgs*b.N), "ns/msg")
		b.ReportMetric(float64(benchMsgs*b.N)/sinceStart.Seconds(), "incl-join-msgs/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(benchMsgs*b.N), "cpu-ns/msg")
		b.ReportMetric(float64(faults)/float64(b.N), "faults/op")
		b.ReportMetric(float64(gcCPU.Nanoseconds())/float64(benchMsgs*b.N), "gc-ns/msg")
		b.ReportMetric(float64(gcs)/float64(b.N), "gcs/op")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
		streaming, sinceStart, cpu, faults, gcCPU, gcs = 0, 0, 0, 0, 0, 0
	}
	var started, first time.Time
	var firstOnce sync.Once
	begin := func() {
		started, cpu0, faults0 = time.Now(), cputime.Process(), cputime.Faults()
		gcCPU0, gcs0 = cputime.GC()
	}
	mark := func() { firstOnce.Do(func() { first = time.Now() }) }
	lap := func() {
		cpu += cputime.Process() - cpu0
		faults += cputime.Faults() - faults0
		g, n := cputime.GC()
		gcCPU += g - gcCPU0
		gcs += n - gcs0
		streaming += time.Since(first)
		sinceStart += time.Since(started)
		firstOnce = sync.Once{}
	}

	// runTo runs src into d until done, times the op (lap) and stops src.
	runTo := func(b *testing.B, src *Source, d consumer.Dispatcher, done <-chan struct{}) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- src.Run(ctx, d) }()
		<-done
		lap()
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}

	lastOffsets := map[int32]int64{} // filled by the warm-up reads below
	var rows []benchRow
	rows = append(rows, benchRow{"kafka-go-reader", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			begin()
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
	}})

	// sourceRow is a row that reads the topic with this package's Source
	// once per op: op runs it to the end.
	sourceRow := func(name string, op func(b *testing.B, src *Source)) benchRow {
		return benchRow{name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				begin()
				src, err := NewSource(addrs, topic, group())
				if err != nil {
					b.Fatal(err)
				}
				op(b, src)
			}
			report(b)
		}}
	}

	rows = append(rows, sourceRow("ringfence-source", func(b *testing.B, src *Source) {
		d := &loopDispatcher{src: src, done: make(chan struct{}), want: benchMsgs, mark: mark}
		runTo(b, src, d, d.done)
	}))

	// handoff-floor is the least an engine that runs handlers off the
	// fetch goroutine can cost: each delivered slice goes whole to one
	// goroutine over a channel, which commits past each message. No
	// tenants, order per tenant, guard or bound: the price of the hand-off
	// alone, against which the engine's ratio to the source is read.
	rows = append(rows, sourceRow("handoff-floor", func(b *testing.B, src *Source) {
		d := &handoffDispatcher{src: src, ch: make(chan []*consumer.Message, 64), done: make(chan struct{}), want: benchMsgs, mark: mark}
		go d.work()
		runTo(b, src, d, d.done)
		close(d.ch) // Run returned: no DeliverBatch after it
	}))

	rows = append(rows, sourceRow("ringfence-engine", func(b *testing.B, src *Source) {
		end := consumertest.NewEndCounter(lastOffsets)
		c, err := consumer.New(consumer.Config{
			Tenant: consumer.FromKey(),
			DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
			// A no-op, as in the other rows. The end is read without a
			// write per message (consumertest.EndCounter: the handler
			// counts each partition's last message only, then the
			// engine's own count is read for the calls still running).
			// Counting per tenant in the handler wrote lines that workers
			// on both cores share on every message: 9% of the row's CPU in
			// an A/B (1,220 -> 1,114 ns a message), which the other rows,
			// counting on one goroutine, never pay; reading the engine's
			// count every millisecond was up to a millisecond late on an
			// op of ~30 ms.
			Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
				mark()
				end.Saw(m)
				return nil
			}),
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx, src) }()
		consumertest.WaitEnd(b, c, end, benchMsgs)
		lap()
		checkTenants(b, c)
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}))

	rows = append(rows, benchRow{"franz-go-kgo", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			begin()
			cl, err := kgo.NewClient(
				kgo.SeedBrokers(addrs...),
				kgo.ConsumerGroup(group()),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			n := 0
			for n < benchMsgs {
				fs := cl.PollFetches(ctx)
				if err := fs.Err0(); err != nil {
					b.Fatal(err)
				}
				fs.EachRecord(func(*kgo.Record) { // the no-op handler
					mark()
					n++
				})
			}
			lap()
			cancel()
			cl.Close()
			if n != benchMsgs {
				b.Fatalf("read %d records, want %d", n, benchMsgs)
			}
		}
		report(b)
	}})
	// Two reads of the topic first, not measured: whichever row ran first
	// in a process read about half its later speed in its first two ops
	// (the process's heap growing to its working size, the broker's first
	// reads of the topic: source 1.31M and 1.66M msg/s first in a process
	// against 3.25M and 3.51M after another row, the engine 1.41M and
	// 1.75M against 1.99M and 2.09M), a penalty the random order put on a
	// different row in each process.
	// They also learn each partition's last offset, for the engine row's
	// end (consumertest.EndCounter).
	var last [benchParts]atomic.Int64
	for range 2 {
		src, err := NewSource(addrs, topic, group())
		if err != nil {
			b.Fatal(err)
		}
		d := &loopDispatcher{src: src, done: make(chan struct{}), want: benchMsgs, mark: func() {}, seen: func(m *consumer.Message) {
			if p := &last[m.Partition.ID]; m.Offset > p.Load() {
				p.Store(m.Offset)
			}
		}}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- src.Run(ctx, d) }()
		<-d.done
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	for p := range last {
		lastOffsets[int32(p)] = last[p].Load()
	}
	// The rows run in a random order: no row always runs first after the
	// data was written, or last on a broker that has served the others.
	// For interleaved medians, run the benchmark in a loop of processes
	// (see the README).
	for _, i := range rand.Perm(len(rows)) {
		b.Run(rows[i].name, rows[i].run)
	}
}

// checkTenants fails unless c handled each tenant's share exactly once
// (nothing lost, nothing handled twice). A tenant's count is added when
// its worker's run ends, just after the engine's: it waits for those.
func checkTenants(b *testing.B, c *consumer.Consumer) {
	b.Helper()
	sum := func(st consumer.Stats) (n uint64) {
		for _, t := range st.Tenants {
			n += t.Handled
		}
		return n
	}
	consumertest.Eventually(b, "every tenant's count", func() bool { return sum(c.Stats()) >= benchMsgs })
	st := c.Stats()
	if st.Handled != benchMsgs || st.Failed != 0 || st.DeadLettered != 0 {
		b.Fatalf("handled %d, failed %d, dead-lettered %d; want %d handled", st.Handled, st.Failed, st.DeadLettered, benchMsgs)
	}
	seen := 0
	for _, t := range st.Tenants {
		if t.NoTenant {
			continue
		}
		if t.Handled != benchMsgs/benchTenants {
			b.Fatalf("tenant %q handled %d, want %d", t.Tenant, t.Handled, benchMsgs/benchTenants)
		}
		seen++
	}
	if seen != benchTenants {
		b.Fatalf("%d tenants in Stats, want %d", seen, benchTenants)
	}
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
	seen func(*consumer.Message) // the warm-up's: learns the last offsets
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
	if d.seen != nil {
		d.seen(m)
	}
	_ = d.src.Commit(context.Background(), m.Partition, m.Offset+1)
	if d.n.Add(1) == d.want {
		d.once.Do(func() { close(d.done) })
	}
}

// handoffDispatcher hands each delivered slice to one goroutine (work),
// which commits past each message: see the handoff-floor row.
type handoffDispatcher struct {
	src  *Source
	ch   chan []*consumer.Message
	want int
	done chan struct{}
	mark func()
}

func (d *handoffDispatcher) Assigned(consumer.Partition) {}
func (d *handoffDispatcher) Revoked(consumer.Partition)  {}

// DeliverBatch keeps ms: the source builds a new slice for every call.
func (d *handoffDispatcher) DeliverBatch(ms []*consumer.Message) { d.ch <- ms }

func (d *handoffDispatcher) Deliver(m *consumer.Message) { d.ch <- []*consumer.Message{m} }

func (d *handoffDispatcher) work() {
	n := 0
	for ms := range d.ch {
		for _, m := range ms {
			d.mark()
			_ = d.src.Commit(context.Background(), m.Partition, m.Offset+1)
			if n++; n == d.want {
				close(d.done)
			}
		}
	}
}

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

// benchRow is one row of BenchmarkConsume.
type benchRow struct {
	name string
	run  func(b *testing.B)
}
