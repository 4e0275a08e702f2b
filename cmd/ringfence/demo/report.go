package demo

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// BrokerResult is a scenario's runs on one broker.
type BrokerResult struct {
	Broker string
	// Where the broker ran (see Broker.Where).
	Where   string
	Tenants []string
	// Bad is the bad tenant; Poison the poison tenant ("" for none).
	Bad, Poison string
	Sent        int // poison messages sent by the poison tenant
	// BurstSent is how many poison messages the bad tenant sends in its
	// burst (poison-burst, dlq-outage).
	BurstSent int
	Sc        Scenario
	// Keyed says the broker keys tenants onto partitions; Partitions is
	// each tenant's (by Tenants index; -1 when not keyed), BadPartition the
	// bad tenant's, and Mates the healthy tenants sharing it (everyone
	// healthy when not keyed).
	Keyed        bool
	Partitions   []int
	BadPartition int
	Mates        []string
	Runs         [3]RunResult // by Mode
	Elapsed      time.Duration
	// LagBound is the long-outage lag limit; HeapBudget the consumer heap
	// limit (0: reported only).
	LagBound   int64
	HeapBudget uint64
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// jsonFloat is a float for JSON: nil for NaN (not measurable) and +Inf
// (never handled).
func jsonFloat(f float64) *float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil
	}
	r := round3(f)
	return &r
}

// jsonMs is a latency in ms for JSON; nil when it never ended.
func jsonMs(d time.Duration) *float64 {
	if d == never {
		return nil
	}
	ms := round3(float64(d) / float64(time.Millisecond))
	return &ms
}

func jsonInt(n int, ok bool) *int {
	if !ok {
		return nil
	}
	return &n
}

// JSONReport is the object --json prints per broker. The flat fields
// before Scenario are the original demo's (kept for scripts); Runs and
// Checks carry every figure.
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
	HealthyRatioPerTenant       *float64       `json:"healthy_ratio_per_tenant"`
	HealthyRatioShared          *float64       `json:"healthy_ratio_shared,omitempty"`
	TransientDeadLettered       int            `json:"transient_dead_lettered"`
	TransientDeadLetteredShared *int           `json:"transient_dead_lettered_shared,omitempty"`
	PoisonDeadLettered          int            `json:"poison_dead_lettered"`
	PoisonDeadLetteredShared    *int           `json:"poison_dead_lettered_shared,omitempty"`
	Lost                        int            `json:"lost"`
	LostShared                  *int           `json:"lost_shared,omitempty"`
	LostBaseline                int            `json:"lost_baseline"`
	OutageTenantTrips           int            `json:"outage_tenant_breaker_trips"`
	SharedBreakerTrips          *int           `json:"shared_breaker_trips,omitempty"`
	OutageTenantMaxParked       int            `json:"outage_tenant_max_parked"`
	Redelivered                 int            `json:"redelivered"`
	ElapsedSeconds              float64        `json:"elapsed_s"`

	Scenario       string   `json:"scenario"`
	Policy         string   `json:"policy"`
	BrokerProcess  string   `json:"broker_process"`
	Partitions     int      `json:"partitions"`
	PartitionKeyed bool     `json:"partition_keyed"`
	BadTenant      string   `json:"bad_tenant"`
	BadRole        string   `json:"bad_role"`
	BadWeight      int      `json:"bad_weight"`
	BadPartition   int      `json:"bad_partition"`
	PartitionMates []string `json:"partition_mates"`
	// LagMeasure says what the commit lag figures are on this broker.
	LagMeasure string             `json:"commit_lag_measure"`
	Runs       map[string]RunJSON `json:"runs"`
	Checks     []Check            `json:"checks"`
	OK         bool               `json:"ok"`
}

