package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/cputime"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/scope"
)

const (
	// benchMsgs is BenchmarkConsume's topic: large enough that an op
	// measures the clients' sustained rate, not their start (group join,
	// first fetch, the heap growing to its working size).
	benchMsgs    = 1_000_000
	benchParts   = 4
	benchTenants = 20
	// manyTenants is BenchmarkConsumeTenants's: every message its own key.
	manyTenants = 100_000
)

// benchTopic fills one topic once, its messages keyed round-robin over
// tenants keys; every row of a benchmark reads the same data with a fresh
// group.
func benchTopic(b *testing.B, msgs, tenants int) (addrs []string, topic string) {
	b.Helper()
	c, err := kafkatest.Start(kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	topic = "bench"
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	ctx := context.Background()
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: benchParts, ReplicationFactor: -1}},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := resp.Errors[topic]; err != nil {
		b.Fatal(err)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(c.Addrs()...), Topic: topic, Balancer: &kafkago.RoundRobin{}, BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireAll}
	defer w.Close()
	value := make([]byte, 100)
	width := len(fmt.Sprint(tenants - 1))
	batch := make([]kafkago.Message, 0, 1000)
	for i := range msgs {
		batch = append(batch, kafkago.Message{Key: []byte(fmt.Sprintf("tenant-%0*d", width, i%tenants)), Value: value})
		if len(batch) == cap(batch) {
			if err := w.WriteMessages(ctx, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	return c.Addrs(), topic
}

// BenchmarkConsume reads the same 1,000,000 messages (4 partitions, 20
// tenants, 100-byte values) with a no-op handler: kafka-go's own group
// Reader (FetchMessage + CommitMessages, commits batched by
// CommitInterval), ringfence's kafka.Source driven by a minimal loop that
// commits every message, the Source with each delivered slice handed whole
// to one goroutine that commits past its messages (handoff-floor: what
// running handlers off the fetch goroutine costs at the least), the Source
// under the full engine, and franz-go's kgo client in a group (a
// PollFetches loop, committed by kgo's default autocommit: every 5s, only
// what earlier polls returned, so a record is committed only once the loop
// has handled it and polled again; once with its defaults and once with
// FetchMaxBytes 1 MiB), and kafka.GroupSource (the group run by kgo, each
// partition fetched on a kgo client of its own) alone and under the
// engine, to read against kgo's own loop. One op is
// the whole topic, group join and shutdown included; msgs/s is the figure
// to compare. The topic is large enough that an op measures each client's
// sustained rate rather than its start (group join, first fetch, the heap
// growing to its working size), which differs from client to client. The
// rows run in a random order in one invocation, each row's -count
// repetitions back to back; for medians and ratios, interleave the rows
// with a process per round (bench/run.sh does), from bench/:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'Consume$' -benchtime 1x -count 3 ./kafka/; done
func BenchmarkConsume(b *testing.B) { benchConsume(b, benchMsgs, benchTenants) }

// BenchmarkConsumeTenants is BenchmarkConsume's source, handoff-floor and
// engine rows over a topic whose 100,000 messages each have a key of their
// own: 100,000 tenants, each seen once, through an engine of the default
// Config (a Scope of 1024 keys, as many idle tenants kept), so that nearly
// every message makes a tenant, a lane and a guard, and the engine forgets
// as many. The engine's ratio to the source is the figure to compare with
// BenchmarkConsume's. From bench/:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'ConsumeTenants$' -benchtime 1x -count 3 ./kafka/; done
func BenchmarkConsumeTenants(b *testing.B) {
	benchConsume(b, manyTenants, manyTenants, "ringfence-source", "handoff-floor", "ringfence-engine")
}

// benchConsume runs the rows of BenchmarkConsume named in only (all of
// them if none) over a topic keyed over tenants keys.
func benchConsume(b *testing.B, msgs, tenants int, only ...string) {
	addrs, topic := benchTopic(b, msgs, tenants)
	var groups atomic.Int64
	group := func() string { return fmt.Sprintf("bench-%d", groups.Add(1)) }
	// msgs/s counts from the first message to the last of each op, so the
	// group join and the shutdown (kafka-go's Close alone is slow on kfake)
	// do not blur the comparison; ns/op includes them. It flatters a
	// client whose first delivery is large: kgo's first poll hands over
	// 4 MiB already fetched and decoded (a thirtieth of BenchmarkConsume's
	// topic, a third of BenchmarkConsumeTenants's), which that window
	// never sees. incl-join-msgs/s counts from the client's creation
	// to the last message instead (group join and first fetch included,
	// shutdown not), and from-assign-msgs/s from the client's first
	// partition assignment (first fetch included, group join not; every row
	// but kafka-go's Reader, which does not report it): read them all. cpu-ns/msg is the process's CPU time over
	// that same span, the in-process broker included: what a row costs
	// the machine, which load from other processes distorts far less.
	// faults/op is the process's page faults over the same span: on a VM a
	// fault costs microseconds, and an op takes from a few to thousands, as
	// often as the runtime's scavenger returned the pages the fetch path
	// allocates from; it explains more of an op's CPU than anything else
	// that varies.
	// gc-ns/msg is the part of cpu-ns/msg the collector took (the runtime's
	// estimate, idle-time marking included) and gcs/op the cycles it
	// completed: a row that keeps more heap live (the engine keeps up to
	// its read-ahead of messages a partition), or allocates more, pays for
	// it there.
	var streaming, sinceStart, sinceAssign time.Duration
	var assignedOps int             // ops whose client reported an assignment
	var cpu, cpu0 time.Duration     // process CPU time, creation to last message
	var faults, faults0 int64       // the process's page faults, the same span
	var gcCPU, gcCPU0 time.Duration // the collector's CPU (cputime.GC), the same span
	var gcs, gcs0 uint64            // GC cycles completed, the same span
	report := func(b *testing.B) {
		b.ReportMetric(float64(msgs*b.N)/streaming.Seconds(), "msgs/s")
		b.ReportMetric(float64(streaming.Nanoseconds())/float64(msgs*b.N), "ns/msg")
		b.ReportMetric(float64(msgs*b.N)/sinceStart.Seconds(), "incl-join-msgs/s")
		if assignedOps == b.N {
			b.ReportMetric(float64(msgs*b.N)/sinceAssign.Seconds(), "from-assign-msgs/s")
		}
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(msgs*b.N), "cpu-ns/msg")
		b.ReportMetric(float64(faults)/float64(b.N), "faults/op")
		b.ReportMetric(float64(gcCPU.Nanoseconds())/float64(msgs*b.N), "gc-ns/msg")
		b.ReportMetric(float64(gcs)/float64(b.N), "gcs/op")
		b.ReportMetric(float64(cputime.RoundTrip(5, 20000)), "xcore-ns")
		streaming, sinceStart, sinceAssign, assignedOps, cpu, faults, gcCPU, gcs = 0, 0, 0, 0, 0, 0, 0, 0
	}
	var started, first, assignedAt time.Time
	var firstOnce, assignOnce sync.Once
	// assigned marks the client's first partition assignment of the op
	// (from-assign-msgs/s).
	assigned := func() { assignOnce.Do(func() { assignedAt = time.Now() }) }
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
		if !assignedAt.IsZero() {
			sinceAssign += time.Since(assignedAt)
			assignedOps++
		}
		firstOnce, assignOnce, assignedAt = sync.Once{}, sync.Once{}, time.Time{}
	}

	// runTo runs src into d until done, times the op (lap) and stops src.
	runTo := func(b *testing.B, src *kafka.Source, d consumer.Dispatcher, done <-chan struct{}) {
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
			for range msgs {
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
	sourceRow := func(name string, op func(b *testing.B, src *kafka.Source)) benchRow {
		return benchRow{name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				begin()
				src, err := kafka.NewSource(addrs, topic, group())
				if err != nil {
					b.Fatal(err)
				}
				op(b, src)
			}
			report(b)
		}}
	}

	rows = append(rows, sourceRow("ringfence-source", func(b *testing.B, src *kafka.Source) {
		d := &loopDispatcher{src: src, done: make(chan struct{}), want: int64(msgs), mark: mark, assigned: assigned}
		runTo(b, src, d, d.done)
	}))

	// handoff-floor is the least an engine that runs handlers off the
	// fetch goroutine can cost: each delivered slice goes whole to one
	// goroutine over a channel, which commits past each message. No
	// tenants, order per tenant, guard or bound: the price of the hand-off
	// alone, against which the engine's ratio to the source is read.
	rows = append(rows, sourceRow("handoff-floor", func(b *testing.B, src *kafka.Source) {
		d := &handoffDispatcher{src: src, ch: make(chan []*consumer.Message, 64), done: make(chan struct{}), want: msgs, mark: mark, assigned: assigned}
		go d.work()
		runTo(b, src, d, d.done)
		close(d.ch) // Run returned: no DeliverBatch after it
	}))

	// engineOp runs the full engine on src to the end of the topic.
	engineOp := func(b *testing.B, src consumer.Source) {
		end := consumertest.NewEndCounter(lastOffsets)
		c, err := consumer.New(consumer.Config{
			Tenant: consumer.FromKey(),
			DLQ:    dlq.SinkFunc(func(context.Context, *dlq.Record) error { return nil }),
			// A no-op, as in the other rows. The end is read without a
			// write per message (consumertest.EndCounter: the handler
			// counts each partition's last message only, then the
			// engine's own count is read for the calls still running).
			// Counting per tenant in the handler would write lines that
			// workers on both cores share on every message, which the
			// other rows, counting on one goroutine, never pay; polling
			// the engine's count would end the op late.
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
		consumertest.WaitEnd(b, c, end, uint64(msgs))
		lap()
		checkTenants(b, c, msgs, tenants)
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	rows = append(rows, sourceRow("ringfence-engine", func(b *testing.B, src *kafka.Source) { engineOp(b, markSource{src, assigned}) }))

	// The group rows read the topic with kafka.GroupSource (kgo, the
	// cooperative-sticky balancer, commits only what the engine gives):
	// alone, committing past every message as ringfence-source does, and
	// under the full engine. Read them against franz-go-kgo, the same
	// client's own poll loop.
	groupRow := func(name string, op func(b *testing.B, src *kafka.GroupSource)) benchRow {
		return benchRow{name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				begin()
				src, err := kafka.NewGroupSource(addrs, topic, group())
				if err != nil {
					b.Fatal(err)
				}
				op(b, src)
			}
			report(b)
		}}
	}
	rows = append(rows, groupRow("ringfence-group-source", func(b *testing.B, src *kafka.GroupSource) {
		d := &groupLoopDispatcher{src: src, done: make(chan struct{}), want: int64(msgs), mark: mark, assigned: assigned}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- src.Run(ctx, d) }()
		<-d.done
		lap()
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}))
	rows = append(rows, groupRow("ringfence-group-engine", func(b *testing.B, src *kafka.GroupSource) { engineOp(b, markGroupSource{src, assigned}) }))

	// kgoRow is franz-go's kgo in a group, a PollFetches loop, with opts
	// added to its client.
	kgoRow := func(name string, opts ...kgo.Opt) benchRow {
		return benchRow{name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				begin()
				cl, err := kgo.NewClient(append([]kgo.Opt{
					kgo.SeedBrokers(addrs...),
					kgo.ConsumerGroup(group()),
					kgo.ConsumeTopics(topic),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
					kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assigned() }),
				}, opts...)...)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				n := 0
				for n < msgs {
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
				if n != msgs {
					b.Fatalf("read %d records, want %d", n, msgs)
				}
			}
			report(b)
		}}
	}
	rows = append(rows, kgoRow("franz-go-kgo"))
	// The same with a fetch of 1 MiB in all: kgo's default of 50 MiB makes
	// a fetch one response of every partition's 1 MiB, which costs the
	// process far more page faults and misses; read the GroupSource (a
	// fetch of at most WithMaxBytes, 1 MiB, per partition) against both.
	rows = append(rows, kgoRow("franz-go-kgo-1mib", kgo.FetchMaxBytes(1<<20)))
	// Two reads of the topic first, not measured: whichever row runs first
	// in a process reads far slower in its first ops (the process's heap
	// growing to its working size, the broker's first reads of the topic),
	// a penalty the random order would put on a different row in each
	// process.
	// They also learn each partition's last offset, for the engine row's
	// end (consumertest.EndCounter).
	var last [benchParts]atomic.Int64
	for range 2 {
		src, err := kafka.NewSource(addrs, topic, group())
		if err != nil {
			b.Fatal(err)
		}
		d := &loopDispatcher{src: src, done: make(chan struct{}), want: int64(msgs), mark: func() {}, seen: func(m *consumer.Message) {
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
	// (bench/run.sh).
	for _, i := range rand.Perm(len(rows)) {
		if len(only) == 0 || slices.Contains(only, rows[i].name) {
			b.Run(rows[i].name, rows[i].run)
		}
	}
}

// checkTenants fails unless c handled each of tenants tenants' share
// exactly once (nothing lost, nothing handled twice). A tenant's count is
// added when its worker's run ends, just after the engine's: it waits for
// those. Of more tenants than the engine keeps idle (MaxIdleTenants), only
// the engine's totals and the tenants it still tracks can be checked.
func checkTenants(b *testing.B, c *consumer.Consumer, msgs, tenants int) {
	b.Helper()
	want, each := uint64(msgs), uint64(msgs/tenants)
	if tenants > scope.DefaultMaxKeys {
		consumertest.Eventually(b, "the engine's count", func() bool { return c.Stats().Handled >= want })
		st := c.Stats()
		if st.Handled != want || st.Failed != 0 || st.DeadLettered != 0 {
			b.Fatalf("handled %d, failed %d, dead-lettered %d; want %d handled", st.Handled, st.Failed, st.DeadLettered, want)
		}
		for _, t := range st.Tenants {
			if !t.NoTenant && t.Handled > each {
				b.Fatalf("tenant %q handled %d, want at most %d", t.Tenant, t.Handled, each)
			}
		}
		return
	}
	sum := func(st consumer.Stats) (n uint64) {
		for _, t := range st.Tenants {
			n += t.Handled
		}
		return n
	}
	consumertest.Eventually(b, "every tenant's count", func() bool { return sum(c.Stats()) >= want })
	st := c.Stats()
	if st.Handled != want || st.Failed != 0 || st.DeadLettered != 0 {
		b.Fatalf("handled %d, failed %d, dead-lettered %d; want %d handled", st.Handled, st.Failed, st.DeadLettered, want)
	}
	seen := 0
	for _, t := range st.Tenants {
		if t.NoTenant {
			continue
		}
		if t.Handled != each {
			b.Fatalf("tenant %q handled %d, want %d", t.Tenant, t.Handled, each)
		}
		seen++
	}
	if seen != tenants {
		b.Fatalf("%d tenants in Stats, want %d", seen, tenants)
	}
}

// loopDispatcher is the smallest possible engine: every delivered message
// is settled at once by committing past it.
type loopDispatcher struct {
	src      *kafka.Source
	want     int64
	n        atomic.Int64
	once     sync.Once
	done     chan struct{}
	mark     func()
	seen     func(*consumer.Message) // the warm-up's: learns the last offsets
	assigned func()                  // if set, called for each partition assigned
}

func (d *loopDispatcher) Assigned(consumer.Partition) {
	if d.assigned != nil {
		d.assigned()
	}
}
func (d *loopDispatcher) Revoked(consumer.Partition) {}
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

// groupLoopDispatcher is loopDispatcher over a GroupSource.
type groupLoopDispatcher struct {
	src      *kafka.GroupSource
	want     int64
	n        atomic.Int64
	once     sync.Once
	done     chan struct{}
	mark     func()
	assigned func()
}

func (d *groupLoopDispatcher) Assigned(consumer.Partition) { d.assigned() }
func (d *groupLoopDispatcher) Revoked(consumer.Partition)  {}
func (d *groupLoopDispatcher) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		d.Deliver(m)
	}
}

