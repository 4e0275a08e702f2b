package dashboard

import (
	"encoding/json"
	"strconv"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's Grafana uid: importing ringfence.json again
// replaces the dashboard rather than adding a copy.
const UID = "ringfence-overview"

// Selectors every query carries: the job and tenant filters of the
// dashboard's variables.
const (
	job    = `job=~"$job"`
	tenant = `job=~"$job",tenant=~"$tenant"`
)

// The series the job and tenant variables list their values from.
const (
	jobSeries    = `ringfence_handled_total`
	tenantSeries = `ringfence_tenant_handled_total{job=~"$job"}`
)

// Build returns the ringfence dashboard.
//
// It is the classic dashboard JSON model, which every Grafana in use
// imports; the SDK marks it deprecated in favour of dashboardv2, which
// only Grafana 12's v2 dashboard API accepts.
//
//lint:ignore SA1019 the classic model is the one Grafana's import takes
func Build() (dashboard.Dashboard, error) {
	ds := common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
	legend := common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeTable).
		Placement(common.LegendPlacementBottom).Calcs([]string{"lastNotNull", "max"})
	tooltip := common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)
	// Grafana keys panel state (links, edits) by id; number them in order.
	id := uint32(0)
	next := func() uint32 { id++; return id }
	row := func(title string) *dashboard.RowBuilder { return dashboard.NewRowBuilder(title).Id(next()) }
	series := func(title, desc, unit string, targets ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
		p := timeseries.NewPanelBuilder().Id(next()).Title(title).Description(desc).Unit(unit).Min(0).
			Datasource(ds).Height(8).Span(12).Legend(legend).Tooltip(tooltip)
		for _, t := range targets {
			p.WithTarget(t.Datasource(ds))
		}
		return p
	}
	states := func(title, desc string, mappings []dashboard.ValueMapping, target *prometheus.DataqueryBuilder) *statetimeline.PanelBuilder {
		return statetimeline.NewPanelBuilder().Id(next()).Title(title).Description(desc).
			Datasource(ds).Height(8).Span(12).Mappings(mappings).ShowValue(common.VisibilityModeNever).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false).DisplayMode(common.LegendDisplayModeHidden).Placement(common.LegendPlacementBottom)).
			Tooltip(tooltip).
			WithTarget(target.Datasource(ds))
	}

	//lint:ignore SA1019 see Build's doc
	b := dashboard.NewDashboardBuilder("ringfence").
		Uid(UID).
		Description("Per-tenant resilience of ringfence consumers: lag, dwell, parking, spilling, dead letters, partitions and breakers.").
		Tags([]string{"ringfence", "kafka", "nats"}).
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("job").Label("Job").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(" + jobSeries + ", job)")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Multi(true).IncludeAll(true).AllValue(".*")).
		WithVariable(dashboard.NewQueryVariableBuilder("tenant").Label("Tenant").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(" + tenantSeries + ", tenant)")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Multi(true).IncludeAll(true).AllValue(".*"))

	b.WithRow(row("Tenants")).
		WithPanel(series("Time lag per tenant",
			"Age of each tenant's oldest unsettled message (now minus its produce time), the worst process. _other is the worst of the tenants not exported by name.",
			"s",
			query(`max by (tenant) (ringfence_tenant_time_lag_seconds{`+tenant+`})`, "{{tenant}}"))).
		WithPanel(series("Dwell quantiles per tenant",
			"Produce-to-settle time of the messages settled in the interval.",
			"s",
			query(`histogram_quantile(0.5, sum by (tenant, le) (rate(ringfence_tenant_dwell_seconds_bucket{`+tenant+`}[$__rate_interval])))`, "p50 {{tenant}}"),
			query(`histogram_quantile(0.99, sum by (tenant, le) (rate(ringfence_tenant_dwell_seconds_bucket{`+tenant+`}[$__rate_interval])))`, "p99 {{tenant}}"))).
		WithPanel(series("Parked and spilling tenants",
			"Tenants exported by name with parked messages (open breaker) or a spill backlog.",
			"short",
			query(`count(max by (tenant) (ringfence_tenant_parked{`+job+`,tenant!="_other"}) > 0) or vector(0)`, "parked"),
			query(`count(max by (tenant) (ringfence_tenant_spill_backlog_age_seconds{`+job+`,tenant!="_other"}) > 0) or vector(0)`, "spilling"))).
		WithPanel(series("Oldest parked and spilled message",
			"Age since produce of each tenant's oldest parked message, and of the oldest spilled message not yet re-fed and settled.",
			"s",
			query(`max by (tenant) (ringfence_tenant_oldest_parked_age_seconds{`+tenant+`}) > 0`, "parked {{tenant}}"),
			query(`max by (tenant) (ringfence_tenant_spill_backlog_age_seconds{`+tenant+`}) > 0`, "spilled {{tenant}}"))).
		WithPanel(series("Dead letters per minute",
			"Messages written to each tenant's dead-letter queue (permanent errors, retries used up with the breaker closed, missing tenant key).",
			"short",
			query(`60 * sum by (tenant) (rate(ringfence_tenant_dead_lettered_total{`+tenant+`}[$__rate_interval]))`, "{{tenant}}"))).
		WithPanel(states("Breaker state per tenant",
			"Each tenant's breaker, the worst process.",
			[]dashboard.ValueMapping{valueMap([2]string{"closed", "green"}, [2]string{"half-open", "yellow"}, [2]string{"open", "red"})},
			query(`max by (tenant) (ringfence_tenant_breaker_state{`+tenant+`})`, "{{tenant}}")))

	b.WithRow(row("Partitions")).
		WithPanel(series("Time lag per partition",
			"Age of each partition's oldest unsettled message.",
			"s",
			query(`max by (partition) (ringfence_partition_time_lag_seconds{`+job+`})`, "{{partition}}"))).
		WithPanel(series("Commit lag per partition",
			"Offsets between the committed offset and the next offset to deliver: what a restart would deliver again.",
			"short",
			query(`max by (partition) (ringfence_partition_commit_lag{`+job+`})`, "{{partition}}"))).
		WithPanel(states("Paused partitions",
			"A partition is paused only when a tenant's spill log is unavailable.",
			[]dashboard.ValueMapping{valueMap([2]string{"flowing", "green"}, [2]string{"paused", "red"})},
			query(`max by (partition) (ringfence_partition_paused{`+job+`})`, "{{partition}}")))

	b.WithRow(row("Engine")).
		WithPanel(series("Handler calls in flight",
			"Handler calls running now, per process.",
			"short",
			query(`sum by (instance) (ringfence_in_flight{`+job+`})`, "{{instance}}"))).
		WithPanel(series("Messages per second",
			"Messages handled, failed attempts and retries, all tenants.",
			"short",
			query(`sum(rate(ringfence_handled_total{`+job+`}[$__rate_interval]))`, "handled"),
			query(`sum(rate(ringfence_failed_total{`+job+`}[$__rate_interval]))`, "failed attempts"),
			query(`sum(rate(ringfence_retries_total{`+job+`}[$__rate_interval]))`, "retries")))

	return b.Build()
}

