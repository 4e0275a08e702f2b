package kafka

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// sharingState reads src's sharing bookkeeping: the fetches held and the
// slices copied because maxSharedFetches were.
func sharingState(src *GroupSource) (held, copied int) {
	src.deliverMu.Lock()
	defer src.deliverMu.Unlock()
	return len(src.shared.pinned), src.shared.copied
}

// Messages that are never settled keep at most maxSharedFetches fetches'
// responses alive: the records of later fetches are copied. Once the
// commit point passed them, the fetches are released and later records
// share their responses again.
func TestGroupSharingIsBounded(t *testing.T) {
	t.Parallel()
	const total = 2000
	// Batches of 50: a fetch of 4 KiB takes a few.
	src, c, topic := seededGroup(t, "share", 50, numbered(total, "k"), WithMaxBytes(4<<10))
	k := &keeper{}
	consumertest.StartSource(t, src, k)
	consumertest.Eventually(t, "every message", func() bool { return k.len() >= total })
	held, copied := sharingState(src)
	if held > maxSharedFetches || copied == 0 {
		t.Fatalf("%d fetches shared by unsettled messages (at most %d), %d slices copied (want some)", held, maxSharedFetches, copied)
	}

	p := consumer.Partition{Topic: topic, ID: 0}
	if err := src.Commit(context.Background(), p, total); err != nil {
		t.Fatal(err)
	}
	produce(t, c.Addrs(), topic, kafkago.Message{Key: []byte("k"), Value: []byte("after")})
	consumertest.Eventually(t, "the message produced after the commit", func() bool { return k.len() >= total+1 })
	held, after := sharingState(src)
	if after != copied || held != 1 {
		t.Fatalf("after the commit: %d fetches shared, %d slices copied since; want 1 and none", held, after-copied)
	}
}

// committingGroup commits past every message it is given.
type committingGroup struct {
	src *GroupSource
	n   atomic.Int64
}

func (c *committingGroup) Assigned(consumer.Partition) {}
func (c *committingGroup) Revoked(consumer.Partition)  {}
func (c *committingGroup) Deliver(m *consumer.Message) { c.DeliverBatch([]*consumer.Message{m}) }
func (c *committingGroup) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		_ = c.src.Commit(context.Background(), m.Partition, m.Offset+1)
	}
	c.n.Add(int64(len(ms)))
}

// An assignment goes on while a commit is in flight: no lock of the
// source is held across a commit's network call. The broker holds the
// first commit until the assignment returned.
func TestGroupAssignsDuringCommit(t *testing.T) {
	t.Parallel()
	topic := uniq("flight")
	c := startCluster(t, kfake.SeedTopics(1, topic))
	produce(t, c.Addrs(), topic, kafkago.Message{Value: []byte("a")}, kafkago.Message{Value: []byte("b")})

	k := c.Kfake()
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	k.ControlKey(kmsg.OffsetCommit.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.KeepControl()
		once.Do(func() {
			close(held)
			k.SleepControl(func() { <-release })
		})
		return nil, nil, false
	})

	// A long request timeout: kgo must not give up on the held commit.
	src, err := NewGroupSource(c.Addrs(), topic, uniq("g"), groupOpts(WithClientOptions(kgo.RequestTimeoutOverhead(5*time.Minute)))...)
	if err != nil {
		t.Fatal(err)
	}
	d := &committingGroup{src: src}
	consumertest.StartSource(t, src, d)
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free) // before the source stops

	select {
	case <-held:
	case <-testCtx(t, 60*time.Second).Done():
		t.Fatal("no commit reached the broker")
	}
	assigned := make(chan struct{})
	go func() {
		src.assigned(src.cl.Load(), []int32{1}, d)
		close(assigned)
	}()
	select {
	case <-assigned:
	case <-testCtx(t, 30*time.Second).Done():
		t.Fatal("the assignment waited for the commit in flight")
	}
	free()
}

// pausingBatches records the slices it is given and pauses its partition
// after the first.
type pausingBatches struct {
	ps     *groupPart
	slices [][]*consumer.Message
}

func (d *pausingBatches) Assigned(consumer.Partition) {}
func (d *pausingBatches) Revoked(consumer.Partition)  {}
func (d *pausingBatches) Deliver(m *consumer.Message) { d.DeliverBatch([]*consumer.Message{m}) }
func (d *pausingBatches) DeliverBatch(ms []*consumer.Message) {
	d.slices = append(d.slices, ms)
	d.ps.paused.Store(true)
}

// Records kept back over a pause from two fetches are handed over sharing
// each its own fetch's response, and in order, however the pauses cut the
// runs of each fetch.
func TestGroupKeptBackFetchesShareTheirResponses(t *testing.T) {
	s := &GroupSource{cfg: defaultSourceConfig()}
	ps := &groupPart{id: consumer.Partition{Topic: "t", ID: 0}}
	s.parts.Store(&map[int32]*groupPart{0: ps})
	d := &pausingBatches{ps: ps}
	records := func(from, n int) []*kgo.Record {
		rs := make([]*kgo.Record, n)
		for i := range rs {
			rs[i] = &kgo.Record{Offset: int64(from + i), Key: []byte("k"), Value: []byte{byte(from + i)}}
		}
		return rs
	}
	first, second := records(0, deliverSlice+10), records(deliverSlice+10, 2*deliverSlice)
	var sb recordSlicer
	s.deliverMu.Lock()
	s.deliver(ps, first, 1, &sb, d) // one slice, then paused: the rest kept back
	s.deliver(ps, second, 2, &sb, d)
	s.deliverMu.Unlock()
	if got := ps.restRuns; len(got) != 2 || got[0] != (fetchRun{1, 10}) || got[1] != (fetchRun{2, 2 * deliverSlice}) {
		t.Fatalf("kept back as %v, want 10 records of fetch 1 then %d of fetch 2", got, 2*deliverSlice)
	}
	for len(ps.rest) > 0 {
		ps.paused.Store(false)
		s.deliverMu.Lock()
		s.deliver(ps, nil, -1, &sb, d)
		s.deliverMu.Unlock()
	}
	all := append(first, second...)
	var off int
	for _, ms := range d.slices {
		for _, m := range ms {
			r := all[off]
			if m.Offset != r.Offset {
				t.Fatalf("message %d has offset %d, want %d", off, m.Offset, r.Offset)
			}
			if &m.Value[0] != &r.Value[0] {
				t.Fatalf("message at offset %d was copied, want it to share its fetch's response", m.Offset)
			}
			off++
		}
	}
	if off != len(all) || ps.restRuns != nil {
		t.Fatalf("%d messages handed over, want %d; %v still kept back", off, len(all), ps.restRuns)
	}
}
