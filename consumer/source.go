package consumer

import (
	"context"
	"time"

	"github.com/ringfence/ringfence/dlq"
)

// Header is a message header.
type Header = dlq.Header

// Message is one message from a source. The engine never stores a context on
// it; handlers receive ctx as a parameter. A handler must not keep m after it
// returns: the engine recycles nothing, but a message that is retried is
// handed to the handler again.
type Message struct {
	Key     []byte
	Value   []byte
	Headers []Header
	// Topic is the Kafka topic or the NATS subject.
	Topic string
	// Partition is where the message came from (see Partition).
	Partition Partition
	// Offset is the Kafka offset or the JetStream stream sequence. Within one
	// partition, offsets of delivered messages increase, except for a
	// redelivery a broker makes after later messages (JetStream after
	// AckWait): the engine never takes a lower offset for a copy.
	Offset int64
	// Refed is set on a message read back from its tenant's spill log (see
	// [SpillLog]); Partition and Offset are still the original's, and
	// SpillPos is its position in the spill log. (It sits next to Offset:
	// the engine reads both as it settles each message, one cache line.)
	Refed bool
	// Stream is the JetStream stream name (Offset is then its sequence);
	// empty for Kafka.
	Stream   string
	Time     time.Time
	SpillPos int64

	// Handle is the adapter's own reference (e.g. a jetstream.Msg). The
	// engine never reads it; the adapter uses it in Settle.
	Handle any

	st msgState // engine bookkeeping; see msgState
}

// SpillNote returns the engine's note on m, a message it spills (nil if
// none): what it already knows against the message (a dead-letter verdict
// waiting for the DLQ, or a judge round's evidence), printable ASCII of at
// most [MaxSpillNote] bytes. A [SpillLog] stores it with the message and
// sets it back, byte for byte, on the copy Read returns (SetSpillNote), so
// that the copy is judged on it in whatever process re-feeds it. Opaque to
// everyone else.
func (m *Message) SpillNote() []byte {
	if m.st.noted {
		return m.st.fail.note
	}
	return nil
}