// JSON returns Build's dashboard as indented JSON, the form of
// ringfence.json.
func JSON() ([]byte, error) {
	d, err := Build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// A Query is one PromQL expression of the dashboard. It may hold Grafana's
// variables ($job, $tenant, $__rate_interval).
type Query struct {
	Panel string // the panel's title, or "variable <name>"
	Expr  string
}

// Queries lists the dashboard's PromQL: every panel target, and the series
// selectors its variables take their values from.
func Queries() ([]Query, error) {
	d, err := Build()
	if err != nil {
		return nil, err
	}
	qs := []Query{{"variable job", jobSeries}, {"variable tenant", tenantSeries}}
	add := func(p dashboard.Panel) {
		for _, t := range p.Targets {
			if pq, ok := t.(prometheus.Dataquery); ok {
				qs = append(qs, Query{Panel: *p.Title, Expr: pq.Expr})
			}
		}
	}
	for _, p := range d.Panels {
		switch {
		case p.Panel != nil:
			add(*p.Panel)
		case p.RowPanel != nil:
			for _, rp := range p.RowPanel.Panels {
				add(rp)
			}
		}
	}
	return qs, nil
}

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend)
}

// valueMap maps the values 0, 1, ... to the [text, color] pairs given.
func valueMap(states ...[2]string) dashboard.ValueMapping {
	opts := make(map[string]dashboard.ValueMappingResult, len(states))
	for i, tc := range states {
		opts[strconv.Itoa(i)] = dashboard.ValueMappingResult{Text: cog.ToPtr(tc[0]), Color: cog.ToPtr(tc[1]), Index: cog.ToPtr(int32(i))}
	}
	return dashboard.ValueMapping{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}
}
