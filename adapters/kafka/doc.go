// Package kafka connects ringfence to Apache Kafka: a Source that consumes
// a topic as a member of a consumer group, a DLQ that keeps each tenant's
// dead letters in a topic of its own, and a SpillLog that moves a stuck
// tenant's messages to a side topic shared by the source's tenants so that
// its partition's commit and its partition-mates move on.
//
//	src, err := kafka.NewSource(brokers, "orders", "billing")
//	dead, err := kafka.NewDLQ(brokers, "orders")                 // orders.dlq.<tenant>
//	spill, err := kafka.NewSpillLog(brokers, "orders", "billing") // orders.spill
//	c, err := consumer.New(consumer.Config{
//		Handler: handler,
//		Tenant:  consumer.FromHeader("tenant"),
//		DLQ:     dead,
//		Spill:   spill,
//		Group:   src.Group(),
//	})
//	err = c.Run(ctx, src)
//
// The source does not know tenants: consumer.Config.Tenant is the one
// place a tenant key is read. Group membership, commits and admin requests
// go through github.com/segmentio/kafka-go; records are fetched and decoded
// by the package itself (message format v2, Kafka 0.11 and later), so that
// one partition can be paused while the others flow and a parked message
// holds back its partition's commit, not its consumption. NewGroupSource
// returns the same source with the group run by franz-go's kgo instead,
// with cooperative rebalancing (see "Scaling out"), each partition fetched
// over a kgo client of its own and decoded by kgo; it takes the same
// options.
//
// # Commits
//
// The engine settles a message when its handler succeeded or its dead
// letter was written; the source commits, per partition, the lowest
// unsettled offset, every CommitInterval, on revocation and on shutdown.
// Nothing is lost on a crash: what was not committed is delivered again. A
// revoked partition's watermark is committed before it is given away; the
// engine drops what it buffered of it, which the new owner reads again.
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
// An unknown topic is not terminal at once, because a topic may be created
// by a deployment after the consumer starts (see WithUnknownTopicTimeout).
//
// # Dead letters and spill
//
// A DLQ writes a tenant's dead letters to "<source>.dlq.<token>" (or one
// shared topic), created on first use and sized so that any message the
// source accepted fits, and lists, peeks, replays and purges them; Kafka
// has no DeleteRecords, so removing a dead letter advances a committed
// cursor. A SpillLog appends a stuck tenant's messages to partition p of
// "<source>.spill" (p its source partition), each record naming its
// tenant, and reads them back, oldest first, once the tenant recovers,
// keeping each tenant's cursor in the compacted "<source>.spill-cursors":
// two topics per source whatever the number of tenants. A spilled record
// stays on disk until the topic's retention removes it. The DLQ's token is
// dlq.TenantToken: a key crafted to look like another tenant's never
// reaches that tenant's topic. See DLQ and SpillLog for the details, what
// they cost and how they are bounded.
//
// # Scaling out
//
// Run more processes with the same group. Tenant state is local to a
// process; with tenant-keyed partitioning each tenant's messages reach one
// owner at a time, and a tenant's spill lanes belong to whoever owns their
// source partition.
//
// A Source's group protocol (kafka-go's) is eager: every rebalance revokes
// every partition of every member, and each drops what it held. A
// GroupSource's is cooperative (KIP-429, kgo's cooperative-sticky
// balancer): only the partitions that move are revoked, and the others
// keep flowing, their parked messages and commit tracking kept. The
// members of one group must all be Sources or all GroupSources.
package kafka
