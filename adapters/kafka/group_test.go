package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// groupHarness is the conformance harness over GroupSource; extra are
// options of every source it makes.
type groupHarness struct {
	*harness
	extra []SourceOption
}

func (h groupHarness) NewSource(t testing.TB) consumer.Source {
	t.Helper()
	return &rebalancingGroupSource{GroupSource: h.source(t), h: h, t: t}
}

func (h groupHarness) source(t testing.TB) *GroupSource {
	t.Helper()
	s, err := NewGroupSource(h.c.Addrs(), h.topic, h.group, groupOpts(append([]SourceOption{WithUnknownTopicTimeout(time.Second)}, h.extra...)...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// groupOpts are GroupSource options for tests (fastOpts without the join
// backoff, which a GroupSource ignores).
func groupOpts(extra ...SourceOption) []SourceOption {
	return fastOpts(extra...)
}

// rebalancingGroupSource lets the suite's Revocation case trigger a real
// rebalance: a second member joins, takes its share and leaves.
type rebalancingGroupSource struct {
	*GroupSource
	h groupHarness
	t testing.TB
}

func (r *rebalancingGroupSource) Rebalance() {
	other := r.h.source(r.t)
	col := newCollector(false)
	stop := consumertest.StartSource(r.t, other, col)
	col.waitFor(r.t, testCtx(r.t, 30*time.Second), "the second member's assignment", func() bool { return len(col.assigned) > 0 })
	stop()
}

func TestGroupConformance(t *testing.T) {
	c := startStrictCluster(t)
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return groupHarness{harness: newHarness(t, c)} })
}

// The same with the broker assigning partitions (KIP-848, kgo's
// ServerSideBalancer), which kfake speaks.
func TestGroupConformanceServerSide(t *testing.T) {
	c := startStrictCluster(t)
	extra := []SourceOption{WithClientOptions(kgo.ServerSideBalancer())}
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return groupHarness{harness: newHarness(t, c), extra: extra} })
}

