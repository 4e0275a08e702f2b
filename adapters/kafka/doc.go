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
// goroutine over its own connection to the partition's leader (Pause stops
// that one only, and a long poll of one partition holds up no other), and a
// single committer per generation commits the engine's watermarks (the
// lowest unsettled offset of each partition) every CommitInterval, on
// revocation and on shutdown.
//
// The fetch path is the package's own, not kafka-go's: a partition's
// fetcher finds the leader with a Metadata request (which never creates the
// topic), connects as the WithDialer Dialer does (its DialFunc or net
// settings, Resolver, TLS, ClientID and SASL mechanism), and sends Fetch
// requests (the highest version from 4 to 11 the broker supports, reading
// uncommitted) encoded with franz-go's kmsg. It decodes the record batches
// itself: message format v2 (Kafka 0.11 and later; a topic still holding
// the legacy v0/v1 format is refused with an error, retried), each batch's
// CRC-32C checked, gzip, snappy, lz4 and zstd decompressed with kafka-go's
// codecs, transaction markers skipped, null keys, values and header values
// kept apart from empty ones. A leader change, a stale leader epoch or a
// dropped connection closes the connection, and the next try (with the
// backoff below) finds the leader again.
//
// Each fetch is handed to the engine with DeliverBatch, in slices of at
// most 64 messages: a fetch of MaxBytes may hold thousands of small
// messages, and once the engine pauses the partition the source stops
// after the slice, so the engine's per-partition bounds hold within one
// slice. The rest of the response stays in the partition's fetch buffer
// (at most MaxBytes a paused partition) and is delivered on Resume before
// the next fetch, so a pause does not make the broker send again what it
// sent (unless the connection is dropped meanwhile; with a queue bound
// smaller than a response, refetching once multiplied the records fetched).
// A slice's messages are copied out of the fetch response into one
// allocation for the messages and one for their bytes (values over 4 KiB
// get their own), so a message the engine keeps for long pins at most its
// slice's small neighbours, never the response.
//
// The source does not know tenants: the engine's consumer.Config.Tenant is
// the one place a tenant key is read (consumer.FromKey, consumer.FromHeader
// or a function of your own).
//
// A rebalance ends the generation: the source reports every partition as
// revoked (the engine drops its buffered and parked messages, which the new
// owner reads again from the committed offset) and joins the next one. A
// broker restart ends the generation too; the fetchers reconnect with
// backoff and resume from the committed offset.
//
// # Errors
//
// Run returns an error, instead of retrying for ever, when the source can
// never work until someone fixes something; the engine's Run then drains
// and returns the same error. Everything else is retried, each failure
// logged at Warn:
//
//	terminal (Run returns at once)         error wraps
//	SASL authentication failed             kafka-go SASLAuthenticationFailed
//	SASL mechanism unsupported / illegal   UnsupportedSASLMechanism, IllegalSASLState
//	no ACL for the topic                   TopicAuthorizationFailed
//	no ACL for the group                   GroupAuthorizationFailed
//	no ACL for the cluster                 ClusterAuthorizationFailed
//	group id refused                       InvalidGroupId
//	session timeout outside broker limits  InvalidSessionTimeout
//	topic name refused                     InvalidTopic
//
//	terminal after a grace                 error wraps
//	topic unknown for UnknownTopicTimeout  ErrUnknownTopic, UnknownTopicOrPartition
//
//	transient (retried, logged at Warn)
//	no broker reachable, however long; a broker restarting; coordinator
//	not available or moved; rebalance in progress; leader election; request
//	timeouts; an inconsistent group protocol (another member's deployment);
//	a record batch that cannot be decoded (a bad CRC, the legacy message
//	format): its partition stops there, retrying every 5s
//
// A broker outage is never terminal: the source keeps trying to join the
// group (every JoinBackoff) and to reach each partition leader (backoff
// from 100ms to 5s), so a restarted cluster is picked up again.
//
// An unknown topic is not terminal at once, because a topic may be
// auto-created or created by a deployment after the consumer starts: Run
// gives up only once the topic was reported unknown, with no sighting of it
// in between, for WithUnknownTopicTimeout (default 1 minute). It then
// returns within 5s more: fetchers retry at least every 5s, and a member
// that the group gave no partition checks the topic every quarter of the
// timeout (at most 5s). Such a member also notices a topic created after
// the group leader looked for it (the topic has partitions that no member
// was given) and rejoins, so that the group assigns them.
//
// # Dead letters
//
// Sink writes dead-letter records to a topic per tenant,
// dlq.KafkaTopic(source, tenant) = "<source>.dlq.<token>", created on first
// use, or to one shared topic keyed by tenant (DLQSharedTopic). It returns
// only once every in-sync replica acknowledged the record.
//
// A message the broker accepted can be dead-lettered. On a DLQ topic's
// first use the sink reads the source topic's max.message.bytes (falling
// back to the broker's message.max.bytes) with DescribeConfigs and creates
// the DLQ topic with twice that plus 64 KiB: room for the ringfence-
// headers and a tenant key as long as the message itself. Each dead letter
// is produced in a request of its own, sized exactly; one that still does
// not fit (an older or hand-made DLQ topic) raises the topic's
// max.message.bytes. Write fails with an error wrapping dlq.ErrUnwritable
// only when the broker refuses to raise it, or the record exceeds what a
// produce request may carry (100 MiB).
//
// A DLQ topic is created (with a single-flight per topic name, and no lock
// shared with other topics, so one slow creation stalls no other tenant)
// and then marked: a record with the header ringfence-marker: dlq is
// written into each of its partitions, so it is known as a DLQ before it
// holds a dead letter. (Kafka topics take no custom configuration, so the
// mark is a record.)
//
// Inspector lists, peeks, replays and purges them. kafka-go has no
// DeleteRecords call, so removing a record from a DLQ advances a committed
// cursor instead: the offsets of the consumer group "ringfence-dlq"
// (DefaultDLQCursorGroup) on the DLQ topic. Counts and peeks start at the
// cursor. Replay republishes a dead letter to its source topic (with its
// redrive count raised, unless that would push a message at the topic's
// limit over it) and advances the cursor only after the republish was
// acknowledged, so a crash mid-replay may duplicate a message, never lose
// one. Purge advances the cursor; with DLQDeleteDrained it also deletes a
// drained per-tenant topic. The inspector reads with the source's record
// decoder, which keeps a null header value apart from an empty one.
//
// Copies of one dead letter (same source topic, partition and offset) are
// shown, counted and replayed once. The cursor can only pass a prefix of
// the log, so after Replay or Purge the inspector writes a record with
// ringfence-marker: moved listing the dead letters it moved; their copies
// further on (and copies written later) stay hidden while the marker is
// past the cursor.
//
// The inspector only reads topics that are DLQs: every record it reads,
// and the first record of each partition, must carry ringfence- headers (a
// dead letter or a marker). This accepts DLQ topics made by older
// versions, which have no marker but only dead letters, and refuses a topic
// of live data that happens to be named "<source>.dlq.<token>", with an
// error wrapping dlq.ErrNotDLQ, before anything is changed.
//
// On a shared DLQ topic (DLQSharedTopic) each tenant has its own cursor
// group, "ringfence-dlq.<token>", so replaying or purging one tenant never
// hides another's records.
//
// # Spill
//
// SpillLog is the consumer.SpillLog of Kafka. When a tenant cannot make
// progress (its breaker stays open past its parked bound, a message of it
// holds the partition's commit for StuckAfter, its backlog passes its share
// of the partition), the engine appends its messages to the tenant's spill
// topic and settles the originals only once every in-sync replica
// acknowledged them, so the source partition's commit moves on and the
// tenant's partition-mates never wait. Once the tenant recovers the engine
// reads the spill topic back, oldest first, before the tenant's live
// messages, and commits the spill cursor past what it settled.
//
// The spill topic of tenant T for source S is SpillTopic(S, T) =
// "S.spill.<token>", the token being dlq.TenantToken(T), the DLQ topics'
// tenant-safe token: a key made of [A-Za-z0-9-] is its own token, every
// other byte is escaped as _hh, and a key whose token would pass 180
// characters is hashed (its records then carry the full key in
// ringfence-spill-tenant). Source topics longer than MaxSpillSourceLen (62)
// are refused, so that every token fits. A spill topic has the source's
// partition count: the lane of T in source partition p is partition p, and
// whoever owns source partition p owns its lanes. It is created on its
// first spill (single-flight per topic, no lock shared between tenants)
// with the source's partition count and replication factor,
// max.message.bytes twice the source's plus 64 KiB (the message plus the
// ringfence-spill- headers, which may hold a tenant key as long as the
// message), cleanup.policy=delete (a compacted spill topic would keep one
// record per key) and the source's retention.ms (SpillRetention). An
// existing spill topic keeps its settings; one with fewer partitions than
// the source is grown; a record that does not fit raises its
// max.message.bytes.
//
// A spill record is the original's key, value and headers byte for byte
// (null and empty header values apart) followed by ringfence-spill-
// headers: the original's topic, partition, offset and time, the consumer
// group, the full tenant key for a hashed token, a dedupe id
// "<topic>/<partition>/<offset>", and the count of the original's headers
// (SpillHeaderCount, last), so that an original header that happens to
// start with ringfence-spill- survives too. Its Kafka timestamp is the
// time of the spill, so retention counts from then. Append sends a batch
// in as few produce requests as the topic's limit allows (one record batch
// each, sized exactly: no kafka-go Writer and its 1 MiB BatchBytes) with
// acks=all.
//
// The cursor of a lane is the committed offset, on partition p of the
// spill topic, of the consumer group "<group>.ringfence-spill"
// (DefaultSpillGroupSuffix; SpillCursorGroup to choose another), committed
// outside any generation; no member ever joins that group. Two consumer
// groups reading one source share its spill topics: each writes its group
// into its records, reads back only its own, and keeps its own cursor.
//
// Read fetches from a position (from the cursor when asked for the oldest
// entry) and never waits at the log's end. Records that are not this
// group's spill records are passed over; at the cursor, the cursor is moved
// past them. A Read that passed over them for 5s without finding one of
// its own returns an error, and the next Read goes on from there. A fetch returns whole record batches (an Append's, up to 256
// records) while the engine reads a window at a time, so what a Read
// fetched beyond its window is kept for the next Read of that lane, within
// SpillReadAhead bytes across lanes (8 MiB). Pending, called when a
// partition is assigned, lists the cluster's topics once (asking a broker
// directly: kafka-go's metadata cache, refreshed every 6s, may not know a
// spill topic another process made a moment ago), then reads every spill
// topic's cursor in one OffsetFetch and its bounds with ListOffsets (64
// partitions per call: kafka-go sends a request per partition, each on a
// pooled connection).
//
// What it costs. kafka-go has no DeleteRecords, so a Commit removes
// nothing: a spilled record stays on the broker's disk until retention
// deletes its segment, re-fed or not. A tenant that spills R bytes a second
// holds up to R x retention.ms of disk, times the replication factor. Every
// tenant that ever spilled keeps a topic (with the source's partition
// count), and Pending's topic listing grows with the cluster's topics.
//
// How it is bounded. Disk per spill topic is bounded by its retention.ms;
// the default, the source's, lets a spilled message live at least as long
// as the source would have kept it unconsumed (its clock restarts at the
// spill). A message that is not re-fed within retention is gone: set
// SpillRetention to outlast your longest outage; Read logs at Error level,
// and SpillStats.Lost counts, a cursor found below the log start. Topics
// are bounded by the tenants that spill. The package never deletes a spill
// topic: a consumer could append to it between the check that it is
// drained and the deletion, and it would have settled the originals
// already. Delete drained spill topics (Backlog reports them, Total 0)
// while no consumer of the source runs. Memory is bounded by
// SpillReadAhead plus one fetch (SpillFetchBytes, 1 MiB) per concurrent
// Read.
//
// # Scaling out
//
// Run more processes with the same group. Tenant state is local to a
// process; with tenant-keyed partitioning each tenant's messages reach one
// owner at a time.
package kafka
