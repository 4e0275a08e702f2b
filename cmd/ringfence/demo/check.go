package demo

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The thresholds of --check: what a tenant's fault may cost the others.
const (
	// MinGoodputRatio is the least healthy goodput during the fault, as a
	// fraction of the no-fault run's, for all healthy tenants and for the
	// bad tenant's partition-mates.
	MinGoodputRatio = 0.95
	// MaxP99Ratio is the most the healthy p99 end-to-end latency during the
	// fault may be, as a multiple of the no-fault run's (slow, hang, hot;
	// long-outage for the partition-mates).
	MaxP99Ratio = 2.0
	// BurstDrainBound is how long after the end of a poison burst its last
	// poison message may be dead-lettered (poison-burst): the tenant
	// drains at the speed its DLQ takes writes, its breaker shut.
	BurstDrainBound = 10 * time.Second
	// DLQReturnBound is how long after the DLQ comes back the last poison
	// message of the burst sent while it was down may be dead-lettered
	// (dlq-outage): the engine probes the DLQ about once a second and then
	// drains the tenant's spill log at the DLQ's speed.
	DLQReturnBound = 15 * time.Second
)

// LongOutageMaxLag, when the check is given no bound (--lag-bound 0, the
// default), means the bound is derived from the traffic and the engine's
// limits (lagBoundFor): a stuck tenant holds its partition's commit until
// it spills, at most StuckAfter (10s by default; sooner once it parks
// MaxParkedPerTenant messages), so the committed offset trails the log end
// by at most what the partition receives in that time, plus a second for
// the spill append, the demo's commit interval (250ms) and the lag
// sampler (500ms).
const LongOutageMaxLag int64 = 0

// lagBoundFor is the long-outage lag bound of plan p placed by g: the
// busiest partition's messages in StuckAfter plus a second.
func lagBoundFor(p *plan, g groups) int64 {
	perPart := map[int]int{}
	for _, t := range p.owner {
		part := 0
		if g.keyed {
			part = g.part[t]
		}
		perPart[part]++
	}
	most := 0
	for _, n := range perPart {
		most = max(most, n)
	}
	rate := float64(most) / p.sc.Duration.Seconds()
	return int64(rate * (engineStuckAfter + time.Second).Seconds())
}

// engineStuckAfter is consumer.Config.StuckAfter's default, which the demo
// keeps.
const engineStuckAfter = 10 * time.Second

// Check is one acceptance condition of --check, on the ringfence run
// unless its name says otherwise.
type Check struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Skipped: the condition cannot be judged in this run (e.g. no
	// partition-mates); it does not fail the check.
	Skipped bool   `json:"skipped,omitempty"`
	Value   string `json:"value"`
	Limit   string `json:"limit"`
}

// ratio is a/b, or NaN when b is 0.
func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// p99Ratio is the run's p99 over the baseline's: +Inf when the run's 99th
// percentile message was never handled, NaN when either has no messages.
func p99Ratio(run, base RunResult, mates bool) float64 {
	if mates {
		return latencyRatio(run.MatesP99, base.MatesP99, run.MatesN, base.MatesN)
	}
	return latencyRatio(run.HealthyP99, base.HealthyP99, run.HealthyN, base.HealthyN)
}

// fromBrokerRatio is p99Ratio of the partition-mates' latency from the
// broker's timestamp.
func fromBrokerRatio(run, base RunResult) float64 {
	return latencyRatio(run.MatesFromBrokerP99, base.MatesFromBrokerP99, run.MatesN, base.MatesN)
}

// latencyRatio is r over b, latencies of rn and bn messages: +Inf when r
// never ended, NaN when either has no messages or b is not a latency.
func latencyRatio(r, b time.Duration, rn, bn int) float64 {
	switch {
	case rn == 0 || bn == 0 || b == 0 || b == never:
		return math.NaN()
	case r == never:
		return math.Inf(1)
	}
	return float64(r) / float64(b)
}