func TestNewGroupSourceValidates(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	tests := []struct {
		name    string
		brokers []string
		topic   string
		group   string
		opts    []SourceOption
	}{
		{"no brokers", nil, "t", "g", nil},
		{"empty topic", ok, "", "g", nil},
		{"bad topic char", ok, "a/b", "g", nil},
		{"empty group", ok, "t", "", nil},
		{"nil option", ok, "t", "g", []SourceOption{nil}},
		{"kafka-go dialer", ok, "t", "g", []SourceOption{WithDialer(kafkago.DefaultDialer)}},
		{"nil kgo option", ok, "t", "g", []SourceOption{WithClientOptions(nil)}},
		{"zero commit interval", ok, "t", "g", []SourceOption{WithCommitInterval(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGroupSource(tt.brokers, tt.topic, tt.group, tt.opts...)
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
	if _, err := NewGroupSource(ok, "orders.v1", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSource(ok, "orders.v1", "g", WithClientOptions()); err != nil {
		t.Fatal(err) // no kgo option given
	}
}

// pausingGroup pauses its partition after every delivered slice and lets
// the test resume it.
type pausingGroup struct {
	src    *GroupSource
	mu     sync.Mutex
	offs   []int64
	paused chan consumer.Partition
}

func (c *pausingGroup) Assigned(consumer.Partition) {}
func (c *pausingGroup) Revoked(consumer.Partition)  {}
func (c *pausingGroup) Deliver(m *consumer.Message) { c.DeliverBatch([]*consumer.Message{m}) }
func (c *pausingGroup) DeliverBatch(ms []*consumer.Message) {
	c.mu.Lock()
	for _, m := range ms {
		c.offs = append(c.offs, m.Offset)
	}
	c.mu.Unlock()
	_ = c.src.Commit(context.Background(), ms[0].Partition, ms[len(ms)-1].Offset+1)
	c.src.Pause(ms[0].Partition)
	c.paused <- ms[0].Partition
}

// A partition the engine pauses mid-fetch goes on, once resumed, from the
// records that fetch returned: every record once, in order, in slices of at
// most deliverSlice.
func TestGroupResumeGoesOnFromTheFetch(t *testing.T) {
	t.Parallel()
	const total = 900
	src, _, _ := seededGroup(t, "grest", total, numbered(total, ""))
	col := &pausingGroup{src: src, paused: make(chan consumer.Partition, 64)}
	consumertest.StartSource(t, src, col)
	ctx := testCtx(t, 60*time.Second)
	slices := 0
	for {
		var p consumer.Partition
		select {
		case p = <-col.paused:
		case <-ctx.Done():
			t.Fatalf("%d slices delivered, then nothing", slices)
		}
		slices++
		col.mu.Lock()
		n := len(col.offs)
		col.mu.Unlock()
		if n >= total {
			break
		}
		src.Resume(p)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.offs) != total {
		t.Fatalf("%d deliveries, want %d", len(col.offs), total)
	}
	for i, off := range col.offs {
		if off != int64(i) {
			t.Fatalf("delivery %d has offset %d: want every offset once, in order", i, off)
		}
	}
	if want := (total + deliverSlice - 1) / deliverSlice; slices < want {
		t.Fatalf("%d slices, want at least %d: the pauses did not hold back the rest", slices, want)
	}
	src.deliverMu.Lock()
	kept := src.keptRecords
	src.deliverMu.Unlock()
	if kept == 0 || kept > total {
		t.Fatalf("%d records kept back over the pauses, want 1 to %d: each kept back once, however many pauses it waits through", kept, total)
	}
}

// A member joining takes partitions from the first without the first
// losing any other: only what moves is revoked, and the partitions that
// stay are never revoked nor assigned again.
func TestGroupRevokesOnlyWhatMoves(t *testing.T) {
	t.Parallel()
	topic := uniq("moves")
	const parts = 6
	c := startCluster(t, kfake.SeedTopics(parts, topic))
	group := uniq("g")
	newMember := func() (*GroupSource, *collector) {
		src, err := NewGroupSource(c.Addrs(), topic, group, groupOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		return src, newCollector(false)
	}
	ctx := testCtx(t, 60*time.Second)
	a, colA := newMember()
	consumertest.StartSource(t, a, colA)
	colA.waitFor(t, ctx, "every partition at the first member", func() bool { return len(colA.assigned) == parts })
	b, colB := newMember()
	consumertest.StartSource(t, b, colB)
	colB.waitFor(t, ctx, "the second member's share", func() bool { return len(colB.assigned) == parts/2 })
	colA.waitFor(t, ctx, "the first member's revocations", func() bool { return len(colA.revoked) >= parts/2 })

	colA.mu.Lock()
	defer colA.mu.Unlock()
	colB.mu.Lock()
	defer colB.mu.Unlock()
	for p := range int32(parts) {
		_, moved := colB.assigned[p]
		switch {
		case moved && colA.revoked[p] != 1:
			t.Errorf("partition %d moved, revoked %d times at the first member", p, colA.revoked[p])
		case !moved && (colA.revoked[p] != 0 || colA.assigned[p] != 1):
			t.Errorf("partition %d stayed, yet revoked %d times and assigned %d times", p, colA.revoked[p], colA.assigned[p])
		}
	}
}

// A member that leaves the group has committed every message it handled
// before its partitions reach the member that stays, with the classic
// cooperative protocol and with KIP-848 alike: the member that stays reads
// none of them again. No periodic commit runs (an hour apart), so only the
// commits on revocation and on leaving can cover them.
func TestGroupLeaveCommitsWhatWasHandled(t *testing.T) {
	t.Parallel()
	for _, proto := range []struct {
		name string
		opts []SourceOption
	}{
		{"cooperative", nil},
		{"KIP-848", []SourceOption{WithClientOptions(kgo.ServerSideBalancer())}},
	} {
		t.Run(proto.name, func(t *testing.T) {
			t.Parallel()
			topic := uniq("leave")
			const parts = 4
			c := startCluster(t, kfake.SeedTopics(parts, topic))
			group := uniq("g")
			newMember := func() (*collector, func()) {
				src, err := NewGroupSource(c.Addrs(), topic, group, groupOpts(append(proto.opts, WithCommitInterval(time.Hour))...)...)
				if err != nil {
					t.Fatal(err)
				}
				col := newCollector(false)
				col.onMsg = func(m *consumer.Message) { _ = src.Commit(context.Background(), m.Partition, m.Offset+1) }
				return col, consumertest.StartSource(t, src, col)
			}
			ctx := testCtx(t, 60*time.Second)
			delivered := func(cols ...*collector) map[string]int {
				all := map[string]int{}
				for _, col := range cols {
					col.mu.Lock()
					for v, n := range col.seen {
						all[v] += n
					}
					col.mu.Unlock()
				}
				return all
			}

			a, stopA := newMember()
			a.waitFor(t, ctx, "every partition at the first member", func() bool { return len(a.assigned) == parts })
			b, _ := newMember()
			b.waitFor(t, ctx, "the second member's share", func() bool { return len(b.assigned) == parts/2 })
			first := msgs("first", parts, 50)
			produce(t, c.Addrs(), topic, first...)
			eventually(t, ctx, "the first messages delivered", func() bool { return len(delivered(a, b)) == len(first) })
			a.mu.Lock()
			handledByA := len(a.seen)
			a.mu.Unlock()
			if handledByA == 0 {
				t.Fatal("the leaving member handled nothing; the test proves nothing")
			}

			stopA()
			b.waitFor(t, ctx, "every partition at the member that stays", func() bool { return len(b.assigned) == parts })
			then := msgs("then", parts, 10)
			produce(t, c.Addrs(), topic, then...)
			// Each partition is read in offset order: once the later
			// messages are in, the member that stays has read all it
			// would read again.
			eventually(t, ctx, "the later messages delivered", func() bool { return len(delivered(a, b)) == len(first)+len(then) })
			for v, n := range delivered(a, b) {
				if n != 1 {
					t.Errorf("%s delivered %d times", v, n)
				}
			}
		})
	}
}

// keeper keeps every delivered message, for a test to read after later
// fetches.
type keeper struct {
	mu sync.Mutex
	ms []*consumer.Message
}

func (k *keeper) Assigned(consumer.Partition) {}
func (k *keeper) Revoked(consumer.Partition)  {}
func (k *keeper) Deliver(m *consumer.Message) { k.DeliverBatch([]*consumer.Message{m}) }
func (k *keeper) DeliverBatch(ms []*consumer.Message) {
	k.mu.Lock()
	k.ms = append(k.ms, ms...)
	k.mu.Unlock()
}

func (k *keeper) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.ms)
}

// Messages keep nothing kgo reuses: kgo decodes later fetches into the
// same pooled slabs and decompression buffers (kgoPools), and every message
// kept from the first fetches, whether it shares its fetch response or was
// copied (kept, none is settled: past maxSharedFetches fetches they are
// copied), still reads as produced, null and empty apart, and appending to
// its bytes writes over nothing else.
func TestGroupMessagesOutliveRecycledRecords(t *testing.T) {
	t.Parallel()
	for _, codec := range []kafkago.Compression{0, kafkago.Snappy, kafkago.Lz4, kafkago.Gzip, kafkago.Zstd} {
		t.Run(fmt.Sprint(codec), func(t *testing.T) {
			t.Parallel()
			topic := uniq("recycle")
			c := startCluster(t, kfake.SeedTopics(1, topic))
			const total = 3000
			want := make([]kafkago.Message, total)
			for i := range want {
				m := &want[i]
				m.Key = []byte(fmt.Sprintf("k-%d", i%7))
				switch i % 5 {
				case 0: // null value
				case 1:
					m.Value = []byte{}
				case 2:
					m.Value = bytes.Repeat([]byte{byte(i)}, largeValue+1+i%3)
				default:
					m.Value = []byte(fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", i%50)))
				}
				if i%3 == 0 {
					m.Headers = []kafkago.Header{{Key: fmt.Sprintf("h-%d", i), Value: []byte(fmt.Sprint(i))}}
				}
			}
			w := &kafkago.Writer{Addr: kafkago.TCP(c.Addrs()...), Topic: topic, RequiredAcks: kafkago.RequireAll,
				BatchTimeout: time.Millisecond, BatchSize: 100, Compression: codec}
			defer w.Close()
			for i := 0; i < total; i += 100 {
				if err := w.WriteMessages(testCtx(t, 30*time.Second), want[i:i+100]...); err != nil {
					t.Fatal(err)
				}
			}
			src, err := NewGroupSource(c.Addrs(), topic, uniq("g"), groupOpts(WithMaxBytes(16<<10))...)
			if err != nil {
				t.Fatal(err)
			}
			k := &keeper{}
			stop := consumertest.StartSource(t, src, k)
			consumertest.Eventually(t, "every message", func() bool { return k.len() >= total })
			stop()
			k.mu.Lock()
			defer k.mu.Unlock()
			if len(k.ms) != total {
				t.Fatalf("%d messages, want %d", len(k.ms), total)
			}
			for i, m := range k.ms {
				w := want[i]
				switch {
				case m.Offset != int64(i):
					t.Fatalf("message %d has offset %d", i, m.Offset)
				case !bytes.Equal(m.Key, w.Key):
					t.Fatalf("message %d: key %q, want %q", i, m.Key, w.Key)
				case !bytes.Equal(m.Value, w.Value), (m.Value == nil) != (w.Value == nil):
					t.Fatalf("message %d: value %.40q (nil %v), want %.40q (nil %v)", i, m.Value, m.Value == nil, w.Value, w.Value == nil)
				case len(m.Headers) != len(w.Headers):
					t.Fatalf("message %d: %d headers, want %d", i, len(m.Headers), len(w.Headers))
				case cap(m.Key) != len(m.Key), cap(m.Value) != len(m.Value):
					t.Fatalf("message %d: key or value has room past its end", i)
				}
				for j, h := range m.Headers {
					if h.Key != w.Headers[j].Key || !bytes.Equal(h.Value, w.Headers[j].Value) || cap(h.Value) != len(h.Value) {
						t.Fatalf("message %d: header %q=%q, want %q=%q", i, h.Key, h.Value, w.Headers[j].Key, w.Headers[j].Value)
					}
				}
			}
		})
	}
}

// holdingGroup pauses its partition after the first delivered slice and
// counts what it was given.
type holdingGroup struct {
	src    *GroupSource
	mu     sync.Mutex
	offs   []int64
	paused chan consumer.Partition
}

func (c *holdingGroup) Assigned(consumer.Partition) {}
func (c *holdingGroup) Revoked(consumer.Partition)  {}
func (c *holdingGroup) Deliver(m *consumer.Message) { c.DeliverBatch([]*consumer.Message{m}) }
func (c *holdingGroup) DeliverBatch(ms []*consumer.Message) {
	c.mu.Lock()
	first := len(c.offs) == 0
	for _, m := range ms {
		c.offs = append(c.offs, m.Offset)
	}
	c.mu.Unlock()
	if first {
		c.src.Pause(ms[0].Partition)
		c.paused <- ms[0].Partition
	}
}

// holdFirst runs src into a holdingGroup and returns it with the partition
// it paused after its first slice.
func holdFirst(t *testing.T, src *GroupSource) (*holdingGroup, consumer.Partition) {
	t.Helper()
	col := &holdingGroup{src: src, paused: make(chan consumer.Partition, 1)}
	consumertest.StartSource(t, src, col)
	select {
	case p := <-col.paused:
		return col, p
	case <-testCtx(t, 60*time.Second).Done():
		t.Fatal("nothing delivered")
		return nil, consumer.Partition{}
	}
}

// given is how many records col was handed, and what src keeps back of p.
func (c *holdingGroup) given(src *GroupSource, p consumer.Partition) (given, kept int) {
	src.deliverMu.Lock()
	kept = len(src.lookup(p).rest)
	src.deliverMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.offs), kept
}

// resumeAll resumes p and fails unless col then gets every one of total
// records once, in offset order.
func (c *holdingGroup) resumeAll(t *testing.T, src *GroupSource, p consumer.Partition, total int) {
	t.Helper()
	src.Resume(p)
	consumertest.Eventually(t, "every record", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.offs) >= total
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, off := range c.offs {
		if off != int64(i) {
			t.Fatalf("delivery %d has offset %d: want every offset once, in order", i, off)
		}
	}
	if len(c.offs) != total {
		t.Fatalf("%d deliveries, want %d", len(c.offs), total)
	}
}

// A paused partition keeps back the rest of the fetch it was delivering
// and fetches no more until Resume; after Resume every record comes once,
// in order.
func TestGroupPauseStopsFetching(t *testing.T) {
	t.Parallel()
	const total = 2000
	// Batches of 50: a fetch of 4 KiB takes a few.
	src, _, _ := seededGroup(t, "hold", 50, numbered(total, ""), WithMaxBytes(4<<10))
	col, p := holdFirst(t, src)
	ps := src.lookup(p)
	consumertest.Eventually(t, "the fetcher waiting for Resume", ps.waiting.Load)
	given, kept := col.given(src, p)
	if kept == 0 || kept+given >= total {
		t.Fatalf("%d kept back and %d delivered of %d: want the rest of one fetch kept back", kept, given, total)
	}
	if f := ps.fetches.Load(); f != 1 {
		t.Fatalf("%d fetches made while paused after the first, want none", f-1)
	}
	col.resumeAll(t, src, p, total)
}

// A partition read to its end has its Fetch held by the broker for
// WithMaxWait; the other partitions do not wait behind it. Here the
// broker holds partition 0's one Fetch for longer than the test waits,
// while partition 1 is fed three times, each taking a fetch of its own.
func TestGroupIdlePartitionHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	topic := uniq("idle")
	c := startCluster(t, kfake.SeedTopics(2, topic))
	src, err := NewGroupSource(c.Addrs(), topic, uniq("g"), groupOpts(WithMaxWait(5*time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(false)
	consumertest.StartSource(t, src, col)
	idle, busy := consumer.Partition{Topic: topic, ID: 0}, consumer.Partition{Topic: topic, ID: 1}
	consumertest.Eventually(t, "both partitions fetching", func() bool {
		i, b := src.lookup(idle), src.lookup(busy)
		return i != nil && b != nil && i.fetches.Load() == 1 && b.fetches.Load() == 1
	})
	for i := range 3 {
		produce(t, c.Addrs(), topic, kafkago.Message{Partition: 1, Value: []byte(fmt.Sprintf("v-%d", i))})
		consumertest.Eventually(t, fmt.Sprintf("partition 1's record %d", i), func() bool {
			col.mu.Lock()
			defer col.mu.Unlock()
			return len(col.byPart[1]) == i+1
		})
	}
	if f := src.lookup(idle).fetches.Load(); f != 1 {
		t.Fatalf("partition 0 sent %d fetches, want its first still held", f)
	}
	if f := src.lookup(busy).fetches.Load(); f < 4 {
		t.Fatalf("partition 1 sent %d fetches for three records fed one at a time, want at least 4", f)
	}
}
