package consumer

import (
	"context"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// Header is a message header.
type Header = dlq.Header

// Message is one message from a source. The engine never stores a context on
// it; handlers receive ctx as a parameter.
type Message struct {
	Key     []byte
	Value   []byte
	Headers []Header
	// Topic is the Kafka topic or the NATS subject.
	Topic string
	// Partition is where the message came from (see Partition).
	Partition Partition
	// Offset is the Kafka offset or the JetStream stream sequence. Within one
	// partition, offsets of delivered messages strictly increase.
	Offset int64
	// Stream is the JetStream stream name (Offset is then its sequence);
	// empty for Kafka.
	Stream string
	Time   time.Time

	// Handle is the adapter's own reference (e.g. a jetstream.Msg). The
	// engine never reads it; the adapter uses it in Settle.
	Handle any

	seq uint64   // engine's delivery sequence within the partition
	gen uint64   // partition assignment generation at delivery
	st  msgState // engine bookkeeping
}

// Header returns the value of the first header named key, and whether there
// was one.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := range m.Headers {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Partition identifies an ordered stream of messages within a source: a
// Kafka topic partition, or for NATS the consumer (ID 0) or a shard of it.
// Backpressure and commits are per partition.
type Partition struct {
	Topic string
	ID    int32
}

// Source is what an adapter implements to feed the engine. The engine calls
// Run once; the other methods may be called from any goroutine while Run is
// running (and Settle/Commit also shortly after it returned, while the engine
// drains).
type Source interface {
	// Run fetches messages and hands them to d until ctx is cancelled or a
	// fatal error occurs. It reports each partition with d.Assigned before
	// its first message and with d.Revoked when it is taken away. Messages of
	// one partition must be delivered in offset order.
	Run(ctx context.Context, d Dispatcher) error

	// Settle is called exactly once per delivered message that was handled,
	// or whose dead-letter record was durably written. The adapter acks it
	// (NATS) or does nothing (Kafka, which commits by watermark).
	Settle(ctx context.Context, m *Message) error

	// Commit says that every message of p with offset below next is settled.
	// It is called whenever p's watermark advances (the adapter may batch).
	Commit(ctx context.Context, p Partition, next int64) error

	// Pause asks the source to stop fetching p (backpressure); messages
	// already fetched may still be delivered. Resume undoes it. A partition
	// revoked while paused is resumed by the engine before Revoked returns,
	// so it starts unpaused when it is assigned again.
	Pause(p Partition)
	Resume(p Partition)
}

// Dispatcher receives messages and partition events from a Source. It is
// safe for concurrent use and never blocks on handler work.
type Dispatcher interface {
	// Assigned announces a partition before its first message.
	Assigned(p Partition)
	// Revoked drops the partition's buffered and parked messages (they will
	// be redelivered to the new owner) and resets its commit tracking.
	// Outcomes of its in-flight messages are ignored. After Revoked returns
	// the engine makes no further Settle or Commit call for p until it is
	// assigned again.
	Revoked(p Partition)
	// Deliver hands a message to the engine. It does not block; when bounds
	// are reached the engine calls Source.Pause for that partition.
	Deliver(m *Message)
}