// Checks returns the acceptance conditions of b's scenario, judged.
func (b *BrokerResult) Checks() []Check {
	pt, bl := b.Runs[PerTenant], b.Runs[Baseline]
	k := b.Sc.Kind
	var cs []Check
	add := func(c Check) { cs = append(cs, c) }
	hasMates := len(b.Mates) > 0
	noMates := Check{Skipped: true, OK: true, Value: "no partition-mates", Limit: fmt.Sprintf("no healthy tenant shares %s's partition", b.Bad)}

	goodput := func(name string, run, base int) Check {
		r := ratio(run, base)
		c := Check{Name: name, Value: fmtRatio(r), Limit: fmt.Sprintf(">= %.2f", MinGoodputRatio)}
		c.OK = r >= MinGoodputRatio
		if math.IsNaN(r) {
			c.Value = "baseline handled nothing in the window"
		}
		return c
	}
	add(goodput("healthy goodput during the fault / baseline", pt.HealthyGoodput, bl.HealthyGoodput))
	if hasMates {
		add(goodput("partition-mates goodput during the fault / baseline", pt.MatesGoodput, bl.MatesGoodput))
	} else {
		c := noMates
		c.Name = "partition-mates goodput during the fault / baseline"
		add(c)
	}

	p99 := func(name string, mates bool) {
		if mates && !hasMates {
			c := noMates
			c.Name = name
			add(c)
			return
		}
		r := p99Ratio(pt, bl, mates)
		run, base := pt.HealthyP99, bl.HealthyP99
		if mates {
			run, base = pt.MatesP99, bl.MatesP99
		}
		c := Check{Name: name, Value: fmt.Sprintf("%s (%s / %s)", fmtRatio(r), fmtLatency(run), fmtLatency(base)), Limit: fmt.Sprintf("<= %.1fx", MaxP99Ratio)}
		c.OK = r <= MaxP99Ratio
		if math.IsNaN(r) {
			c.Value = "no messages in the window"
		}
		add(c)
	}
	switch k {
	case KindSlow, KindHang, KindHot:
		p99("healthy p99 end-to-end / baseline", false)
		p99("partition-mates p99 end-to-end / baseline", true)
	case KindLongOutage:
		p99("partition-mates p99 end-to-end / baseline", true)
	}

	if k == KindSlow || k == KindHang {
		add(Check{Name: b.Bad + " parked (EventParked)", OK: pt.BadParked > 0, Value: fmt.Sprint(pt.BadParked), Limit: ">= 1"})
	}
	if k.poisons() {
		for _, c := range b.burstChecks() {
			add(c)
		}
	} else {
		add(Check{Name: b.Bad + " dead-lettered", OK: pt.BadDead == 0, Value: fmt.Sprint(pt.BadDead), Limit: "0 (a fault is not the message's fault)"})
	}
	add(Check{Name: b.Bad + " out of produce order", OK: pt.BadOutOfOrder == 0, Value: fmt.Sprintf("%d of %d", pt.BadOutOfOrder, pt.BadInOrder), Limit: "0 (EventReordered moves left out)"})
	add(Check{Name: "unfinished after the drain", OK: pt.UnfinishedAfterDrain == 0, Value: fmt.Sprint(pt.UnfinishedAfterDrain), Limit: "0"})
	for _, m := range Modes {
		if r := b.Runs[m]; r.Ran {
			add(Check{Name: "lost (" + m.String() + " run)", OK: r.Lost == 0, Value: fmt.Sprint(r.Lost), Limit: "0"})
		}
	}
	if b.Keyed {
		n := 0
		for _, m := range Modes {
			n += b.Runs[m].PartitionMismatches
		}
		add(Check{Name: "messages on the partition their key hashes to", OK: n == 0, Value: fmt.Sprintf("%d elsewhere", n), Limit: "0 elsewhere"})
	}
	if k == KindLongOutage {
		c := Check{Name: "largest commit lag during the outage", Value: fmt.Sprint(pt.MaxLagFault), Limit: fmt.Sprintf("<= %d (the busiest partition's messages in StuckAfter + 1s)", b.LagBound)}
		c.OK = pt.MaxLagFault <= b.LagBound && pt.LagSamples > 0
		if pt.LagSamples == 0 {
			c.Value = "not measured (no lag sample)"
		}
		add(c)
	}
	if b.HeapBudget > 0 {
		add(Check{Name: "peak consumer heap", OK: pt.ConsumerHeap <= b.HeapBudget, Value: fmtBytes(pt.ConsumerHeap), Limit: "<= " + fmtBytes(b.HeapBudget)})
	}
	return cs
}

