// Package demo is the engine of `ringfence demo`: it shows the
// noisy-neighbour problem and ringfence's cure on real, in-process brokers.
//
// # Scenario
//
// Traffic for N tenants (20 by default, 25 messages a second each) is
// produced at a steady rate, well under the consumer's capacity; every
// message's handler calls a simulated dependency that answers in 1–2ms. One
// tenant, four times bigger than the others (the noisy neighbour), has its
// dependency go down for a window in the middle of the run (25%–65% of it)
// and come back; another tenant sends a poison message in every 20 (they
// always fail, and are not marked permanent).
//
// The same traffic runs three times on each broker:
//
//   - baseline: per-tenant guards, no outage;
//   - ringfence: per-tenant guards, with the outage: the outage tenant's
//     breaker opens and its messages park, everyone else keeps flowing;
//   - shared: one guard for every message (the tenant function maps all
//     messages to one key), with the outage: what most stacks do. With one
//     key the engine also keeps one ordered lane per partition (Kafka: 4
//     partitions; NATS: one), as a plain partition-ordered consumer does.
//
// The score is the healthy tenants' goodput during the outage window,
// divided by the baseline's; plus the outage tenant's dead letters (a
// transient outage must dead-letter nothing), the poison dead letters, and
// the messages lost (produced, but neither handled nor dead-lettered).
//
// # Brokers
//
// A [Broker] hides what differs between Kafka and NATS: producing, a
// source for a consumer group, a dead-letter sink, and reading the dead
// letters back. The defaults start an in-process Kafka (franz-go kfake) and
// an in-process NATS server with JetStream; --kafka and --nats point the
// demo at real ones. An in-memory broker ("memory") exists for tests.
package demo