// RunJSON is one run's figures in --json. Ratios are to the baseline run;
// null means not measurable (a latency: never handled).
type RunJSON struct {
	Produced               int      `json:"produced"`
	HealthyGoodput         int      `json:"healthy_goodput_in_window"`
	HealthyGoodputRatio    *float64 `json:"healthy_goodput_ratio"`
	MatesGoodput           int      `json:"mates_goodput_in_window"`
	MatesGoodputRatio      *float64 `json:"mates_goodput_ratio"`
	HealthyP99Ms           *float64 `json:"healthy_p99_ms"`
	HealthyP99Ratio        *float64 `json:"healthy_p99_ratio"`
	HealthyLatencyMessages int      `json:"healthy_latency_messages"`
	MatesP99Ms             *float64 `json:"mates_p99_ms"`
	MatesP99Ratio          *float64 `json:"mates_p99_ratio"`
	MatesLatencyMessages   int      `json:"mates_latency_messages"`
	MatesFromBrokerP99Ms   *float64 `json:"mates_p99_from_broker_timestamp_ms"`
	MatesFromBrokerRatio   *float64 `json:"mates_p99_from_broker_timestamp_ratio"`
	MaxCommitLagFault      int64    `json:"max_commit_lag_fault"`
	MaxCommitLagRun        int64    `json:"max_commit_lag_run"`
	LagSamples             int      `json:"commit_lag_samples"`
	PeakHeapBytes          uint64   `json:"peak_live_heap_bytes"`
	ConsumerHeapBytes      uint64   `json:"consumer_heap_bytes"`
	BadParked              *int     `json:"bad_parked_events"`
	BadDeadLettered        int      `json:"bad_dead_lettered"`
	PoisonDeadLettered     int      `json:"poison_dead_lettered"`
	OtherDeadLettered      int      `json:"healthy_dead_lettered"`
	GoodDeadLettered       int      `json:"good_dead_lettered"`
	BurstPoison            int      `json:"burst_poison"`
	BurstDeadLettered      int      `json:"burst_dead_lettered"`
	BurstFirstDeadAfterMs  *float64 `json:"burst_first_dead_lettered_after_end_ms"`
	BurstLastDeadAfterMs   *float64 `json:"burst_last_dead_lettered_after_end_ms"`
	BadAfterP99Ms          *float64 `json:"bad_after_fault_p99_ms"`
	BadAfterP99Ratio       *float64 `json:"bad_after_fault_p99_ratio"`
	BadOrderChecked        int      `json:"bad_order_checked"`
	BadOutOfOrder          int      `json:"bad_out_of_order"`
	UnfinishedAtDeadline   int      `json:"unfinished_at_deadline"`
	UnfinishedAfterDrain   int      `json:"unfinished_after_drain"`
	RecoveredOnRestart     int      `json:"recovered_on_restart"`
	Lost                   int      `json:"lost"`
	Redelivered            int      `json:"redelivered"`
	PartitionMismatches    int      `json:"partition_mismatches"`
	MaxParked              int      `json:"max_parked"`
	BreakerTrips           int      `json:"bad_breaker_trips"`
	ElapsedSeconds         float64  `json:"elapsed_s"`
	DrainedSeconds         float64  `json:"drained_after_deadline_s"`
	ReadBackSeconds        float64  `json:"read_back_s"`
}

func secs(d time.Duration) float64 { return math.Round(d.Seconds()*10) / 10 }

