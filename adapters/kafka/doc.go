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
//	timeouts; an inconsistent group protocol (another member's deployment)
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
// use, or to one shared topic keyed by tenant (SinkSharedTopic). It returns
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
// (DefaultCursorGroup) on the DLQ topic. Counts and peeks start at the
// cursor. Replay republishes a dead letter to its source topic (with its
// redrive count raised, unless that would push a message at the topic's
// limit over it) and advances the cursor only after the republish was
// acknowledged, so a crash mid-replay may duplicate a message, never lose
// one. Purge advances the cursor; with DeleteDrained it also deletes a
// drained per-tenant topic. The inspector reads with kafka-go's
// Client.Fetch, which keeps a null header value apart from an empty one.
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
