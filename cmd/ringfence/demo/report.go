package demo

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// BrokerResult is the three runs on one broker.
type BrokerResult struct {
	Broker  string
	Tenants []string
	Outage  string
	Poison  string
	Sent    int // poison messages sent
	Sc      Scenario
	Runs    [3]RunResult // by Mode
	Elapsed time.Duration
}

// Ratio returns mode's healthy goodput during the window over the
// baseline's.
func (b *BrokerResult) Ratio(m Mode) float64 {
	base := b.Runs[Baseline].HealthyInWindow
	if base == 0 {
		return 0
	}
	return float64(b.Runs[m].HealthyInWindow) / float64(base)
}

// JSONReport is the object --json prints per broker.
type JSONReport struct {
	Broker                      string         `json:"broker"`
	Tenants                     int            `json:"tenants"`
	RatePerTenant               int            `json:"rate_per_tenant"`
	DurationSeconds             float64        `json:"duration_s"`
	FaultWindowSeconds          [2]float64     `json:"fault_window_s"`
	OutageTenant                string         `json:"outage_tenant"`
	PoisonTenant                string         `json:"poison_tenant"`
	Produced                    int            `json:"produced"`
	PoisonSent                  int            `json:"poison_sent"`
	HealthyGoodput              map[string]int `json:"healthy_goodput_in_window"`
	HealthyRatioPerTenant       float64        `json:"healthy_ratio_per_tenant"`
	HealthyRatioShared          float64        `json:"healthy_ratio_shared"`
	TransientDeadLettered       int            `json:"transient_dead_lettered"`
	TransientDeadLetteredShared int            `json:"transient_dead_lettered_shared"`
	PoisonDeadLettered          int            `json:"poison_dead_lettered"`
	PoisonDeadLetteredShared    int            `json:"poison_dead_lettered_shared"`
	Lost                        int            `json:"lost"`
	LostShared                  int            `json:"lost_shared"`
	LostBaseline                int            `json:"lost_baseline"`
	OutageTenantTrips           int            `json:"outage_tenant_breaker_trips"`
	SharedBreakerTrips          int            `json:"shared_breaker_trips"`
	OutageTenantMaxParked       int            `json:"outage_tenant_max_parked"`
	Redelivered                 int            `json:"redelivered"`
	ElapsedSeconds              float64        `json:"elapsed_s"`
}