func (b *BrokerResult) runJSON(m Mode) RunJSON {
	r, bl := b.Runs[m], b.Runs[Baseline]
	j := RunJSON{
		Produced:               r.Produced,
		HealthyGoodput:         r.HealthyGoodput,
		HealthyGoodputRatio:    jsonFloat(ratio(r.HealthyGoodput, bl.HealthyGoodput)),
		MatesGoodput:           r.MatesGoodput,
		MatesGoodputRatio:      jsonFloat(ratio(r.MatesGoodput, bl.MatesGoodput)),
		HealthyP99Ms:           jsonMs(r.HealthyP99),
		HealthyP99Ratio:        jsonFloat(p99Ratio(r, bl, false)),
		HealthyLatencyMessages: r.HealthyN,
		MatesP99Ms:             jsonMs(r.MatesP99),
		MatesP99Ratio:          jsonFloat(p99Ratio(r, bl, true)),
		MatesLatencyMessages:   r.MatesN,
		MatesFromBrokerP99Ms:   jsonMs(r.MatesFromBrokerP99),
		MatesFromBrokerRatio:   jsonFloat(fromBrokerRatio(r, bl)),
		MaxCommitLagFault:      r.MaxLagFault,
		MaxCommitLagRun:        r.MaxLagRun,
		LagSamples:             r.LagSamples,
		PeakHeapBytes:          r.HeapPeak,
		ConsumerHeapBytes:      r.ConsumerHeap,
		BadParked:              jsonInt(r.BadParked, m != Shared),
		BadDeadLettered:        r.BadDead,
		PoisonDeadLettered:     r.PoisonDead,
		OtherDeadLettered:      r.OtherDead,
		GoodDeadLettered:       r.GoodDead,
		BurstPoison:            r.BurstPoison,
		BurstDeadLettered:      r.BurstDead,
		BadAfterP99Ms:          jsonMs(r.BadAfterP99),
		BadAfterP99Ratio:       jsonFloat(latencyRatio(r.BadAfterP99, bl.BadAfterP99, r.BadAfterN, bl.BadAfterN)),
		BadOrderChecked:        r.BadInOrder,
		BadOutOfOrder:          r.BadOutOfOrder,
		UnfinishedAtDeadline:   r.UnfinishedAtDeadline,
		UnfinishedAfterDrain:   r.UnfinishedAfterDrain,
		RecoveredOnRestart:     r.Recovered,
		Lost:                   r.Lost,
		Redelivered:            r.Redelivered,
		PartitionMismatches:    r.PartitionMismatches,
		MaxParked:              r.MaxParked,
		BreakerTrips:           r.SharedTrips,
		ElapsedSeconds:         secs(r.Elapsed),
		DrainedSeconds:         secs(r.Drained),
		ReadBackSeconds:        secs(r.ReadBack),
	}
	if m != Shared {
		j.BreakerTrips = b.badTenant(m).Trips
	}
	afterEnd := func(d time.Duration) *float64 {
		if r.BurstPoison == 0 || d == never {
			return nil
		}
		ms := round3(float64(d-b.Sc.FaultEnd) / float64(time.Millisecond))
		return &ms
	}
	j.BurstFirstDeadAfterMs, j.BurstLastDeadAfterMs = afterEnd(r.BurstFirstAfter), afterEnd(r.BurstLastDead)
	return j
}

func (b *BrokerResult) badTenant(m Mode) TenantResult {
	for _, t := range b.Runs[m].Tenants {
		if t.Tenant == b.Bad {
			return t
		}
	}
	return TenantResult{}
}

// lagMeasure says what the commit lag is on b's broker.
func (b *BrokerResult) lagMeasure() string {
	if b.Broker == "nats" {
		return "NumPending + NumAckPending of the durable consumer (ConsumerInfo)"
	}
	return "log end offset - committed offset, largest partition"
}

// timestampMeaning says what a message's broker timestamp is on b.
func (b *BrokerResult) timestampMeaning() string {
	switch b.Broker {
	case "nats":
		return "when the server stored the message"
	case "kafka":
		return "the record's timestamp (which the producer's client sets as it encodes the batch)"
	}
	return "the message's timestamp, if any (else end to end)"
}

