// Package integration holds ringfence's end-to-end tests against real
// brokers in Docker containers, started with testcontainers-go, including
// faults: a broker stopped and restarted, a consumer process killed with
// SIGKILL, a DLQ broker paused, a consumer group rebalancing.
//
// # Running
//
//	go test -race -count=1 ./integration/...
//
// Nothing needs exporting: the reaper image cannot be pulled without a
// registry, so internal/brokertest defaults TESTCONTAINERS_RYUK_DISABLED to
// true (every test terminates its own containers) and
// TESTCONTAINERS_HOST_OVERRIDE to 127.0.0.1, unless they are set. Without a reachable
// Docker engine the tests skip with one line; with the CI environment
// variable set they fail instead.
//
// # Images
//
// No registry is needed: the broker images are built locally FROM scratch
// around Go binaries compiled from module sources (see internal/brokerimage):
// a Kafka broker on franz-go's kfake with a data dir (so data survives a
// container restart) and the real NATS server with JetStream. The first run
// compiles and builds them; later runs reuse an image whose binary is
// unchanged. Two environment variables point the suite at other images
// instead, where a registry is reachable:
//
//	RINGFENCE_KAFKA_IMAGE  e.g. apache/kafka:4.1.0 (configured as a one-node KRaft broker)
//	RINGFENCE_NATS_IMAGE   e.g. nats:2.12 (run with -js -sd /data -p 4222)
//
// # Scenarios
//
// Each runs on Kafka and on NATS JetStream unless noted:
//
//   - noisy-neighbour: one tenant's dependency is down for a window; the other
//     tenants keep at least 0.9 of their throughput in the same workload
//     without the fault (both run at once, on two brokers), and the noisy
//     tenant's messages are all handled afterwards, none dead-lettered.
//   - broker-restart: the broker container is stopped and started while a
//     producer and a consumer run; it keeps its data.
//   - consumer-kill: the consumer process is killed with SIGKILL mid-run and
//     a new one started.
//   - dlq-outage: the DLQ lives on a second broker container, paused while
//     poison messages arrive; other tenants keep flowing, and the poison
//     messages land in the DLQ once it is back.
//   - rebalance (Kafka): a second consumer process joins the group mid-run
//     and later leaves it.
//   - scale-out: three consumer processes in one group (Kafka: 12
//     partitions keyed by tenant, with NewGroupSource, and with NewSource
//     too when RINGFENCE_SCALEOUT_ALL=1; NATS: a subject per tenant, partitioned 12 ways for a
//     static partitioned consumer group of three members) over steady
//     traffic of 24 tenants; one tenant's dependency is down for 60s (it
//     parks and spills); during that outage each process is killed with
//     SIGKILL and restarted in turn, then the broker container restarted.
//     Besides lost=0 and nothing dead-lettered: each inversion of a
//     tenant's order among first handlings (and of its source partition's
//     offsets on Kafka) is classified as explained by a redelivery (an
//     earlier delivery of the late message was cut short by a kill, a
//     revocation or the broker's restart, or NATS says it redelivered it),
//     by an EventReordered, or unexplained, which fails; the
//     failing tenant's partition-mates (every other tenant on NATS) keep
//     0.95 of their goodput at the outage's start; and it prints, per
//     partition, the longest pause between two handlings by the same
//     process (a rebalance that did not move the partition).
//   - spill-kill: one tenant's dependency is down (a file the consumers
//     poll) while messages keep arriving, so it spills to its durable spill
//     log (MaxParkedPerTenant 20). The consumer is killed with SIGKILL while
//     spilling; the broker container is restarted while its successor
//     spills; the dependency comes back and that consumer is killed with
//     SIGKILL while re-feeding; a third drains the log. Besides lost=0:
//     nothing of the tenant dead-lettered, and in each source partition its
//     messages first handled in produce order (leaving out what the engine
//     reported as EventReordered and, on NATS, what the server redelivered
//     after a kill, whose order JetStream does not keep).
//   - spilled-verdict-kill: a poison message's dead letter is refused (the
//     DLQ's broker is paused), so its tenant spills once the message has
//     held its partition for StuckAfter (1s). The consumer is killed with
//     SIGKILL once the source has committed past the message, so that only
//     its spill record holds it; with the DLQ back, the next consumer
//     re-feeds it and dead-letters it for the first one's reason and
//     attempts without calling the handler again (its verdict travels in
//     the spill record's note), and handles everything else.
//   - fleet: three consumer processes (Kafka on NewGroupSource; NATS as a
//     partitioned consumer group), each with a fleet.Agent (childConfig.Fleet:
//     heartbeat 250ms, TTL 3s), over steady traffic of 12 tenants, driven by
//     the ringfence binary built once per run: `status --json` shows the three
//     processes and every partition's one owner; `tenant hold` is timed over
//     20 holds, each released again (from the command's start to the tenant's
//     last handling in any process, and to every status showing the control;
//     p50/p99 printed, each asserted under 10s); a hold survives SIGKILL of
//     every process and a broker restart (none of the tenant's messages is
//     handled until `tenant release`, `status` shows the hold and its
//     reason; afterwards every inversion of a tenant's order is explained by
//     a redelivery); a process killed at the end leaves `status` within its
//     TTL.
//
// Consumers are real child processes: the test binary started again with
// RINGFENCE_IT_CHILD set (see TestMain), running the engine with an adapter,
// its spill log, and a handler that records each handled message id, with
// its source partition and offset, in an append-only file. The spill-kill
// and spilled-verdict-kill children also write their Stats to a file the
// test polls, and their spill and reorder events, and their calls of poison
// messages, to another.
//
// # Reconciliation
//
// Each scenario ends by reconciling every produced message id: handled
// (recorded by that idempotent sink) or present in a dead-letter queue (read
// through the adapter's inspector), and prints exactly one line
//
//	reconcile: scenario=NAME broker=kafka|nats produced=N handled=H deadlettered=D lost=L duplicates=X
//
// failing unless lost=0. duplicates counts deliveries of an id past its first
// (at-least-once redeliveries after a kill or a rebalance). go test hides the
// output of passing tests, so the lines are also appended to the file named
// by RINGFENCE_RECONCILE_OUT, when set; so are scale-out's "inversions:",
// "goodput:" and "pauses:" lines, and fleet's "fleet:" lines.
package integration
