// Package metrics exports a consumer engine's per-tenant state to
// Prometheus.
//
// [NewCollector] returns a prometheus.Collector that reads
// (*consumer.Consumer).Stats at scrape time. Nothing is counted on the
// message path; a scrape costs one Stats snapshot.
//
// # Series
//
// With the default namespace "ringfence":
//
//   - per tenant (label tenant): ringfence_tenant_handled_total,
//     _failed_total, _dead_lettered_total, _spilled_total, _refed_total
//     (counters); _parked, _queued, _breaker_state (0 closed, 1 half-open,
//     2 open), _time_lag_seconds, _oldest_parked_age_seconds,
//     _spill_backlog_age_seconds, _dlq_unavailable (gauges);
//     _dlq_write_failures_total (counter); _dwell_seconds (histogram of
//     produce to settle over consumer.DwellBuckets);
//   - per partition (label partition, "<topic-or-stream>/<n>"):
//     ringfence_partition_time_lag_seconds, _commit_lag (offsets), _paused
//     (0 or 1), _committed_offset;
//   - per engine: ringfence_handled_total, _failed_total,
//     _dead_lettered_total, _retries_total, _panics_total, _parked, _queued,
//     _in_flight, _paused_partitions, _tenants_tracked, _tenants_exported,
//     _scope_keys, _scope_evictions_total, _dlq_write_failures_total,
//     _dlq_unavailable_tenants.
//
// WithConstLabels adds labels to all of them; the collector adds none of
// its own.
//
// # Cardinality
//
// Each tenant metric has at most K+1 series whatever the number of
// tenants: the K tenants most worth watching by name (WithMaxTenants,
// default 20: an open, then half-open breaker first, then a DLQ that
// refuses its dead letters, most parked, spilling, the oldest time lag,
// most queued, then by key) and one series
// labelled [OtherTenant] ("_other") for the rest. In "_other" the counters
// and the dwell histogram are the engine's totals minus the named
// tenants' (so the tenant series add up to the totals, tenants the engine
// forgot included), the gauges of counts are the rest's sum, and the ages
// and the breaker state the rest's maximum. When a tenant joins the named
// set its counts leave "_other", which Prometheus' rate() reads as a
// counter reset; a tenant's own counters start from zero when the engine
// forgot it and it comes back.
//
// The tenant label is dlq.TenantToken(key): the same name the tenant's
// dead-letter topic or subject uses, readable for common ids, valid UTF-8
// whatever bytes the key holds, and never "_other" or "_none" (the
// no-tenant bucket, dlq.NoTenantToken).
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