// JSON returns the --json object of b.
func (b *BrokerResult) JSON() JSONReport {
	pt, sh, bl := b.Runs[PerTenant], b.Runs[Shared], b.Runs[Baseline]
	r := JSONReport{
		Broker:                b.Broker,
		Tenants:               len(b.Tenants),
		RatePerTenant:         b.Sc.Rate,
		DurationSeconds:       b.Sc.Duration.Seconds(),
		FaultWindowSeconds:    [2]float64{b.Sc.FaultStart.Seconds(), b.Sc.FaultEnd.Seconds()},
		OutageTenant:          b.Bad,
		PoisonTenant:          b.Poison,
		Produced:              pt.Produced,
		PoisonSent:            b.Sent,
		HealthyGoodput:        map[string]int{"baseline": bl.HealthyGoodput, "ringfence": pt.HealthyGoodput},
		HealthyRatioPerTenant: jsonFloat(ratio(pt.HealthyGoodput, bl.HealthyGoodput)),
		TransientDeadLettered: pt.BadDead,
		PoisonDeadLettered:    pt.PoisonDead,
		Lost:                  pt.Lost,
		LostBaseline:          bl.Lost,
		Redelivered:           bl.Redelivered + pt.Redelivered + sh.Redelivered,
		ElapsedSeconds:        secs(b.Elapsed),

		Scenario:       string(b.Sc.Kind),
		Policy:         b.Sc.PolicyName,
		BrokerProcess:  b.Where,
		Partitions:     b.Sc.Partitions,
		PartitionKeyed: b.Keyed,
		BadTenant:      b.Bad,
		BadRole:        b.Sc.Kind.Role(),
		BadWeight:      b.Sc.BadWeight,
		BadPartition:   b.BadPartition,
		PartitionMates: b.Mates,
		LagMeasure:     b.lagMeasure(),
		Runs:           map[string]RunJSON{},
		Checks:         b.Checks(),
	}
	if r.PartitionMates == nil {
		r.PartitionMates = []string{}
	}
	if sh.Ran {
		r.HealthyGoodput["shared"] = sh.HealthyGoodput
		r.HealthyRatioShared = jsonFloat(ratio(sh.HealthyGoodput, bl.HealthyGoodput))
		r.TransientDeadLetteredShared = &sh.BadDead
		r.PoisonDeadLetteredShared = &sh.PoisonDead
		r.LostShared = &sh.Lost
		r.SharedBreakerTrips = &sh.SharedTrips
	}
	bad := b.badTenant(PerTenant)
	r.OutageTenantTrips, r.OutageTenantMaxParked = bad.Trips, bad.MaxParked
	for _, m := range Modes {
		if b.Runs[m].Ran {
			r.Runs[m.String()] = b.runJSON(m)
		}
	}
	r.OK = true
	for _, c := range r.Checks {
		r.OK = r.OK && c.OK
	}
	return r
}

// Formatting of figures in tables.

