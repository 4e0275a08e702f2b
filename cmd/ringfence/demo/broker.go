package demo

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

// Broker is one message system the demo runs on. Each run of the scenario
// gets a fresh Topic from it.
type Broker interface {
	// Name is "kafka", "nats" or "memory".
	Name() string
	// Where says where the broker runs: "child process" (the default for
	// kafka and nats, so that the demo process's heap is the consumer's),
	// "external" (--kafka, --nats) or "in-process" (memory).
	Where() string
	// PartitionOf is the partition the producer puts tenant's messages on
	// among n (the same for the whole run), and false when the broker does
	// not key messages onto partitions (NATS: one stream, one consumer).
	PartitionOf(tenant string, n int) (int, bool)
	// Open creates a fresh topic (Kafka) or stream (NATS) for one run, with
	// the given number of partitions where the broker has them.
	Open(ctx context.Context, run string, partitions int) (Topic, error)
	// Close stops an in-process or child broker and closes connections.
	Close() error
}

// spillTopic is a Topic whose broker gives the engine a spill log for a
// group (consumer.Config.Spill).
type spillTopic interface {
	SpillLog(group string) (consumer.SpillLog, error)
}

// Topic is one run's topic or stream.
type Topic interface {
	// Produce writes msgs and returns once the broker has them; messages of
	// one tenant keep their order.
	Produce(ctx context.Context, msgs []Msg) error
	// Source returns a new consumer.Source reading the topic as group;
	// tenant is the engine's tenant function (sources that track tenants
	// themselves need it), and oneTenant says that it maps every message to
	// one key (the Shared mode). A second Source of the same group starts
	// where the first one's commits (acks) left off.
	Source(group string, tenant consumer.TenantFunc, oneTenant bool) (consumer.Source, error)
	// Tenant is the broker's natural tenant function (Kafka: the message
	// key; NATS: a subject token).
	Tenant() consumer.TenantFunc
	// Sink receives the engine's dead letters.
	Sink() dlq.Sink
	// DeadLetters reads back every dead letter written for the given engine
	// tenant keys.
	DeadLetters(ctx context.Context, tenants []string) ([]dlq.Record, error)
	// Lag reads the group's commit lag from the broker, per partition:
	// Kafka, log end offset minus committed offset; NATS, the consumer's
	// NumPending + NumAckPending (not yet delivered, and delivered but not
	// acknowledged).
	Lag(ctx context.Context, group string) ([]int64, error)
	// RedeliveryAfter is how long the broker may take to hand a message
	// that a stopped consumer held, unsettled, to a new consumer of the
	// group (NATS: the AckWait; Kafka: the session timeout of a member that
	// did not leave cleanly). The restart read-back waits at least this
	// long before it calls anything lost.
	RedeliveryAfter() time.Duration
	// Close releases the topic's clients.
	Close() error
}

// Msg is one message to produce.
type Msg struct {
	Tenant string
	Value  []byte
}

// hashPartition is the partition kafka-go's Hash balancer (the demo's
// Kafka producer, and Sarama's default) gives key among n: FNV-1a, taken
// as a signed 32-bit number, modulo n, made positive.
func hashPartition(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	p := int32(h.Sum32()) % int32(n)
	if p < 0 {
		p = -p
	}
	return int(p)
}

// memBroker is the in-memory stand-in, for tests and --broker memory.
type memBroker struct{}

func (memBroker) Name() string  { return "memory" }
func (memBroker) Where() string { return "in-process" }
func (memBroker) Close() error  { return nil }

// PartitionOf is where memTopic.Produce puts tenant: as Kafka's producer.
func (memBroker) PartitionOf(tenant string, n int) (int, bool) { return hashPartition(tenant, n), true }

func (memBroker) Open(_ context.Context, run string, partitions int) (Topic, error) {
	return &memTopic{b: consumertest.NewBroker(run, partitions), s: consumertest.NewSink(), parts: partitions, ends: make([]int64, partitions)}, nil
}

type memTopic struct {
	b     *consumertest.Broker
	s     *consumertest.Sink
	parts int
	mu    sync.Mutex
	ends  []int64 // log end offset per partition; mu
}

func (t *memTopic) Produce(_ context.Context, msgs []Msg) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		p := hashPartition(m.Tenant, t.parts)
		t.ends[p] = t.b.Append(p, []byte(m.Tenant), m.Value) + 1
	}
	return nil
}

func (t *memTopic) Source(group string, _ consumer.TenantFunc, _ bool) (consumer.Source, error) {
	return t.b.Source(group), nil
}
func (t *memTopic) Tenant() consumer.TenantFunc { return consumer.FromKey() }
func (t *memTopic) Sink() dlq.Sink              { return t.s }
func (t *memTopic) Close() error                { return nil }

// RedeliveryAfter: a new Source starts at the committed offsets at once.
func (t *memTopic) RedeliveryAfter() time.Duration { return 0 }

func (t *memTopic) DeadLetters(_ context.Context, tenants []string) ([]dlq.Record, error) {
	var out []dlq.Record
	for _, k := range tenants {
		out = append(out, t.s.Records(k, false)...)
	}
	return out, nil
}

func (t *memTopic) Lag(_ context.Context, group string) ([]int64, error) {
	t.mu.Lock()
	ends := append([]int64(nil), t.ends...)
	t.mu.Unlock()
	out := make([]int64, t.parts)
	for p := range out {
		out[p] = max(ends[p]-t.b.Committed(group, p), 0)
	}
	return out, nil
}