// burstChecks are the checks of a poison burst (poison-burst, dlq-outage):
// every poison message dead-lettered within a bound of the burst's end
// (poison-burst) or of the DLQ's return (dlq-outage), which are the same
// instant; no good message dead-lettered; and, after a burst without a DLQ
// outage, the bad tenant's good messages as quick as in the baseline.
func (b *BrokerResult) burstChecks() []Check {
	pt, bl := b.Runs[PerTenant], b.Runs[Baseline]
	bound := BurstDrainBound
	if b.Sc.Kind.dlqDown() {
		bound = DLQReturnBound
	}
	last := Check{Name: "every poison message dead-lettered after the " + b.burstEnd(), Limit: fmt.Sprintf("all within %v", bound)}
	switch {
	case pt.BurstPoison == 0:
		last.Value = "no poison message produced"
	case pt.BurstDead < pt.BurstPoison || pt.BurstLastDead == never:
		last.Value = fmt.Sprintf("%d of %d dead-lettered", pt.BurstDead, pt.BurstPoison)
	default:
		after := pt.BurstLastDead - b.Sc.FaultEnd
		last.OK = after <= bound
		last.Value = fmt.Sprintf("the last %s after (%d of %d)", fmtAfter(after), pt.BurstDead, pt.BurstPoison)
		if b.Sc.Kind.dlqDown() && pt.BurstFirstAfter != never {
			last.Value = fmt.Sprintf("the first %s after, the last %s after (%d of %d)",
				fmtAfter(pt.BurstFirstAfter-b.Sc.FaultEnd), fmtAfter(after), pt.BurstDead, pt.BurstPoison)
		}
	}
	cs := []Check{last, {Name: "good messages dead-lettered", OK: pt.GoodDead == 0, Value: fmt.Sprint(pt.GoodDead), Limit: "0"}}
	if !b.Sc.Kind.dlqDown() {
		r := latencyRatio(pt.BadAfterP99, bl.BadAfterP99, pt.BadAfterN, bl.BadAfterN)
		c := Check{Name: b.Bad + "'s p99 end-to-end after the burst / baseline", Limit: fmt.Sprintf("<= %.1fx", MaxP99Ratio),
			Value: fmt.Sprintf("%s (%s / %s)", fmtRatio(r), fmtLatency(pt.BadAfterP99), fmtLatency(bl.BadAfterP99))}
		c.OK = r <= MaxP99Ratio
		if math.IsNaN(r) {
			c.Value = "no messages after the burst"
		}
		cs = append(cs, c)
	}
	return cs
}

// burstEnd names the instant a poison burst's dead letters are timed
// from: the burst's end, or the DLQ's return (the same instant) when the
// DLQ was down during it.
func (b *BrokerResult) burstEnd() string {
	if b.Sc.Kind.dlqDown() {
		return "DLQ's return"
	}
	return "burst's end"
}

// fmtAfter is a time after an instant, which may be before it.
func fmtAfter(d time.Duration) string {
	if d < 0 {
		return "-" + fmtLatency(-d)
	}
	return fmtLatency(d)
}

// asExpected reports whether every check passed.
func (b *BrokerResult) asExpected() bool {
	for _, c := range b.Checks() {
		if !c.OK {
			return false
		}
	}
	return true
}

// Verdict says in one line whether the run shows what it should.
func (b *BrokerResult) Verdict() string {
	var bad []string
	for _, c := range b.Checks() {
		if !c.OK {
			bad = append(bad, fmt.Sprintf("%s %s (want %s)", c.Name, c.Value, c.Limit))
		}
	}
	if len(bad) > 0 {
		return b.Broker + " " + string(b.Sc.Kind) + ": NOT as expected: " + strings.Join(bad, "; ")
	}
	pt := b.Runs[PerTenant]
	s := fmt.Sprintf("%s %s: healthy tenants kept %.0f%% of their goodput with per-tenant guards", b.Broker, b.Sc.Kind, 100*ratio(pt.HealthyGoodput, b.Runs[Baseline].HealthyGoodput))
	if sh := b.Runs[Shared]; sh.Ran {
		s += fmt.Sprintf(", %.0f%% with one shared breaker", 100*ratio(sh.HealthyGoodput, b.Runs[Baseline].HealthyGoodput))
	}
	if b.Sc.Kind.poisons() {
		s += fmt.Sprintf("; %s's %d poison messages dead-lettered, the last %s after the %s", b.Bad, pt.BurstPoison,
			fmtAfter(pt.BurstLastDead-b.Sc.FaultEnd), b.burstEnd())
		return s + "; no good message dead-lettered; nothing lost."
	}
	s += fmt.Sprintf("; %s dead-lettered nothing", b.Bad)
	if sh := b.Runs[Shared]; sh.Ran {
		s += fmt.Sprintf(" (shared: %d)", sh.BadDead)
	}
	return s + "; nothing lost."
}