func fmtRatio(r float64) string {
	switch {
	case math.IsNaN(r):
		return "n/a"
	case math.IsInf(r, 1):
		return "inf"
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func fmtLatency(d time.Duration) string {
	switch {
	case d == never:
		return "never"
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func fmtBytes(n uint64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// describe is the scenario's fault in words.
func (b *BrokerResult) describe() string {
	sc := b.Sc
	win := fmt.Sprintf("%.1fs–%.1fs", sc.FaultStart.Seconds(), sc.FaultEnd.Seconds())
	switch sc.Kind {
	case KindSlow:
		return fmt.Sprintf("%s's calls take %v %s", b.Bad, sc.SlowLatency, win)
	case KindHang:
		return fmt.Sprintf("%s's calls block until cancelled %s", b.Bad, win)
	case KindHot:
		return fmt.Sprintf("%s sends %dx its rate %s", b.Bad, sc.HotFactor, win)
	case KindPoisonBurst:
		return fmt.Sprintf("%s sends only poison messages (policy.Permanent) %s", b.Bad, win)
	case KindDLQOutage:
		return fmt.Sprintf("%s sends only poison messages (policy.Permanent) %s while the DLQ refuses writes", b.Bad, win)
	}
	return fmt.Sprintf("%s's dependency down %s", b.Bad, win)
}

// WriteSummary prints the side-by-side summary of one broker.
func (b *BrokerResult) WriteSummary(w io.Writer) {
	sc := b.Sc
	fmt.Fprintf(w, "\n%s — scenario %s: %d tenants × %d msg/s (%s ×%d) for %v; %s",
		b.Broker, sc.Kind, len(b.Tenants), sc.Rate, b.Bad, sc.BadWeight, sc.Duration, b.describe())
	if b.Poison != "" {
		fmt.Fprintf(w, "; %s sends %d poison messages", b.Poison, b.Sent)
	}
	fmt.Fprintf(w, "; policy %s\n", sc.PolicyName)
	if b.Keyed {
		fmt.Fprintf(w, "tenants keyed onto %d partitions; partition-mates of %s (partition %d): %s\n",
			sc.Partitions, b.Bad, b.BadPartition, orNone(b.Mates))
	} else {
		fmt.Fprintf(w, "one stream and consumer: every healthy tenant is a partition-mate of %s\n", b.Bad)
	}
	fmt.Fprintf(w, "broker: %s; the heap figures are the demo process's, which runs the consumer\n\n", b.Where)

	modes := b.ran()
	// Per-tenant table.
	block := 10 * len(modes)
	fmt.Fprintf(w, "%26s%*s %*s %11s\n", "", block, "goodput in fault window", block, "dead-lettered", "ringfence")
	fmt.Fprintf(w, "%-12s %-7s %4s ", "tenant", "role", "part")
	for _, m := range modes {
		fmt.Fprintf(w, " %9s", m)
	}
	fmt.Fprint(w, " ")
	for _, m := range modes {
		fmt.Fprintf(w, " %9s", m)
	}
	fmt.Fprintf(w, " %11s %6s\n", "max parked", "trips")
	for i, name := range b.Tenants {
		pt := b.Runs[PerTenant].Tenants[i]
		role := pt.Role
		if pt.Mate && b.Keyed {
			role = "mate"
		}
		part := "-"
		if pt.Partition >= 0 {
			part = fmt.Sprint(pt.Partition)
		}
		fmt.Fprintf(w, "%-12s %-7s %4s ", name, role, part)
		for _, m := range modes {
			fmt.Fprintf(w, " %9d", b.Runs[m].Tenants[i].InWindow)
		}
		fmt.Fprint(w, " ")
		for _, m := range modes {
			fmt.Fprintf(w, " %9d", b.Runs[m].Tenants[i].DeadLettered)
		}
		fmt.Fprintf(w, " %11d %6d\n", pt.MaxParked, pt.Trips)
	}
	fmt.Fprintln(w)

	// Figures side by side.
	fmt.Fprintf(w, "%-40s", "")
	for _, m := range modes {
		label := m.String()
		if m == Shared {
			label = "shared breaker"
		}
		fmt.Fprintf(w, " %14s", label)
	}
	fmt.Fprintln(w)
	bl := b.Runs[Baseline]
	row := func(label string, f func(r RunResult) string) {
		fmt.Fprintf(w, "%-40s", label)
		for _, m := range modes {
			fmt.Fprintf(w, " %14s", f(b.Runs[m]))
		}
		fmt.Fprintln(w)
	}
	row("healthy goodput during the fault", func(r RunResult) string { return fmt.Sprint(r.HealthyGoodput) })
	row("  ratio to baseline", func(r RunResult) string { return fmtRatio(ratio(r.HealthyGoodput, bl.HealthyGoodput)) })
	row("partition-mates goodput during the fault", func(r RunResult) string { return fmt.Sprint(r.MatesGoodput) })
	row("  ratio to baseline", func(r RunResult) string { return fmtRatio(ratio(r.MatesGoodput, bl.MatesGoodput)) })
	row("healthy p99 end to end (fault window)", func(r RunResult) string { return fmtLatency(r.HealthyP99) })
	row("  ratio to baseline", func(r RunResult) string { return fmtRatio(p99Ratio(r, bl, false)) })
	row("partition-mates p99 end to end", func(r RunResult) string { return fmtLatency(r.MatesP99) })
	row("  ratio to baseline", func(r RunResult) string { return fmtRatio(p99Ratio(r, bl, true)) })
	row("  p99 from the broker's timestamp", func(r RunResult) string { return fmtLatency(r.MatesFromBrokerP99) })
	row("  ratio to baseline", func(r RunResult) string { return fmtRatio(fromBrokerRatio(r, bl)) })
	row("largest commit lag during the fault", func(r RunResult) string { return fmt.Sprint(r.MaxLagFault) })
	row("largest commit lag, whole run", func(r RunResult) string { return fmt.Sprint(r.MaxLagRun) })
	row("peak consumer heap (growth in run)", func(r RunResult) string { return fmtBytes(r.ConsumerHeap) })
	row(b.Bad+" parked (events)", func(r RunResult) string {
		if r.Mode == Shared {
			return "-"
		}
		return fmt.Sprint(r.BadParked)
	})
	row(b.Bad+" dead-lettered", func(r RunResult) string { return fmt.Sprint(r.BadDead) })
	if sc.Kind.poisons() {
		row("  poison of its burst dead-lettered", func(r RunResult) string { return fmt.Sprintf("%d/%d", r.BurstDead, r.BurstPoison) })
		if sc.Kind.dlqDown() {
			row("  the first after the "+b.burstEnd(), func(r RunResult) string {
				if r.BurstFirstAfter == never {
					return "-"
				}
				return fmtAfter(r.BurstFirstAfter - sc.FaultEnd)
			})
		}
		row("  the last after the "+b.burstEnd(), func(r RunResult) string {
			if r.BurstPoison == 0 {
				return "-"
			}
			return fmtAfter(r.BurstLastDead - sc.FaultEnd)
		})
		row(b.Bad+" p99 after the burst", func(r RunResult) string { return fmtLatency(r.BadAfterP99) })
		row("  ratio to baseline", func(r RunResult) string {
			return fmtRatio(latencyRatio(r.BadAfterP99, bl.BadAfterP99, r.BadAfterN, bl.BadAfterN))
		})
		row("good messages dead-lettered", func(r RunResult) string { return fmt.Sprint(r.GoodDead) })
	}
	row(b.Bad+" out of order / checked", func(r RunResult) string { return fmt.Sprintf("%d/%d", r.BadOutOfOrder, r.BadInOrder) })
	if b.Poison != "" {
		row("poison dead-lettered", func(r RunResult) string { return fmt.Sprintf("%d/%d", r.PoisonDead, b.Sent) })
	}
	row("healthy tenants dead-lettered", func(r RunResult) string { return fmt.Sprint(r.OtherDead) })
	row("max parked", func(r RunResult) string { return fmt.Sprint(r.MaxParked) })
	row("unfinished at deadline", func(r RunResult) string { return fmt.Sprint(r.UnfinishedAtDeadline) })
	row("unfinished after the drain", func(r RunResult) string { return fmt.Sprint(r.UnfinishedAfterDrain) })
	row("  found again by a restart", func(r RunResult) string { return fmt.Sprint(r.Recovered) })
	row("lost", func(r RunResult) string { return fmt.Sprint(r.Lost) })
	row("run time (of it: drain after deadline)", func(r RunResult) string {
		return fmt.Sprintf("%.0fs (%.0fs)", r.Elapsed.Seconds(), r.Drained.Seconds())
	})
	fmt.Fprintf(w, "\ncommit lag: %s, sampled every %v.", b.lagMeasure(), lagEvery)
	fmt.Fprintf(w, " p99: messages produced during the fault, produce stamp to first handled; never = not handled by the end of the drain.")
	fmt.Fprintf(w, " from the broker's timestamp: the same messages' p99 from %s to first handled, the consumer's part.", b.timestampMeaning())
	fmt.Fprintf(w, " unfinished: neither handled nor dead-lettered (at the deadline, %v after production; after the drain); lost: not even a restart of the group found it.", sc.Settle)
	if b.Runs[Shared].Ran {
		fmt.Fprint(w, " shared breaker: one key for every message, so one guard and one ordered lane per partition.")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "\nchecks (ringfence run):")
	for _, c := range b.Checks() {
		mark := "ok  "
		switch {
		case c.Skipped:
			mark = "skip"
		case !c.OK:
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %s: %s (want %s)\n", mark, c.Name, c.Value, c.Limit)
	}
}

// ran lists the modes that ran, in order.
func (b *BrokerResult) ran() []Mode {
	var out []Mode
	for _, m := range Modes {
		if b.Runs[m].Ran {
			out = append(out, m)
		}
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
