// Package kafka connects ringfence to Apache Kafka through
// github.com/segmentio/kafka-go.
//
// # Source
//
// Source is a consumer.Source over a consumer group. kafka-go's group Reader
// merges every partition into one queue and commits only the highest offset
// it was given, so it can neither pause one partition nor leave a parked
// message uncommitted. Source is built on the lower-level ConsumerGroup and
// Generation API instead: each assigned partition is fetched by its own
// goroutine on its own connection (Pause stops that one only), and a single
// committer per generation commits the engine's watermarks (the lowest
// unsettled offset of each partition) every CommitInterval, on revocation
// and on shutdown.
//
// A rebalance ends the generation: the source reports every partition as
// revoked (the engine drops its buffered and parked messages, which the new
// owner reads again from the committed offset) and joins the next one. A
// broker restart ends the generation too; the fetchers reconnect with
// backoff and resume from the committed offset.
//
// # Dead letters
//
// Sink writes dead-letter records to a topic per tenant,
// dlq.KafkaTopic(source, tenant) = "<source>.dlq.<token>", created on first
// use, or to one shared topic keyed by tenant (SinkSharedTopic). It returns
// only once every in-sync replica acknowledged the record.
//
// Inspector lists, peeks, replays and purges them. kafka-go has no
// DeleteRecords call, so removing a record from a DLQ advances a committed
// cursor instead: the offsets of the consumer group "ringfence-dlq"
// (DefaultCursorGroup) on the DLQ topic. Counts and peeks start at the
// cursor. Replay republishes a record to its source topic (with its redrive
// count raised) and advances the cursor only after the republish was
// acknowledged, so a crash mid-replay may duplicate a message, never lose
// one. Purge advances the cursor; with DeleteDrained it also deletes a
// drained per-tenant topic.
//
// On a shared DLQ topic (SinkSharedTopic) each tenant has its own cursor
// group, "ringfence-dlq.<token>", so replaying or purging one tenant never
// hides another's records.
//
// # Scaling out
//
// Run more processes with the same group. Tenant state is local to a
// process; with tenant-keyed partitioning each tenant's messages reach one
// owner at a time.
package kafka
