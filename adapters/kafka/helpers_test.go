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
	"github.com/ringfence/ringfence/internal/kafkatest"
)

var topicSeq atomic.Int64

// uniq returns a fresh name for a topic or group.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, topicSeq.Add(1))
}

// startCluster starts a kfake cluster with short group timeouts so that
// rebalances take well under a second.
func startCluster(t testing.TB, opts ...kfake.Opt) *kafkatest.Cluster {
	t.Helper()
	base := []kfake.Opt{
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(1),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0", "group.consumer.heartbeat.interval.ms": "200"}),
	}
	return kafkatest.MustStart(t, append(base, opts...)...)
}

// startStrictCluster is startCluster without topic auto-creation, so that
// an unknown topic stays unknown.
func startStrictCluster(t testing.TB, opts ...kfake.Opt) *kafkatest.Cluster {
	t.Helper()
	base := []kfake.Opt{
		kfake.GroupMinSessionTimeout(500 * time.Millisecond),
		kfake.DefaultNumPartitions(1),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0", "group.consumer.heartbeat.interval.ms": "200"}),
	}
	return kafkatest.MustStart(t, append(base, opts...)...)
}

// fastOpts are source options for tests: quick heartbeats, short fetch
// waits, frequent commits.
func fastOpts(extra ...SourceOption) []SourceOption {
	return append([]SourceOption{
		WithHeartbeatInterval(100 * time.Millisecond),
		WithSessionTimeout(3 * time.Second),
		WithRebalanceTimeout(3 * time.Second),
		WithJoinBackoff(100 * time.Millisecond),
		WithMaxWait(100 * time.Millisecond),
		WithCommitInterval(50 * time.Millisecond),
	}, extra...)
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// produce writes msgs to topic (partition chosen by msg.Partition) and
// waits for the acknowledgement.
func produce(t testing.TB, addrs []string, topic string, msgs ...kafkago.Message) {
	t.Helper()
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(addrs...),
		Topic:        topic,
		RequiredAcks: kafkago.RequireAll,
		Balancer:     byPartition{},
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
	}
	defer w.Close()
	if err := w.WriteMessages(testCtx(t, 30*time.Second), msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// byPartition sends each message to the partition in its Partition field.
type byPartition struct{}

func (byPartition) Balance(m kafkago.Message, partitions ...int) int {
	for _, p := range partitions {
		if p == m.Partition {
			return p
		}
	}
	return partitions[0]
}

// collector is a Dispatcher that settles every message at once by
// committing past it, and records what it saw.
type collector struct {
	src    *Source // set before Run
	commit bool

	mu       sync.Mutex
	seen     map[string]int // value -> deliveries
	byPart   map[int32][]int64
	assigned map[int32]int
	revoked  map[int32]int
	onMsg    func(m *consumer.Message) // optional, called under no lock
	changed  chan struct{}
}

func newCollector(commit bool) *collector {
	return &collector{
		commit:   commit,
		seen:     map[string]int{},
		byPart:   map[int32][]int64{},
		assigned: map[int32]int{},
		revoked:  map[int32]int{},
		changed:  make(chan struct{}, 1),
	}
}

func (c *collector) Assigned(p consumer.Partition) {
	c.mu.Lock()
	c.assigned[p.ID]++
	c.mu.Unlock()
	c.poke()
}

func (c *collector) Revoked(p consumer.Partition) {
	c.mu.Lock()
	c.revoked[p.ID]++
	c.mu.Unlock()
	c.poke()
}

func (c *collector) DeliverBatch(ms []*consumer.Message) {
	for _, m := range ms {
		c.Deliver(m)
	}
}

func (c *collector) Deliver(m *consumer.Message) {
	c.mu.Lock()
	c.seen[string(m.Value)]++
	c.byPart[m.Partition.ID] = append(c.byPart[m.Partition.ID], m.Offset)
	c.mu.Unlock()
	if c.onMsg != nil {
		c.onMsg(m)
	}
	if c.commit {
		_ = c.src.Commit(context.Background(), m.Partition, m.Offset+1)
	}
	c.poke()
}

func (c *collector) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitFor polls cond (under c.mu) until it holds or ctx ends.
func (c *collector) waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-c.changed:
		case <-tick.C:
		}
	}
}

// committed reads group's committed offsets for topic.
func committed(t testing.TB, addrs []string, group, topic string, parts int) map[int]int64 {
	t.Helper()
	cl := &kafkago.Client{Addr: kafkago.TCP(addrs...)}
	req := &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: nil}}
	for p := 0; p < parts; p++ {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	resp, err := cl.OffsetFetch(testCtx(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// produceBatches produces msgs to topic in batches of n (the last may be
// shorter): record batches of a known size, for tests of fetch bounds.
func produceBatches(t testing.TB, addrs []string, topic string, n int, msgs []kafkago.Message) {
	t.Helper()
	for i := 0; i < len(msgs); i += n {
		produce(t, addrs, topic, msgs[i:min(i+n, len(msgs))]...)
	}
}

// seededGroup starts a cluster with a one-partition topic holding ms,
// produced in batches of batch, and returns a GroupSource of a new group on
// it (groupOpts with opts), the cluster and the topic.
func seededGroup(t *testing.T, prefix string, batch int, ms []kafkago.Message, opts ...SourceOption) (*GroupSource, *kafkatest.Cluster, string) {
	t.Helper()
	topic := uniq(prefix)
	c := startCluster(t, kfake.SeedTopics(1, topic))
	produceBatches(t, c.Addrs(), topic, batch, ms)
	src, err := NewGroupSource(c.Addrs(), topic, uniq("g"), groupOpts(opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return src, c, topic
}

// numbered returns n messages of key (none if empty), valued v-0000 on.
func numbered(n int, key string) []kafkago.Message {
	out := make([]kafkago.Message, n)
	for i := range out {
		if key != "" {
			out[i].Key = []byte(key)
		}
		out[i].Value = []byte(fmt.Sprintf("v-%04d", i))
	}
	return out
}

func msgs(prefix string, partitions, perPartition int) []kafkago.Message {
	var out []kafkago.Message
	for i := 0; i < perPartition; i++ {
		for p := 0; p < partitions; p++ {
			out = append(out, kafkago.Message{
				Partition: p,
				Key:       []byte(fmt.Sprintf("tenant-%d", i%3)),
				Value:     []byte(fmt.Sprintf("%s-%d-%d", prefix, p, i)),
			})
		}
	}
	return out
}

// eventually polls cond every 20ms until it holds or ctx ends.
func eventually(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}
