// Package metrics exports a consumer engine's per-tenant state to
// Prometheus.
//
// [NewCollector] returns a prometheus.Collector that reads
// (*consumer.Consumer).Stats at scrape time: per-tenant series (messages
// handled, failed attempts, dead letters, parked and queued messages,
// breaker state, whether its DLQ refuses its dead letters and how many
// writes it refused) for the tenants the engine tracks, and engine-wide
// totals. Nothing is counted on the message path; a scrape costs one Stats
// snapshot.
//
// # Cardinality
//
// Per-tenant series are bounded twice: by the engine, which tracks only
// tenants with messages in flight plus a bounded set of recently idle ones
// (and whose guards live in a bounded scope), and by WithMaxTenants
// (default 1024, the scope's default MaxKeys), past which the tenants most
// worth watching are kept (open breaker first, then a DLQ that refuses
// writes, then most parked, then most queued, then by key) and the rest appear only in the totals. A tenant
// the engine forgets drops its series; its counters start again from zero
// if it comes back, which Prometheus' rate() treats as a counter reset.
//
// The tenant label is dlq.TenantToken(key): the same name the tenant's
// dead-letter topic or subject uses, readable for common ids and valid
// UTF-8 whatever bytes the key holds.
package metrics