// SetSpillNote sets the note that SpillNote returns; it is for
// [SpillLog.Read], on the messages it returns. The engine reads a note only
// on a message read back from a spill log: on one delivered by a Source it
// is dropped. A note the engine did not write is ignored (the copy is
// judged afresh).
func (m *Message) SetSpillNote(note []byte) {
	if len(note) == 0 {
		m.st.noted = false
		return
	}
	if !m.st.noted && !m.st.traced && !m.st.failSet {
		m.st.fail = new(failState)
	}
	m.st.fail.note, m.st.noted = note, true
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
// Kafka topic partition, or for NATS the consumer (ID 0). Commits,
// backpressure and spill logs are per partition.
type Partition struct {
	Topic string
	ID    int32
}

// Source is what an adapter implements to feed the engine. The engine calls
// Run once; the other methods may be called from any goroutine while Run is
// running (and Settle/Commit also shortly after it returned, while the engine
// drains). The engine never calls a Source method while it holds a lock of
// its own, so a Source may call back into the Dispatcher from any of them.
type Source interface {
	// Run fetches messages and hands them to d until ctx is cancelled or a
	// terminal error occurs, which it returns (the engine then drains and
	// returns it from Consumer.Run). It reports each partition with
	// d.Assigned before its first message and with d.Revoked when it is taken
	// away. Messages of one partition must be delivered in offset order.
	Run(ctx context.Context, d Dispatcher) error

	// Settle is called exactly once per delivered message that was handled,
	// whose dead-letter record was durably written, or whose spill-log copy
	// was acknowledged. The adapter acks it (NATS) or does nothing (Kafka,
	// which commits by watermark). Calls for different messages may run
	// concurrently. The messages of a quick tenant's run (up to 64 handled
	// one after another, about 10 µs in all) are settled together when the
	// run ends. A source whose Settle does nothing may say so with
	// [SettleNooper]; the engine then makes no Settle call at all.
	Settle(ctx context.Context, m *Message) error

	// Commit says that every message of p with offset below next is settled.
	// The engine calls it when p's watermark advances; calls for one
	// partition never overlap and their next values strictly increase.
	Commit(ctx context.Context, p Partition, next int64) error

	// Pause asks the source to stop fetching p (backpressure); messages
	// already fetched may still be delivered. Resume undoes it. Calls for one
	// partition never overlap and alternate. A partition revoked while
	// paused is resumed by the engine before Revoked returns, so it starts
	// unpaused when it is assigned again.
	Pause(p Partition)
	Resume(p Partition)
}

// SettleNooper is an optional interface of a Source whose Settle does
// nothing (Kafka's: a message is settled by the commit of its partition's
// watermark). When SettleIsNoop reports true at Run, the engine never calls
// Settle, which saves a call and the bookkeeping that keeps Settle calls
// from racing a revocation, on every message.
type SettleNooper interface {
	SettleIsNoop() bool
}

// Dispatcher receives messages and partition events from a Source. It is
// safe for concurrent use and never blocks on handler work.
type Dispatcher interface {
	// Assigned announces a partition before its first message. With a
	// SpillLog configured it first asks the log which of the partition's
	// tenants have spilled messages left (SpillLog.Pending), retrying until
	// it knows, so that their order holds across restarts and rebalances.
	Assigned(p Partition)
	// Revoked drops the partition's queued and parked messages (they will
	// be redelivered to the new owner) and resets its commit tracking.
	// Outcomes of its in-flight messages are ignored. After Revoked returns
	// the engine makes no further Settle or Commit call for p, nor any
	// SpillLog call for p's lanes, until it is assigned again: what the
	// engine appended to a spill log is there for the next owner's
	// Pending.
	Revoked(p Partition)
	// Deliver hands a message to the engine. It does not block; when a
	// bound is reached the engine spills the tenant responsible or, when it
	// cannot, calls Source.Pause for that partition.
	Deliver(m *Message)
	// DeliverBatch is Deliver for several messages at once (cheaper: one
	// lock and one wake-up per partition and batch). Messages of one
	// partition must be in offset order, after any delivered before.
	DeliverBatch(ms []*Message)
}

// SpillLane names what one spill log holds: one tenant's messages from one
// source partition.
type SpillLane struct {
	Tenant    string
	Partition Partition
}

// SpillLog is a durable, ordered side log per tenant and source partition,
// implemented by adapters (Kafka: the lanes of a source partition share a
// partition of one spill topic per source; NATS: a subject per tenant in a
// spill stream). When a tenant cannot make progress
// (parked at its in-memory bound, a head message stuck longer than
// Config.StuckAfter, or a backlog beyond its share of the partition), the
// engine appends its messages to its log and settles the originals only once
// the append is acknowledged, so the source partition's commit moves on and
// its other tenants never wait. Once a lane spills, all its later messages
// go to the log until the log is read back to its end; the engine re-feeds
// it oldest first and removes entries (Commit) only after they are settled.
// A crash at any point duplicates, never loses.
//
// The engine never calls a SpillLog method while it holds a lock; calls for
// one lane never overlap. Methods may be called concurrently for different
// lanes.
type SpillLog interface {
	// Append durably appends msgs, all of lane and in order, and returns
	// once the log acknowledged every one (Kafka acks=all, NATS PubAck). On
	// an error none of them counts as appended: the engine appends them
	// all again later. The records that did land despite the error must be
	// a prefix of msgs (an implementation stores them in order, each after
	// the previous one is stored), so that the log keeps the lane's order;
	// the engine drops a re-fed record whose original it re-fed already.
	Append(ctx context.Context, lane SpillLane, msgs []*Message) error

	// Read returns up to max entries of lane's log at positions >= from, in
	// order; fewer, or none, when the log has no more now. from < 0 means
	// from the oldest entry not yet committed. Each message carries the
	// original's Key, Value, Headers, Topic, Stream, Time, Partition,
	// Offset and SpillNote (set with SetSpillNote), with Refed set and
	// SpillPos its position (strictly increasing within the log).
	Read(ctx context.Context, lane SpillLane, from int64, max int) ([]*Message, error)

	// Commit removes lane's entries at positions below next, all settled
	// (Kafka: a committed cursor; NATS: a purge). Calls for one lane carry
	// increasing next values.
	Commit(ctx context.Context, lane SpillLane, next int64) error

	// Pending returns the lanes of source partition p whose logs hold
	// entries not yet committed: what an earlier process (or the previous
	// owner of p) spilled and did not finish.
	Pending(ctx context.Context, p Partition) ([]SpillLane, error)
}

// PartitionCapacity may be implemented by a Source whose broker stops
// delivering once a partition holds a number of unsettled messages (a NATS
// consumer's MaxAckPending). The engine then keeps its per-partition bound
// (Config.MaxQueuedPerPartition) at or below it, so a stuck tenant spills
// before the broker stops the whole partition.
type PartitionCapacity interface {
	MaxUnsettled(p Partition) int
}
