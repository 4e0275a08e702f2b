package metrics

import (
	"errors"
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// ErrInvalidOption is wrapped by NewCollector's error for a bad option.
var ErrInvalidOption = errors.New("metrics: invalid option")

// Option configures a Collector.
type Option func(*config) error

type config struct {
	namespace  string
	constant   prometheus.Labels
	maxTenants int
}

// WithNamespace sets the metric name prefix. Default: "ringfence".
func WithNamespace(ns string) Option {
	return func(c *config) error {
		if ns == "" {
			return fmt.Errorf("%w: empty namespace", ErrInvalidOption)
		}
		c.namespace = ns
		return nil
	}
}

// WithConstLabels adds labels to every series (e.g. the consumer group, to
// tell several consumers in one process apart). Default: none.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) error {
		for k := range l {
			if k == "tenant" {
				return fmt.Errorf("%w: const label %q is reserved", ErrInvalidOption, k)
			}
		}
		c.constant = l
		return nil
	}
}

// WithMaxTenants caps the tenants exported with their own series per
// scrape. Default: 1024.
func WithMaxTenants(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: max tenants %d is not positive", ErrInvalidOption, n)
		}
		c.maxTenants = n
		return nil
	}
}

// Collector is a prometheus.Collector over one consumer. It is safe for
// concurrent use (scrapes may overlap).
type Collector struct {
	c   *consumer.Consumer
	max int

	// Per tenant.
	handled, failed, dead, parked, queued, state *prometheus.Desc
	dlqDown, dlqFails                            *prometheus.Desc
	// Totals.
	tHandled, tFailed, tDead, tRetried, tPanics            *prometheus.Desc
	tParked, tQueued, tInFlight, tPaused, tTenants, tShown *prometheus.Desc
	tDLQFails, tDLQDown                                    *prometheus.Desc
	scopeKeys, scopeEvictions                              *prometheus.Desc
}

// NewCollector returns a Collector reading c's stats at each scrape.
func NewCollector(c *consumer.Consumer, opts ...Option) (*Collector, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil consumer", ErrInvalidOption)
	}
	cfg := config{namespace: "ringfence", maxTenants: 1024}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	ns, cl := cfg.namespace, cfg.constant
	per := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "tenant", name), help, []string{"tenant"}, cl)
	}
	total := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, nil, cl)
	}
	return &Collector{
		c:   c,
		max: cfg.maxTenants,

		handled:  per("handled_total", "Messages of the tenant handled successfully."),
		failed:   per("failed_total", "Failed handler attempts of the tenant."),
		dead:     per("dead_lettered_total", "Messages of the tenant written to its dead-letter queue."),
		parked:   per("parked", "Messages of the tenant waiting behind its open breaker."),
		queued:   per("queued", "Messages of the tenant in the engine (parked ones included)."),
		state:    per("breaker_state", "The tenant's breaker: 0 closed, 1 half-open, 2 open."),
		dlqDown:  per("dlq_unavailable", "1 while the tenant's dead-letter queue refuses its dead letters (its messages wait behind them), else 0."),
		dlqFails: per("dlq_write_failures_total", "Failed writes of the tenant's dead letters (each written again later)."),

		tHandled:       total("handled_total", "Messages handled successfully, all tenants."),
		tFailed:        total("failed_total", "Failed handler attempts, all tenants."),
		tDead:          total("dead_lettered_total", "Messages dead-lettered, all tenants."),
		tRetried:       total("retries_total", "Retries scheduled, all tenants."),
		tPanics:        total("panics_total", "Handler panics recovered, all tenants."),
		tParked:        total("parked", "Messages parked behind open breakers, all tenants."),
		tQueued:        total("queued", "Messages in the engine, all tenants."),
		tInFlight:      total("in_flight", "Handler calls running now."),
		tPaused:        total("paused_partitions", "Partitions paused for backpressure."),
		tTenants:       total("tenants_tracked", "Tenants the engine tracks now."),
		tShown:         total("tenants_exported", "Tenants exported with their own series in this scrape."),
		tDLQFails:      total("dlq_write_failures_total", "Failed dead-letter writes, all tenants (each written again later)."),
		tDLQDown:       total("dlq_unavailable_tenants", "Tenants whose dead-letter queue refuses their dead letters now."),
		scopeKeys:      total("scope_keys", "Guards held by the tenant scope."),
		scopeEvictions: total("scope_evictions_total", "Guards evicted from the tenant scope."),
	}, nil
}

// Describe implements prometheus.Collector.
func (m *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		m.handled, m.failed, m.dead, m.parked, m.queued, m.state, m.dlqDown, m.dlqFails,
		m.tHandled, m.tFailed, m.tDead, m.tRetried, m.tPanics,
		m.tParked, m.tQueued, m.tInFlight, m.tPaused, m.tTenants, m.tShown,
		m.tDLQFails, m.tDLQDown,
		m.scopeKeys, m.scopeEvictions,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Collector) Collect(ch chan<- prometheus.Metric) {
	st := m.c.Stats()
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter(m.tHandled, st.Handled)
	counter(m.tFailed, st.Failed)
	counter(m.tDead, st.DeadLettered)
	counter(m.tRetried, st.Retried)
	counter(m.tPanics, st.Panics)
	gauge(m.tParked, float64(st.Parked))
	gauge(m.tQueued, float64(st.Queued))
	gauge(m.tInFlight, float64(st.InFlight))
	gauge(m.tPaused, float64(st.PausedPartitions))
	gauge(m.tTenants, float64(len(st.Tenants)))
	counter(m.tDLQFails, st.DLQFailures)
	gauge(m.tDLQDown, float64(st.DLQUnavailableTenants))
	ss := m.c.Scope().Stats()
	gauge(m.scopeKeys, float64(ss.Size))
	counter(m.scopeEvictions, ss.Evictions)

	ts := st.Tenants
	if len(ts) > m.max {
		// Keep the tenants most worth watching.
		sort.SliceStable(ts, func(i, j int) bool {
			a, b := ts[i], ts[j]
			if a.State != b.State {
				return rank(a.State) > rank(b.State)
			}
			if a.DLQUnavailable != b.DLQUnavailable {
				return a.DLQUnavailable
			}
			if a.Parked != b.Parked {
				return a.Parked > b.Parked
			}
			if a.Queued != b.Queued {
				return a.Queued > b.Queued
			}
			return a.Tenant < b.Tenant
		})
		ts = ts[:m.max]
	}
	gauge(m.tShown, float64(len(ts)))
	for _, t := range ts {
		label := dlq.NoTenantToken
		if t.Tenant != "" {
			label = dlq.TenantToken(t.Tenant)
		}
		counter(m.handled, t.Handled, label)
		counter(m.failed, t.Failed, label)
		counter(m.dead, t.DeadLettered, label)
		gauge(m.parked, float64(t.Parked), label)
		gauge(m.queued, float64(t.Queued), label)
		gauge(m.state, stateValue(t.State), label)
		gauge(m.dlqDown, boolValue(t.DLQUnavailable), label)
		counter(m.dlqFails, t.DLQFailures, label)
	}
}

func rank(s policy.State) int {
	switch s {
	case policy.Open:
		return 2
	case policy.HalfOpen:
		return 1
	}
	return 0
}

func stateValue(s policy.State) float64 {
	switch s {
	case policy.HalfOpen:
		return 1
	case policy.Open:
		return 2
	}
	return 0
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
