// Package demo is the engine of `ringfence demo`: it shows the
// noisy-neighbour problem and ringfence's cure on real brokers, and it is
// the measuring instrument the engine's isolation is judged with.
//
// # Scenarios
//
// Traffic for N tenants (20 by default, 25 messages a second each) is
// produced at a steady rate, well under the consumer's capacity; every
// message's handler calls a simulated dependency that answers in 1–2ms. On
// Kafka the tenant is the message key, so the producer's key hash puts
// each tenant on one partition for the whole run (20 tenants on 4
// partitions by default); the healthy tenants that share the bad tenant's
// partition are its partition-mates, reported as a group. NATS has one
// stream and one consumer: there every healthy tenant is a partition-mate.
//
// One tenant, four times bigger than the others (the bad tenant), meets a
// fault in a window of the run (--scenario):
//
//   - outage: its dependency fails for 25%–65% of an 8s run; another
//     tenant sends a poison message in every 20. The demo's story, with the
//     shared-breaker comparison.
//   - long-outage: its dependency fails for --outage (5m by default), with
//     10s of traffic before and 20s after.
//   - slow: its calls take 500ms (not failing) for 30s.
//   - hang: its calls block until their ctx is cancelled, for 30s.
//   - hot: it sends 20 times its rate for 60s, every call succeeding.
//   - poison-burst: every message it sends for 30s is poison, which its
//     handler rejects with policy.Permanent; its messages before and after
//     are good.
//   - dlq-outage: the same for 60s, while the DLQ refuses every write (the
//     demo's sink fails them: the brokers also serve the source); the DLQ
//     comes back when the burst ends.
//
// Outage and long-outage run with DemoPolicy (a fast breaker); the others
// with policy.Default(), the consumer's defaults. Each scenario runs twice
// on each broker, on the same traffic (for hot and the poison bursts, the
// same but for the burst): a baseline with no fault, and the
// fault with per-tenant guards ("ringfence"); outage adds a third run with
// one guard for every message ("shared", a consumer with one breaker and
// one ordered lane per partition).
//
// # Figures
//
// Every figure of a run is computed from what it recorded (see timeline),
// and compared with the baseline's:
//
//   - healthy goodput during the fault window (messages first handled in
//     it), for all healthy tenants and for the partition-mates;
//   - p99 end-to-end latency of the healthy messages produced during the
//     fault, from the produce stamp carried in the message value to their
//     first handling, for both groups; and, for the partition-mates, from
//     the message's broker timestamp instead (NATS: when the server stored
//     it; Kafka: the record's timestamp, which the producer's client sets
//     as it encodes the batch), the consumer's part, which leaves out how
//     long a broker loaded by a hot tenant's traffic took to store the
//     message (reported, not checked);
//   - the commit lag, sampled from the broker every 500ms: Kafka, log end
//     offset minus the group's committed offset, per partition; NATS, the
//     durable consumer's NumPending + NumAckPending;
//   - the consumer's heap: the live heap of the demo process (the kafka and
//     nats brokers run in a child process, the same binary, because kfake
//     keeps every message in memory), its peak during the run less its size
//     just before the consumer started;
//   - whether the bad tenant parked (consumer.EventParked), how many of its
//     messages were dead-lettered (read back from the DLQ), and whether its
//     messages were handled in produce order (EventReordered moves left
//     out);
//   - unfinished and lost. After production the run waits Settle (30s)
//     for every message to be handled or dead-lettered: what is not is
//     "unfinished at deadline". It keeps consuming while it makes progress
//     (up to Drain), then stops; a fresh consumer of the same group is
//     started to find what is still unfinished (the restart read-back,
//     waiting at least the broker's redelivery delay), and the DLQs are
//     read back. "Lost" is what neither the run, nor the DLQ, nor the
//     restart has: the table never claims a loss that did not happen.
//
// --check judges a scenario (see Checks): goodput at least 0.95 of the
// baseline for both groups; p99 at most 2x the baseline (slow, hang, hot;
// the partition-mates of long-outage); the bad tenant parked (slow, hang);
// nothing of it dead-lettered (a fault is not the message's fault), in
// order, nothing unfinished after the drain, nothing lost; the long
// outage's commit lag within LongOutageMaxLag; the heap within
// --heap-budget when given. For a poison burst, instead of nothing
// dead-lettered: every poison message dead-lettered within
// BurstDrainBound (10s) of the burst's end, or within DLQReturnBound (15s)
// of the DLQ's return; no good message dead-lettered; and, after a burst
// without a DLQ outage, the bad tenant's own p99 after the burst at most
// 2x the baseline's.
//
// # Brokers
//
// A [Broker] hides what differs between Kafka and NATS: producing, a
// source for a consumer group, a dead-letter sink, reading the dead letters
// and the commit lag back. The defaults start kfake and a nats-server with
// JetStream in a child process; --kafka and --nats point the demo at real
// ones. An in-memory broker ("memory", in-process) exists for tests.
package demo