// JSON returns the --json object of b.
func (b *BrokerResult) JSON() JSONReport {
	pt, sh, bl := b.Runs[PerTenant], b.Runs[Shared], b.Runs[Baseline]
	r := JSONReport{
		Broker:                      b.Broker,
		Tenants:                     len(b.Tenants),
		RatePerTenant:               b.Sc.Rate,
		DurationSeconds:             b.Sc.Duration.Seconds(),
		FaultWindowSeconds:          [2]float64{b.Sc.FaultStart.Seconds(), b.Sc.FaultEnd.Seconds()},
		OutageTenant:                b.Outage,
		PoisonTenant:                b.Poison,
		Produced:                    pt.Produced,
		PoisonSent:                  b.Sent,
		HealthyGoodput:              map[string]int{"baseline": bl.HealthyInWindow, "ringfence": pt.HealthyInWindow, "shared": sh.HealthyInWindow},
		HealthyRatioPerTenant:       round3(b.Ratio(PerTenant)),
		HealthyRatioShared:          round3(b.Ratio(Shared)),
		TransientDeadLettered:       pt.OutageDead,
		TransientDeadLetteredShared: sh.OutageDead,
		PoisonDeadLettered:          pt.PoisonDead,
		PoisonDeadLetteredShared:    sh.PoisonDead,
		Lost:                        pt.Lost,
		LostShared:                  sh.Lost,
		LostBaseline:                bl.Lost,
		SharedBreakerTrips:          sh.SharedTrips,
		Redelivered:                 bl.Redelivered + pt.Redelivered + sh.Redelivered,
		ElapsedSeconds:              math.Round(b.Elapsed.Seconds()*10) / 10,
	}
	for _, t := range pt.Tenants {
		if t.Role == "outage" {
			r.OutageTenantTrips = t.Trips
			r.OutageTenantMaxParked = t.MaxParked
		}
	}
	return r
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// WriteSummary prints the side-by-side summary of one broker.
func (b *BrokerResult) WriteSummary(w io.Writer) {
	sc := b.Sc
	fmt.Fprintf(w, "\n%s — %d tenants × %d msg/s for %v; %s's dependency down %.1fs–%.1fs; %s sends %d poison messages\n\n",
		b.Broker, len(b.Tenants), sc.Rate, sc.Duration, b.Outage, sc.FaultStart.Seconds(), sc.FaultEnd.Seconds(), b.Poison, b.Sent)

	fmt.Fprintf(w, "%-12s %-7s %-28s %-19s %s\n", "", "", "goodput during the outage", "dead-lettered", "ringfence")
	fmt.Fprintf(w, "%-12s %-7s %8s %10s %8s %10s %8s %11s %6s\n", "tenant", "role", "baseline", "ringfence", "shared", "ringfence", "shared", "max parked", "trips")
	for i, name := range b.Tenants {
		bl, pt, sh := b.Runs[Baseline].Tenants[i], b.Runs[PerTenant].Tenants[i], b.Runs[Shared].Tenants[i]
		fmt.Fprintf(w, "%-12s %-7s %8d %10d %8d %10d %8d %11d %6d\n", name, pt.Role, bl.InWindow, pt.InWindow, sh.InWindow, pt.DeadLettered, sh.DeadLettered, pt.MaxParked, pt.Trips)
	}
	fmt.Fprintln(w)
	row := func(label string, f func(r RunResult) string) {
		fmt.Fprintf(w, "%-30s %10s %12s %16s\n", label, f(b.Runs[Baseline]), f(b.Runs[PerTenant]), f(b.Runs[Shared]))
	}
	fmt.Fprintf(w, "%-30s %10s %12s %16s\n", "", "baseline", "ringfence", "shared breaker")
	row("healthy goodput during outage", func(r RunResult) string { return fmt.Sprint(r.HealthyInWindow) })
	row("  ratio to baseline", func(r RunResult) string { return fmt.Sprintf("%.2f", b.Ratio(r.Mode)) })
	row("outage tenant dead-lettered", func(r RunResult) string { return fmt.Sprint(r.OutageDead) })
	row("poison dead-lettered", func(r RunResult) string { return fmt.Sprintf("%d/%d", r.PoisonDead, b.Sent) })
	row("healthy tenants dead-lettered", func(r RunResult) string { return fmt.Sprint(r.OtherDead) })
	row("max parked", func(r RunResult) string { return fmt.Sprint(r.MaxParked) })
	row("lost", func(r RunResult) string { return fmt.Sprint(r.Lost) })
	row("run time", func(r RunResult) string { return fmt.Sprintf("%.1fs", r.Elapsed.Seconds()) })
	fmt.Fprintln(w, "\nringfence: a guard per tenant. shared breaker: one key for every message, so one guard and one ordered lane per partition.")
}

// Verdict says in one line whether the run shows what it should.
func (b *BrokerResult) Verdict() string {
	pt := b.Runs[PerTenant]
	var bad []string
	if r := b.Ratio(PerTenant); r < 0.95 {
		bad = append(bad, fmt.Sprintf("per-tenant healthy ratio %.2f < 0.95", r))
	}
	if pt.OutageDead != 0 {
		bad = append(bad, fmt.Sprintf("%d transient dead letters", pt.OutageDead))
	}
	if pt.Lost != 0 {
		bad = append(bad, fmt.Sprintf("%d lost", pt.Lost))
	}
	if len(bad) > 0 {
		return b.Broker + ": NOT as expected: " + strings.Join(bad, ", ")
	}
	return fmt.Sprintf("%s: healthy tenants kept %.0f%% of their goodput with per-tenant guards, %.0f%% with one shared breaker; the outage dead-lettered nothing (shared: %d); nothing lost.",
		b.Broker, 100*b.Ratio(PerTenant), 100*b.Ratio(Shared), b.Runs[Shared].OutageDead)
}
