package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// ErrInvalidOption is wrapped by NewCollector's error for a bad option.
var ErrInvalidOption = errors.New("metrics: invalid option")

// OtherTenant is the tenant label value of the series that sum (or, for
// ages and the breaker state, max) the tenants not exported by name. No
// tenant key has it as its token (dlq.TenantToken escapes a leading "_").
const OtherTenant = "_other"

// DefaultMaxTenants is how many tenants are exported by name unless
// WithMaxTenants says otherwise.
const DefaultMaxTenants = 20

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
// scrape (the rest are summed, or maxed, into the OtherTenant series).
// Default: 20.
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
	c       *consumer.Consumer
	max     int
	buckets []float64 // consumer.DwellBuckets in seconds

	// Per tenant.
	handled, failed, dead, parked, queued, state *prometheus.Desc
	timeLag, oldestParked, spillAge              *prometheus.Desc
	spilled, refed, dwell                        *prometheus.Desc
	dlqDown, dlqFails                            *prometheus.Desc
	// Per partition.
	pTimeLag, pCommitLag, pPaused, pCommitted *prometheus.Desc
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
	cfg := config{namespace: "ringfence", maxTenants: DefaultMaxTenants}
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
	part := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "partition", name), help, []string{"partition"}, cl)
	}
	total := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, nil, cl)
	}
	var buckets []float64
	for _, b := range consumer.DwellBuckets() {
		buckets = append(buckets, b.Seconds())
	}
	return &Collector{
		c:       c,
		max:     cfg.maxTenants,
		buckets: buckets,

		handled:      per("handled_total", "Messages of the tenant handled successfully."),
		failed:       per("failed_total", "Failed handler attempts of the tenant."),
		dead:         per("dead_lettered_total", "Messages of the tenant written to its dead-letter queue."),
		parked:       per("parked", "Messages of the tenant waiting behind its open breaker."),
		queued:       per("queued", "Messages of the tenant in the engine (parked ones included)."),
		state:        per("breaker_state", "The tenant's breaker: 0 closed, 1 half-open, 2 open."),
		timeLag:      per("time_lag_seconds", "Time since the produce time of the tenant's oldest unsettled message in the engine (_other: the max of the rest)."),
		oldestParked: per("oldest_parked_age_seconds", "Time since the produce time of the tenant's oldest parked message (_other: the max of the rest)."),
		spillAge:     per("spill_backlog_age_seconds", "Time since the produce time of the oldest of the tenant's spilled messages not yet re-fed and settled (_other: the max of the rest)."),
		spilled:      per("spilled_total", "Messages of the tenant appended to its spill log."),
		refed:        per("refed_total", "Messages of the tenant read back from its spill log."),
		dwell:        per("dwell_seconds", "Time from produce to settle (handled or dead-lettered) of the tenant's messages."),
		dlqDown:      per("dlq_unavailable", "1 while the tenant's dead-letter queue refuses its dead letters (its messages wait behind them), else 0 (_other: 1 if any of the rest)."),
		dlqFails:     per("dlq_write_failures_total", "Failed writes of the tenant's dead letters (each written again later)."),

		pTimeLag:   part("time_lag_seconds", "Time since the produce time of the partition's oldest unsettled message."),
		pCommitLag: part("commit_lag", "Offsets a crash now would deliver again: the next offset minus the commit point."),
		pPaused:    part("paused", "1 while the engine has the source stop fetching the partition."),
		pCommitted: part("committed_offset", "The last commit point passed to the source (-1 none)."),

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
		m.handled, m.failed, m.dead, m.parked, m.queued, m.state,
		m.timeLag, m.oldestParked, m.spillAge, m.spilled, m.refed, m.dwell,
		m.dlqDown, m.dlqFails,
		m.pTimeLag, m.pCommitLag, m.pPaused, m.pCommitted,
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

	for _, p := range st.Partitions {
		label := p.Partition.Topic + "/" + strconv.FormatInt(int64(p.Partition.ID), 10)
		gauge(m.pTimeLag, p.TimeLag.Seconds(), label)
		gauge(m.pCommitLag, float64(p.CommitLag), label)
		gauge(m.pPaused, boolValue(p.Paused), label)
		gauge(m.pCommitted, float64(p.Committed), label)
	}

	named, rest := topTenants(st.Tenants, m.max)
	gauge(m.tShown, float64(len(named)))
	for i := range named {
		t := &named[i]
		label := dlq.NoTenantToken
		if !t.NoTenant {
			label = dlq.TenantToken(t.Tenant)
		}
		m.tenant(ch, t, label)
	}
	m.tenant(ch, other(&st, named, rest), OtherTenant)
}