func (d *groupLoopDispatcher) Deliver(m *consumer.Message) {
	d.mark()
	_ = d.src.Commit(context.Background(), m.Partition, m.Offset+1)
	if d.n.Add(1) == d.want {
		d.once.Do(func() { close(d.done) })
	}
}

// handoffDispatcher hands each delivered slice to one goroutine (work),
// which commits past each message: see the handoff-floor row.
type handoffDispatcher struct {
	src      *kafka.Source
	ch       chan []*consumer.Message
	want     int
	done     chan struct{}
	mark     func()
	assigned func()
}

func (d *handoffDispatcher) Assigned(consumer.Partition) { d.assigned() }
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

// benchRow is one row of BenchmarkConsume.
type benchRow struct {
	name string
	run  func(b *testing.B)
}

// markSource and markGroupSource are the sources with Run's dispatcher
// told of each assigned partition first (assignDispatcher), their other
// methods (SettleIsNoop among them) as the source's own.
type markSource struct {
	*kafka.Source
	assigned func()
}

func (s markSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	return s.Source.Run(ctx, assignDispatcher{d, s.assigned})
}

type markGroupSource struct {
	*kafka.GroupSource
	assigned func()
}

func (s markGroupSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	return s.GroupSource.Run(ctx, assignDispatcher{d, s.assigned})
}

// assignDispatcher calls assigned as each partition is assigned, before
// the engine learns of it (from-assign-msgs/s).
type assignDispatcher struct {
	consumer.Dispatcher
	assigned func()
}

func (d assignDispatcher) Assigned(p consumer.Partition) {
	d.assigned()
	d.Dispatcher.Assigned(p)
}
