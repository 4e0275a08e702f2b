// Package metrics exports a consumer engine's per-tenant state to
// Prometheus.
//
// [NewCollector] returns a prometheus.Collector that reads
// (*consumer.Consumer).Stats at scrape time: per-tenant series (messages
// handled, failed attempts, dead letters, parked and queued messages,
// breaker state) for the tenants the engine tracks, and engine-wide
// totals. Nothing is counted on the message path; a scrape costs one Stats
// snapshot.
//
// # Cardinality
//
// Per-tenant series are bounded twice: by the engine, which tracks only
// tenants with messages in flight plus a bounded set of recently idle ones
// (and whose guards live in a bounded scope), and by WithMaxTenants
// (default 1024, the scope's default MaxKeys), past which the tenants most
// worth watching are kept (open breaker first, then most parked, then most
// queued, then by key) and the rest appear only in the totals. A tenant
// the engine forgets drops its series; its counters start again from zero
// if it comes back, which Prometheus' rate() treats as a counter reset.
//
// The tenant label is dlq.TenantToken(key): the same name the tenant's
// dead-letter topic or subject uses, readable for common ids and valid
// UTF-8 whatever bytes the key holds.
//
// # Rules and dashboard
//
// rules/ringfence.rules.yml holds Prometheus recording and alerting rules
// over these series (parked and spilling tenants, time lag, a dwell
// objective with burn-rate alerts, dead letters, paused partitions, stuck
// commits); rules/README.md gives their objectives and thresholds. Package
// [github.com/ringfence/ringfence/metrics/dashboard] builds the Grafana
// dashboard committed as dashboard/ringfence.json. The tests check both
// against the series the collector exports and run a real Prometheus.
package metrics
