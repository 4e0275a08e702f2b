// Package nats is ringfence's NATS JetStream adapter, on nats.go's
// jetstream package: a Source that feeds the consumer engine from a durable
// pull consumer, a SpillLog the engine spills stuck tenants to, and a DLQ
// that implements dlq.Sink and dlq.Inspector on a JetStream stream.
//
// # Source
//
// NewSource (or Open) takes a durable pull consumer with explicit acks.
// Messages are fetched with jetstream.Consumer.Consume and handed to the
// engine on one partition, Partition{Topic: "<stream>/<durable>", ID: 0};
// Message.Offset and Message.Stream are the stream sequence and name,
// Message.Topic the subject, and Handle the jetstream.Msg. The tenant key
// is given once, to the engine (consumer.Config.Tenant):
// FromSubjectToken(i) for a subject token, or consumer.FromHeader for a
// header.
//
// Settle acks the message (a plain Ack by default: an ack lost in transit
// means a redelivery, never a loss; WithDoubleAck waits for the server's
// confirmation). The engine calls Settle after the handler succeeded, the
// dead letter's PubAck, or the spill record's PubAck, so nothing is acked
// that is not done or safe elsewhere. While Run runs, plain acks are sent
// in bursts: Settle queues the ack and one goroutine sends what is queued
// back to back within a millisecond (acks sent one by one as each handler
// returns contend with the server's delivery loop on its consumer lock);
// SourceStats.AcksQueued counts them. Commit does nothing: JetStream has
// no offsets to commit.
//
// While the engine holds a message (queued in a lane, running, parked, or
// waiting to be spilled), the Source sends InProgress for it every third of
// the consumer's AckWait (WithExtendEvery), so it is not redelivered under
// the engine's feet; a redelivery of a message the engine still holds is
// dropped by sequence. Anything unsettled when the process dies is
// redelivered by the server after AckWait. A redelivery can arrive after
// later messages, so across a crash a tenant's order is as loose as
// JetStream's own.
//
// The server stops delivering once MaxAckPending messages are unsettled,
// for every tenant at once. The Source reports that window to the engine
// (consumer.PartitionCapacity), which keeps its partition bound below it:
// a tenant that cannot make progress spills before the window fills. Pause
// blocks the consume callback (messages nats.go already buffered wait in
// the client and are not extended; if a pause outlasts AckWait they are
// redelivered later).
//
// # Spilling
//
// With one partition per consumer, a tenant whose messages pile up in the
// engine would hold the whole consumer. The engine spills such a tenant
// (see consumer.SpillLog): its messages go, in order, to a durable side log
// and the originals are acked only once the log acknowledged them. NATS's
// side log is a SpillLog (Source.SpillLog or NewSpillLog), a "spill stream"
// per durable, by default "RINGFENCE_SPILL_<stream>_<durable>" (file
// storage, created if missing; WithSpillStream) with one subject per
// tenant, "ringfence.spill.<stream>.<durable>.<token>", the token of
// dlq.TenantToken. Pass it as consumer.Config.Spill:
//
//	src, _ := nats.Open(ctx, nc, "ORDERS", "billing")
//	spill, _ := src.SpillLog(ctx)
//	c, _ := consumer.New(consumer.Config{Tenant: nats.FromSubjectToken(1), Spill: spill, ...})
//
// A spill record is the original message with ringfence-spill- headers
// (original subject, stream, sequence, time, tenant, the engine's note) and its "Nats-"
// headers renamed so the stream does not act on them; its Nats-Msg-Id,
// made of the tenant token, stream, durable and sequence, makes the stream
// drop a second copy of the same original within its duplicate window. A
// message that does not fit one record, or has bytes a NATS message cannot
// carry exactly, is stored out of line in the object store bucket
// "<spill stream>_BODIES", as a dead letter is, and restored byte for byte.
// Appends of 64 records or more are atomic batches where the server allows
// them (2.12 and later; the server stages each in a store of its own, which
// costs a small batch more than it saves), else one record after the
// other, so what lands is always in order; reads are batched direct gets;
// the engine's commit purges the tenant's subject below the oldest record
// not yet settled. The engine asks the log which tenants have records left
// when the consumer starts, so spilled messages survive restarts and are
// re-fed before the tenant's live ones. See SpillLog for the details and
// SpillStats for its counters; what was spilled and re-fed per tenant is in
// the engine's Stats.
//
// # Scaling out
//
// Several processes bound to one plain durable share every tenant's
// messages: a tenant runs in several engines at once, each with its own
// breaker, and its order holds only within each. To give each tenant's
// messages to one process at a time, partition the stream with a static
// partitioned consumer group (Synadia's pcgroups): the stream's subject
// transform puts partition(n, tenant tokens) first in each subject
// (PartitionTransform), the group's configuration in pcgroups' KV bucket
// gives each member a fixed set of partitions (CreateConsumerGroup), and
// each process joins as a member:
//
//	src, _ := nats.Open(ctx, nc, "ORDERS", "", nats.WithConsumerGroup("billing", "m1"))
//
// Static, not elastic: an elastic group re-maps partitions at run time by
// moving its members' consumers on a work-queue stream, and during a move
// the old and the new member may both hold messages of one partition. A
// static group's mapping never changes while it exists; a change to its
// configuration ends every member's Run with ErrConsumerGroup.
//
// The member's consumer ("<group>-<member>") pins one client (a JetStream
// priority group with the pinned_client policy), so further processes of
// the same member are hot standbys that get nothing. Each partition N is
// its own engine partition, announced (Assigned) when the Source's first
// message under a new pin arrives, and revoked when the server answers
// "pin ID mismatch", when a new pin replaces its own, and when Run ends:
// the Source then naks what the engine held and what the client had
// buffered, in stream order, and unpins itself, so a standby takes over at
// its next pull with those messages first. A process that dies keeps the
// pin for PinnedTTL (twice AckWait from 2s on), while what it held is redelivered
// after AckWait, so the standby normally gets those first too. A handler
// still running when its process steps down may run again, at the same
// time, on the new owner (at-least-once). MaxAckPending is shared evenly by
// the member's partitions (MaxUnsettled). The group's spill log
// (Source.SpillLog) has one subject per partition and tenant, appended and
// re-fed only by the partition's owner. The server pins a client only when
// it has a message for it: an idle member's new owner re-feeds spilled
// lanes once a message for one of its partitions arrives.
//
// A plain durable can be shared the same way without partitions:
// WithPinnedClient (or PinDurable) makes it a pinned priority group, so
// one process works and the others wait. That keeps each tenant's order
// and one breaker per tenant at a time; it gives up parallelism between
// processes, and breaker state starts afresh on the new owner.
//
// # Errors
//
// Run returns an error when the consumer can never deliver again; the
// engine's Run then drains and returns the same error. Everything else is
// retried by nats.go, and logged at Warn:
//
//	terminal                                   error wraps
//	durable consumer deleted                   ErrConsumerGone, jetstream.ErrConsumerDeleted or ErrConsumerNotFound
//	stream deleted                             ErrConsumerGone, jetstream.ErrConsumerDeleted or ErrStreamNotFound
//	JetStream disabled for the account         ErrConsumerGone, jetstream.ErrJetStreamNotEnabledForAccount
//	JetStream reported not enabled             ErrConsumerGone, jetstream.ErrJetStreamNotEnabled
//	connection closed (Close, or reconnect     nats.ErrConnectionClosed
//	attempts used up)
//	pull request refused by the server         jetstream.ErrBadRequest
//
//	transient (retried, logged at Warn)
//	disconnected / reconnecting; server shutdown (a restart); missed
//	heartbeats; no responders; leadership change; timeouts
//
// How long a closed connection takes is the connection's choice: nats.go
// gives up after MaxReconnects attempts (60 by default, 2s apart); pass
// nats.MaxReconnects(-1) to wait for the server for ever. "No responders"
// from the JetStream API stays transient: it is what a server without
// JetStream answers, but also what a leaf node answers while its link to
// the JetStream domain is down, and the two cannot be told apart.
//
// Bounds: a consumer or stream deleted while a pull request waits on the
// server (the normal state) ends Run at once, with the server's "consumer
// deleted". Otherwise (the Source paused and its consume callback blocked,
// or the client reconnecting when it happened) the liveness check finds it:
// every WithLivenessCheck (default 5s) while connected, and right after a
// reconnect, Run asks for the consumer's info, so it returns within the
// interval plus the request's timeout (the interval, at least 1s): 10s
// with the defaults. A closed connection ends Run at once.
//
// # Dead letters
//
// NewDLQ opens (or creates, with file storage) the DLQ stream, by default
// DefaultDLQStream with subjects "ringfence.dlq.>". Each tenant's records go
// to dlq.NATSSubject(prefix, tenant): the token encoding keeps a key with
// '.', '*', '>' or spaces inside one subject token, so no key can reach
// another tenant's subject or a wildcard. Records use the dlq header format;
// the original's "Nats-" headers are stored as "ringfence-nats-h-Nats-..."
// so the DLQ stream does not act on them. Write returns after the PubAck.
//
// A DLQ stream is marked in its metadata (MetaDLQ, with its subject prefix
// MetaPrefix and body bucket MetaBodies). NewDLQ marks the streams it
// creates, and adopts a stream made by an older version (no metadata, its
// first message a ringfence record) by marking it. OpenDLQ, which the CLI
// uses, never creates or changes a stream and refuses, with an error
// wrapping dlq.ErrNotDLQ, a stream that is neither marked nor an older DLQ
// whose every message read is a ringfence record: pointed at a stream of
// live data, it deletes nothing.
//
// Each record with an ID (stream and sequence) is published with the
// Nats-Msg-Id "ringfence-dlq:<token>:<stream>#<sequence>", so a message
// dead-lettered again within the stream's duplicate window (2 minutes by
// default) is stored once. Copies stored further apart are shown, counted,
// replayed and removed as one dead letter.
//
// A record must fit one message: the server's max payload (1 MiB by
// default), the stream's max message size, and JetStream's 64 KiB header
// block. A message at max payload plus the ringfence- headers does not, nor
// does a long tenant key carried twice (as the original's header and as
// ringfence-tenant). Such a record, and one with bytes a NATS message cannot
// carry exactly (a message key from a Kafka source, a header value with CR,
// LF or surrounding spaces, which nats.go rewrites, a header name NATS
// refuses), is stored out of line: its original message (tenant key, key,
// headers, value) as one object in the JetStream object store bucket
// MetaBodies (default "<stream>_BODIES", created on first need), and in the
// stream a record of its ringfence- headers with "ringfence-nats-body:
// <bucket>/<object>". Inspectors restore it byte for byte; replay and purge
// delete the object after the record. Write fails with dlq.ErrUnwritable
// only when even that pointer record does not fit.
//
// The inspector lists tenants from one headers-only read of the stream
// (counting copies once), peeks with GetMsg by sequence, replays by
// republishing to the record's source subject with the redrive count
// raised (left out when the message would no longer fit max payload) and
// deleting every copy by sequence only after the republish's PubAck, and
// purges by subject up to the last record it read.
//
// # Core NATS
//
// Core NATS subscriptions are not supported: they have no acknowledgement
// and no redelivery, so a parked or failing message could not be kept.
// Open, NewSpillLog and NewDLQ return an error wrapping ErrCoreNATS when
// the server has no JetStream.
package nats
