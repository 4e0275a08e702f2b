package kafka

import (
	"context"
	"errors"
	"fmt"
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

// A partition the engine pauses mid-poll goes on, once resumed, from the
// records that poll returned: every record once, in order, in slices of at
// most deliverSlice.
func TestGroupResumeGoesOnFromThePoll(t *testing.T) {
	t.Parallel()
	topic := uniq("grest")
	c := startCluster(t, kfake.SeedTopics(1, topic))
	const total = 900
	var ms []kafkago.Message
	for i := range total {
		ms = append(ms, kafkago.Message{Value: []byte(fmt.Sprintf("v-%d", i))})
	}
	produce(t, c.Addrs(), topic, ms...)
	src, err := NewGroupSource(c.Addrs(), topic, uniq("g"), groupOpts()...)
	if err != nil {
		t.Fatal(err)
	}
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
