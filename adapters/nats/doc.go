// Package nats is ringfence's NATS JetStream adapter, on nats.go's
// jetstream package: a Source that feeds the consumer engine from a durable
// pull consumer, and a DLQ that implements dlq.Sink and dlq.Inspector on a
// JetStream stream.
//
// # Source
//
// NewSource takes a durable pull consumer with explicit acks. Messages are
// fetched with jetstream.Consumer.Consume and handed to the engine on one
// partition, Partition{Topic: "<stream>/<durable>", ID: 0}; Message.Offset
// and Message.Stream are the stream sequence and name, Message.Topic the
// subject, and Handle the jetstream.Msg. The tenant key comes from a
// consumer.TenantFunc: FromSubjectToken(i) for a subject token, or
// consumer.FromHeader for a header.
//
// Settle acks the message (a plain Ack by default: an ack lost in transit
// means a redelivery, never a loss; WithDoubleAck waits for the server's
// confirmation). The engine calls Settle after the handler succeeded or the
// dead letter's PubAck, so nothing is acked that is not done. Commit does
// nothing: JetStream has no offsets to commit.
//
// While the engine holds a message (queued in a lane, running, or parked),
// the Source sends InProgress for it every third of the consumer's AckWait
// (WithExtendEvery), so it is not redelivered under the engine's feet.
// Anything unsettled when the process dies is redelivered by the server
// after AckWait. A redelivery can arrive after later messages, so across a
// crash a tenant's order is as loose as JetStream's own.
//
// # Parking without stalling the consumer
//
// A message the engine parks is unacknowledged, so it holds one of the
// consumer's MaxAckPending slots, and so would a NakWithDelay'd one. One
// parked tenant with a backlog larger than MaxAckPending would take every
// slot and stop all tenants. The Source prevents that with a per-tenant
// limit L (WithTenantLimit; default MaxAckPending/16):
//
//   - A tenant that holds L unsettled messages and has settled none of them
//     for WithSpillAfter (default 250ms), that is, a parked or stuck tenant,
//     is not handed more. A busy tenant that keeps settling may go past L,
//     up to 4L, so that a slow-but-healthy tenant does not pay for spilling.
//   - The tenant's next messages are spilled: republished to the tenant's
//     subject "<prefix>.<token>" in a side "park" stream (file storage,
//     created if missing; WithParkStream), and acked only after the park
//     stream's PubAck. A spilled message is durable before its slot is
//     freed (at-least-once: a crash in between leaves a duplicate, not a
//     gap).
//   - Once a tenant has spilled, all its later messages spill too, so its
//     order is kept. When it has nothing left in flight from the consumer,
//     its spilled messages are re-fed, oldest first and at most L at a time,
//     on a partition of its own, "<stream>/<durable>/park/<token>", with
//     their original subject, headers and stream sequence (Offset); settled
//     ones are purged from the park stream in batches (by subject, below
//     the oldest unsettled one). When the park subject is empty the
//     partition is revoked and the tenant flows directly again.
//   - Each spill carries a Nats-Msg-Id made of stream, durable and
//     sequence, so the park stream drops a second copy of the same message
//     (a retried publish, or a redelivery after a lost ack) within its
//     duplicate window.
//   - Spilled messages survive restarts: a new Source finds the tenants with
//     messages in the park stream and re-feeds them.
//
// The bound: a parked tenant holds at most L slots once it has been stuck
// for SpillAfter, and never more than 4L; with WithSpillAfter(0), exactly
// L. k tenants parked at once hold at most k*4L (k*L) slots and the rest of
// the consumer keeps the remainder of MaxAckPending: with the defaults, 3
// (15) parked tenants still leave the others a quarter (a sixteenth) of the
// slots. Re-feeding costs a read per message, so a spilled tenant drains at
// a few thousand messages a second; one whose arrival rate is higher stays
// in spill mode until its rate drops. Keep L
// at or below the engine's MaxParkedPerTenant so the engine does not pause
// the whole consumer on one tenant's account (with one partition, a pause
// stops everyone). Redeliveries of messages the engine still holds are
// dropped by sequence, so the engine never sees one message twice at once;
// other redeliveries may carry a lower Offset than messages before them,
// which the engine's watermark allows (and Commit ignores). Stats reports
// what the Source holds, spills and re-feeds.
//
// Pause blocks the consume callback (messages nats.go already buffered wait
// in the client and are not extended; if a pause outlasts AckWait they are
// redelivered later); Pause on a re-feed partition stops re-feeding that
// tenant.
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
// and no redelivery, so a parked or failing message could not be kept. Open
// and NewDLQ return an error wrapping ErrCoreNATS when the server has no
// JetStream.
package nats
