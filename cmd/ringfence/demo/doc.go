// Package demo is the engine of `ringfence demo`: it shows the
// noisy-neighbour problem and ringfence's cure on real, in-process brokers.
//
// # Scenario
//
// Traffic for N tenants (20 by default) is produced at a steady rate, well
// under the consumer's capacity; every message's handler calls a simulated
// dependency that answers in 1–2ms. One tenant's dependency goes down for a
// window in the middle of the run and comes back; another tenant sends a
// few poison messages (they always fail, and are not marked permanent).
//
// The same traffic runs three times on each broker:
//
//   - baseline: per-tenant guards, no outage;
//   - ringfence: per-tenant guards, with the outage: the outage tenant's
//     breaker opens and its messages park, everyone else keeps flowing;
//   - shared: one guard for every message (the tenant function maps all
//     messages to one key), with the outage: what most stacks do.
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
