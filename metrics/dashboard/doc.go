// Package dashboard builds ringfence's Grafana dashboard from the metrics
// package's series.
//
// [Build] returns the dashboard (per-tenant time lag, dwell quantiles,
// parked and spilling tenants, dead letters per minute, partition time lag
// and commit lag, paused partitions, handler calls in flight, breaker
// states); ringfence.json beside this file is its JSON, ready to import
// into Grafana (Dashboards > New > Import). The dashboard asks for a
// Prometheus data source and offers job and tenant filters.
//
// ringfence.json is generated: after changing Build, run
//
//	go generate ./metrics/dashboard
//
// and commit the file. A test fails while the two differ, and the metrics
// package's tests check that every query parses as PromQL and names only
// series the collector exports.
package dashboard

//go:generate go test -run TestGoldenJSON -update .