// tenant sends the series of one tenant (or of the rest, as OtherTenant).
func (m *Collector) tenant(ch chan<- prometheus.Metric, t *consumer.TenantStats, label string) {
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label)
	}
	counter(m.handled, t.Handled)
	counter(m.failed, t.Failed)
	counter(m.dead, t.DeadLettered)
	counter(m.spilled, t.Spilled)
	counter(m.refed, t.Refed)
	gauge(m.parked, float64(t.Parked))
	gauge(m.queued, float64(t.Queued))
	gauge(m.state, stateValue(t.State))
	gauge(m.timeLag, t.TimeLag.Seconds())
	gauge(m.oldestParked, t.OldestParked.Seconds())
	gauge(m.spillAge, t.SpillBacklogAge.Seconds())
	gauge(m.dlqDown, boolValue(t.DLQUnavailable))
	counter(m.dlqFails, t.DLQFailures)
	buckets := make(map[float64]uint64, len(m.buckets))
	for i, b := range m.buckets {
		if i < len(t.Dwell.Counts) {
			buckets[b] = t.Dwell.Counts[i]
		}
	}
	ch <- prometheus.MustNewConstHistogram(m.dwell, t.Dwell.Count, t.Dwell.Sum.Seconds(), buckets, label)
}

// topTenants splits ts into the (at most) k tenants most worth watching,
// ordered by key, and the rest: an open, then half-open breaker first,
// then a DLQ that refuses its dead letters, most parked, spilling, oldest
// time lag, most queued, then by key.
// It reorders ts.
func topTenants(ts []consumer.TenantStats, k int) (named, rest []consumer.TenantStats) {
	if len(ts) > k {
		slices.SortFunc(ts, func(a, b consumer.TenantStats) int {
			return cmp.Or(
				cmp.Compare(rank(b.State), rank(a.State)),
				cmp.Compare(boolValue(b.DLQUnavailable), boolValue(a.DLQUnavailable)),
				cmp.Compare(b.Parked, a.Parked),
				cmp.Compare(b.Spilling, a.Spilling),
				cmp.Compare(b.TimeLag, a.TimeLag),
				cmp.Compare(b.Queued, a.Queued),
				cmp.Compare(a.Tenant, b.Tenant),
			)
		})
		ts, rest = ts[:k], ts[k:]
		slices.SortFunc(ts, func(a, b consumer.TenantStats) int {
			if a.NoTenant != b.NoTenant {
				if a.NoTenant {
					return -1
				}
				return 1
			}
			return cmp.Compare(a.Tenant, b.Tenant)
		})
	}
	return ts, rest
}

// other is the OtherTenant series' values: the engine's counters and dwell
// minus the named tenants' (so that forgotten tenants' counts are in it
// and the tenant series add up to the totals), the rest's gauges of counts
// summed, and their ages and breaker state maxed.
func other(st *consumer.Stats, named, rest []consumer.TenantStats) *consumer.TenantStats {
	o := consumer.TenantStats{
		Handled:      st.Handled,
		Failed:       st.Failed,
		DeadLettered: st.DeadLettered,
		Spilled:      st.Spilled,
		Refed:        st.Refed,
		DLQFailures:  st.DLQFailures,
		State:        policy.Closed,
		Dwell: consumer.Histogram{
			Counts: slices.Clone(st.Dwell.Counts),
			Count:  st.Dwell.Count,
			Sum:    st.Dwell.Sum,
		},
	}
	sub := func(a *uint64, b uint64) { *a -= min(*a, b) }
	for i := range named {
		t := &named[i]
		sub(&o.Handled, t.Handled)
		sub(&o.Failed, t.Failed)
		sub(&o.DeadLettered, t.DeadLettered)
		sub(&o.Spilled, t.Spilled)
		sub(&o.Refed, t.Refed)
		sub(&o.DLQFailures, t.DLQFailures)
		sub(&o.Dwell.Count, t.Dwell.Count)
		o.Dwell.Sum = max(o.Dwell.Sum-t.Dwell.Sum, 0)
		for j := range o.Dwell.Counts {
			if j < len(t.Dwell.Counts) {
				sub(&o.Dwell.Counts[j], t.Dwell.Counts[j])
			}
		}
	}
	for i := range rest {
		t := &rest[i]
		o.Parked += t.Parked
		o.Queued += t.Queued
		if rank(t.State) > rank(o.State) {
			o.State = t.State
		}
		o.TimeLag = max(o.TimeLag, t.TimeLag)
		o.OldestParked = max(o.OldestParked, t.OldestParked)
		o.SpillBacklogAge = max(o.SpillBacklogAge, t.SpillBacklogAge)
		o.DLQUnavailable = o.DLQUnavailable || t.DLQUnavailable
	}
	return &o
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

func stateValue(s policy.State) float64 { return float64(rank(s)) }

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
