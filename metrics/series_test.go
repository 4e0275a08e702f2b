package metrics_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/metrics"
)

// series is every metric name the collector exports, with its type and
// label names (the constant ones aside).
var series = map[string]struct {
	typ    dto.MetricType
	labels string
}{
	"ringfence_tenant_handled_total":             {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_failed_total":              {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_dead_lettered_total":       {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_spilled_total":             {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_refed_total":               {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_parked":                    {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_queued":                    {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_breaker_state":             {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_time_lag_seconds":          {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_oldest_parked_age_seconds": {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_spill_backlog_age_seconds": {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_dlq_unavailable":           {dto.MetricType_GAUGE, "tenant"},
	"ringfence_tenant_dlq_write_failures_total":  {dto.MetricType_COUNTER, "tenant"},
	"ringfence_tenant_dwell_seconds":             {dto.MetricType_HISTOGRAM, "tenant"},
	"ringfence_partition_time_lag_seconds":       {dto.MetricType_GAUGE, "partition"},
	"ringfence_partition_commit_lag":             {dto.MetricType_GAUGE, "partition"},
	"ringfence_partition_paused":                 {dto.MetricType_GAUGE, "partition"},
	"ringfence_partition_committed_offset":       {dto.MetricType_GAUGE, "partition"},
	"ringfence_handled_total":                    {dto.MetricType_COUNTER, ""},
	"ringfence_failed_total":                     {dto.MetricType_COUNTER, ""},
	"ringfence_dead_lettered_total":              {dto.MetricType_COUNTER, ""},
	"ringfence_retries_total":                    {dto.MetricType_COUNTER, ""},
	"ringfence_panics_total":                     {dto.MetricType_COUNTER, ""},
	"ringfence_parked":                           {dto.MetricType_GAUGE, ""},
	"ringfence_queued":                           {dto.MetricType_GAUGE, ""},
	"ringfence_in_flight":                        {dto.MetricType_GAUGE, ""},
	"ringfence_paused_partitions":                {dto.MetricType_GAUGE, ""},
	"ringfence_tenants_tracked":                  {dto.MetricType_GAUGE, ""},
	"ringfence_tenants_exported":                 {dto.MetricType_GAUGE, ""},
	"ringfence_scope_keys":                       {dto.MetricType_GAUGE, ""},
	"ringfence_scope_evictions_total":            {dto.MetricType_COUNTER, ""},
	"ringfence_dlq_write_failures_total":         {dto.MetricType_COUNTER, ""},
	"ringfence_dlq_unavailable_tenants":          {dto.MetricType_GAUGE, ""},
}

// gather registers col in a pedantic registry (descriptors must match
// what is collected) and gathers it.
func gather(t *testing.T, col prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// Every metric the registry gathers is one of the contract's, with its
// type and labels, and every one of the contract's is there; the dwell
// histograms have consumer.DwellBuckets' bounds.
func TestCollectorSeriesNamesAndLabels(t *testing.T) {
	t.Parallel()
	msgs := [][2]string{{"acme", "1"}, {"acme", "bad"}, {"globex", "1"}, {"globex", "2"}, {"globex", "3"}}
	c := settledConsumer(t, msgs, map[string]bool{"globex": true}, func(s consumer.Stats) bool {
		return s.Handled == 1 && s.DeadLettered == 1 && s.Parked == 3
	})
	col, err := metrics.NewCollector(c, metrics.WithConstLabels(prometheus.Labels{"group": "g"}))
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, col)
	if extra, missing := setDiff(slices.Collect(maps.Keys(got)), slices.Collect(maps.Keys(series))); len(extra)+len(missing) > 0 {
		t.Fatalf("exported but not in the contract: %v; in the contract but not exported: %v", extra, missing)
	}
	var bounds []float64
	for _, b := range consumer.DwellBuckets() {
		bounds = append(bounds, b.Seconds())
	}
	for name, mf := range got {
		want := series[name]
		if mf.GetType() != want.typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), want.typ)
		}
		for _, m := range mf.GetMetric() {
			var names []string
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "group" {
					names = append(names, lp.GetName())
				} else if lp.GetValue() != "g" {
					t.Errorf("%s: const label group=%q", name, lp.GetValue())
				}
			}
			if l := strings.Join(names, ","); l != want.labels {
				t.Errorf("%s: labels %q, want %q", name, l, want.labels)
			}
			if h := m.GetHistogram(); h != nil {
				var got []float64
				for _, b := range h.GetBucket() {
					got = append(got, b.GetUpperBound())
				}
				if !slices.Equal(got, bounds) {
					t.Errorf("%s: buckets %v, want %v", name, got, bounds)
				}
			}
		}
	}
	// The partition label is "<topic>/<n>".
	for _, m := range got["ringfence_partition_paused"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "partition" && !strings.HasSuffix(lp.GetValue(), "/0") {
				t.Errorf("partition label %q", lp.GetValue())
			}
		}
	}
}

func setDiff(a, b []string) (onlyA, onlyB []string) {
	for _, x := range a {
		if !slices.Contains(b, x) {
			onlyA = append(onlyA, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			onlyB = append(onlyB, x)
		}
	}
	slices.Sort(onlyA)
	slices.Sort(onlyB)
	return onlyA, onlyB
}

// With 100,000 tenants in one engine (one message each) and three in an
// outage, each tenant metric has at most K+1 series (the default K named
// and _other), the tenants in the outage are among the named, and the
// tenant series add up to the totals (forgotten tenants' counts are in
// _other).
func TestCollectorBoundsSeriesAt100kTenants(t *testing.T) {
	t.Parallel()
	const n = 100_000
	msgs := make([][2]string, 0, n+9)
	for i := range n {
		msgs = append(msgs, [2]string{fmt.Sprintf("t%06d", i), "1"})
	}
	down := map[string]bool{"down-1": true, "down-2": true, "down-3": true}
	for tn := range down {
		msgs = append(msgs, [2]string{tn, "1"}, [2]string{tn, "2"}, [2]string{tn, "3"})
	}
	c := startConsumer(t, msgs, down)
	// Totals first: a Stats snapshot walks every tracked tenant.
	consumertest.Eventually(t, "every message handled and the outage parked", func() bool {
		if c.Totals().Handled < n {
			time.Sleep(20 * time.Millisecond)
			return false
		}
		return c.Stats().Parked == 9
	})
	col, err := metrics.NewCollector(c)
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, col)
	const k = metrics.DefaultMaxTenants
	tenantSeries := map[string]int{}
	for name, mf := range got {
		if !strings.HasPrefix(name, "ringfence_tenant_") {
			continue
		}
		tenantSeries[name] = len(mf.GetMetric())
		if len(mf.GetMetric()) > k+1 {
			t.Errorf("%s: %d series, want at most %d", name, len(mf.GetMetric()), k+1)
		}
	}
	t.Logf("tenants tracked %v, series per tenant metric: %v", value(got["ringfence_tenants_tracked"].GetMetric()[0]), tenantSeries)

	sum := func(name string) (total float64, byTenant map[string]float64) {
		byTenant = map[string]float64{}
		for _, m := range got[name].GetMetric() {
			v := value(m)
			total += v
			byTenant[m.GetLabel()[0].GetValue()] = v
		}
		return total, byTenant
	}
	handled, byTenant := sum("ringfence_tenant_handled_total")
	if total := value(got["ringfence_handled_total"].GetMetric()[0]); handled != total || total != n {
		t.Fatalf("tenant handled_total series sum to %v, the total is %v, want %d", handled, total, n)
	}
	parked, _ := sum("ringfence_tenant_parked")
	if parked != 9 {
		t.Fatalf("tenant parked series sum to %v, want 9", parked)
	}
	for tn := range down {
		if _, ok := byTenant[tn]; !ok {
			t.Errorf("tenant %s in an outage is not exported by name", tn)
		}
	}
	var dwellCount uint64
	for _, m := range got["ringfence_tenant_dwell_seconds"].GetMetric() {
		dwellCount += m.GetHistogram().GetSampleCount()
	}
	if dwellCount != n {
		t.Fatalf("tenant dwell histograms count %d settles, want %d", dwellCount, n)
	}
	t.Logf("handled_total: %v over tenant series (of which _other %v), total %v", handled, byTenant[metrics.OtherTenant], value(got["ringfence_handled_total"].GetMetric()[0]))
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}
