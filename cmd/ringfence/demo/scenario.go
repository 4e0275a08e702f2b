package demo

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/ringfence/ringfence/policy"
)

// Kind names a scenario: what goes wrong for the bad tenant.
type Kind string

// The scenarios. Each has one bad tenant (four times bigger than the others
// by default) and a fault window in the middle of the run.
const (
	// KindOutage: the bad tenant's dependency fails for a short window
	// (25%–65% of an 8s run). The demo's story, run with the shared breaker
	// beside it.
	KindOutage Kind = "outage"
	// KindLongOutage: the same failure for a long time (Scenario.Fault, 5m
	// by default), with 10s of traffic before it and 20s after.
	KindLongOutage Kind = "long-outage"
	// KindSlow: the bad tenant's calls take SlowLatency (500ms) instead of
	// failing.
	KindSlow Kind = "slow"
	// KindHang: the bad tenant's calls block until their ctx is cancelled.
	KindHang Kind = "hang"
	// KindHot: the bad tenant sends HotFactor (20) times its rate, every
	// call succeeding.
	KindHot Kind = "hot"
	// KindPoisonBurst: every message the bad tenant sends during the fault
	// (a burst of 30s) is poison, which its handler rejects with
	// policy.Permanent; before and after it, its messages are good.
	KindPoisonBurst Kind = "poison-burst"
	// KindDLQOutage: the same burst of poison (60s), while the DLQ refuses
	// every write; it comes back when the burst ends.
	KindDLQOutage Kind = "dlq-outage"
)

// Kinds lists the scenarios in the order the help text gives them.
var Kinds = []Kind{KindOutage, KindLongOutage, KindSlow, KindHang, KindHot, KindPoisonBurst, KindDLQOutage}

// ParseKind returns the scenario named s.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == strings.ToLower(s) {
			return k, nil
		}
	}
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("demo: unknown scenario %q (want one of %s)", s, strings.Join(names, ", "))
}

// Role is the bad tenant's label in tables: "outage", "slow", "hang",
// "hot" or "burst" (a burst of poison, with or without a DLQ outage).
func (k Kind) Role() string {
	switch k {
	case KindLongOutage:
		return "outage"
	case KindPoisonBurst, KindDLQOutage:
		return "burst"
	}
	return string(k)
}

// fails reports whether the bad tenant's calls fail during the fault.
func (k Kind) fails() bool { return k == KindOutage || k == KindLongOutage }

// poisons reports whether the bad tenant's messages are poison during the
// fault (a permanent failure of each message, not of its dependency).
func (k Kind) poisons() bool { return k == KindPoisonBurst || k == KindDLQOutage }

// dlqDown reports whether the DLQ refuses writes during the fault.
func (k Kind) dlqDown() bool { return k == KindDLQOutage }

// inPlan reports whether the fault is in the traffic itself (a burst of
// messages, or of poison ones), so that the faulty run has a plan of its
// own.
func (k Kind) inPlan() bool { return k == KindHot || k.poisons() }

// timing is a kind's default traffic before (lead) and after (tail) its
// fault, and the fault's default length. The outage kind keeps the original
// demo's proportions instead (see Scenario.withDefaults).
func (k Kind) timing() (lead, fault, tail time.Duration) {
	switch k {
	case KindLongOutage:
		return 10 * time.Second, 5 * time.Minute, 20 * time.Second
	case KindSlow, KindHang:
		return 5 * time.Second, 30 * time.Second, 10 * time.Second
	case KindHot:
		return 5 * time.Second, 60 * time.Second, 10 * time.Second
	case KindPoisonBurst:
		return 5 * time.Second, 30 * time.Second, 15 * time.Second
	case KindDLQOutage:
		return 5 * time.Second, 60 * time.Second, 20 * time.Second
	}
	return 0, 0, 0
}

// Scenario is the traffic and the fault of one demo. Zero fields mean the
// defaults written on each.
type Scenario struct {
	// Kind is the fault. Zero means KindOutage.
	Kind Kind
	// Tenants is how many tenants send traffic. Zero means 20; at least 3.
	Tenants int
	// Rate is the messages per second each tenant sends. Zero means 25.
	Rate int
	// Duration is how long traffic is produced in each run. Zero means 8s
	// for outage, and lead + Fault + tail for the other kinds (long-outage:
	// 10s + 5m + 20s; slow, hang: 5s + 30s + 10s; hot: 5s + 60s + 10s;
	// poison-burst: 5s + 30s + 15s; dlq-outage: 5s + 60s + 20s).
	Duration time.Duration
	// Fault is the length of the fault window. Zero means 40% of Duration
	// for outage, 5m for long-outage, 30s for slow, hang and poison-burst,
	// 60s for hot and dlq-outage.
	Fault time.Duration
	// FaultStart and FaultEnd bound the fault window, from the start of
	// the run. Zero (both) means: outage, from 25% of Duration for Fault;
	// the other kinds, from the lead (10s for long-outage, else 5s; a third
	// of the time around the fault when Duration leaves less than the
	// lead and tail).
	FaultStart, FaultEnd time.Duration
	// BadWeight multiplies the bad tenant's rate: it is a big tenant, the
	// noisy neighbour. Zero means 4.
	BadWeight int
	// PoisonEvery makes every PoisonEvery-th message of the poison tenant a
	// poison message. Zero means 20 for outage and none for the other kinds
	// (each of them measures one fault); negative means none.
	PoisonEvery int
	// Partitions is the partition count of the Kafka topic. Zero means 4.
	Partitions int
	// Latency is the simulated dependency's least latency; each call takes
	// between Latency and twice it. Zero means 1ms.
	Latency time.Duration
	// Instant makes the ordinary calls return at once instead (Latency is
	// then used only to size the drain): calls of microseconds, which the
	// engine runs as quick tenants (a few workers, see the README's
	// "Workers for quick tenants").
	Instant bool
	// SlowLatency is how long the slow tenant's calls take during the
	// fault. Zero means 500ms.
	SlowLatency time.Duration
	// HotFactor multiplies the hot tenant's rate during the fault. Zero
	// means 20.
	HotFactor int
	// Settle is the run's deadline after production ends: what is neither
	// handled nor dead-lettered then is "unfinished at deadline". Zero
	// means 30s.
	Settle time.Duration
	// Drain bounds how long the run keeps consuming after its deadline
	// while it still makes progress. Zero means 5m, or for hot the time
	// the hot tenant's fault traffic may take to handle in order (3
	// Latency a message) when longer.
	Drain time.Duration
	// Stall ends the drain early when nothing was settled for this long.
	// Zero means 15s, or longer when the policy's breaker may stay open
	// longer (its longest open period plus an attempt's timeout, and 5s).
	Stall time.Duration
	// ReadBack bounds the restart read-back: a fresh consumer of the same
	// group looking for what the run left unfinished. It is never shorter
	// than the broker's redelivery delay plus 15s (NATS redelivers a
	// message held by a stopped consumer only after the AckWait, 30s), so
	// nothing is called lost that the broker still holds. Zero means 45s.
	ReadBack time.Duration
	// ShutdownTimeout is the consumers' DrainTimeout: how long a stopping
	// consumer waits for its handlers before it cancels their ctx. Zero
	// means 5s.
	ShutdownTimeout time.Duration
	// Policy is the per-tenant (or shared) guard template. Nil means
	// DemoPolicy() for outage and long-outage, and policy.Default() for
	// the other kinds (they measure the consumer's defaults).
	Policy *policy.Policy
	// PolicyName labels Policy in the summary. Empty means "demo",
	// "default" or "custom" as the case is.
	PolicyName string
}

func (s Scenario) withDefaults() Scenario {
	if s.Kind == "" {
		s.Kind = KindOutage
	}
	if s.Tenants == 0 {
		s.Tenants = 20
	}
	if s.Rate == 0 {
		s.Rate = 25
	}
	if s.FaultStart == 0 && s.FaultEnd == 0 {
		if s.Kind == KindOutage {
			if s.Duration == 0 {
				// The fault from 25% to 65% of the run.
				s.Duration = 8 * time.Second
				if s.Fault > 0 {
					s.Duration = s.Fault * 5 / 2
				}
			}
			s.FaultStart = s.Duration / 4
			if s.Fault == 0 {
				s.Fault = s.Duration*65/100 - s.FaultStart
			}
		} else {
			lead, fault, tail := s.Kind.timing()
			if s.Fault == 0 {
				s.Fault = fault
			}
			if s.Duration == 0 {
				s.Duration = lead + s.Fault + tail
			} else if spare := s.Duration - s.Fault; spare > 0 && spare < lead+tail {
				// A shorter run (tests): the fault in the middle of what
				// is left around it.
				lead = spare / 3
			}
			s.FaultStart = lead
		}
		s.FaultEnd = s.FaultStart + s.Fault
	} else {
		s.Fault = s.FaultEnd - s.FaultStart
	}
	if s.Duration == 0 {
		s.Duration = 8 * time.Second
	}
	if s.PoisonEvery == 0 && s.Kind == KindOutage {
		s.PoisonEvery = 20
	}
	if s.BadWeight == 0 {
		s.BadWeight = 4
	}
	if s.Partitions == 0 {
		s.Partitions = 4
	}
	if s.Latency == 0 {
		s.Latency = time.Millisecond
	}
	if s.SlowLatency == 0 {
		s.SlowLatency = 500 * time.Millisecond
	}
	if s.HotFactor == 0 {
		s.HotFactor = 20
	}
	if s.Settle == 0 {
		s.Settle = 30 * time.Second
	}
	if s.ReadBack == 0 {
		s.ReadBack = 45 * time.Second
	}
	if s.ShutdownTimeout == 0 {
		s.ShutdownTimeout = 5 * time.Second
	}
	if s.Policy == nil {
		var p policy.Policy
		if s.Kind.fails() {
			p, s.PolicyName = DemoPolicy(), "demo"
		} else {
			p, s.PolicyName = policy.Default(), "default"
		}
		s.Policy = &p
	} else if s.PolicyName == "" {
		s.PolicyName = "custom"
	}
	if s.Stall == 0 {
		s.Stall = max(15*time.Second, quietBound(*s.Policy)+5*time.Second)
	}
	if s.Drain == 0 {
		s.Drain = max(5*time.Minute, s.hotWork())
	}
	return s
}

// hotWork is a generous bound on the time the hot tenant's fault traffic
// takes to handle after the fault: its lane (one partition, in order)
// handles one call at a time, each of Latency to twice it, so the
// messages it sends during the fault take up to 2 Latency each, and timers
// and a busy machine add about as much again. A 5-minute hot fault makes
// 600,000 such messages: ~16 minutes of work in order, which a 5-minute
// drain would cut short and call unfinished. The drain ends as soon
// as everything is done or nothing progresses for Stall, so a long bound
// costs nothing when the run goes well. Zero for the other kinds.
func (s Scenario) hotWork() time.Duration {
	if s.Kind != KindHot {
		return 0
	}
	n := s.Rate * s.BadWeight * s.HotFactor * int(s.Fault/time.Second)
	return time.Duration(n) * 3 * s.Latency
}

// quietBound is the longest a guard of p may legitimately handle nothing
// for a tenant once its dependency is back: a probe admitted just before
// the fault ended can hang for its attempt's whole timeout, and the
// breaker it trips again stays open for its longest period (the open
// period doubles on each failed probe, up to MaxOpenTimeout). A 5-minute
// hang under policy.Default() ends with the breaker open for up to 1
// minute after a 10s probe; a drain that gave up after 15s without
// progress called that tenant's messages unfinished. Zero when p has no
// breaker.
func quietBound(p policy.Policy) time.Duration {
	if p.Breaker == nil {
		return 0
	}
	open := cmp.Or(p.Breaker.OpenTimeout, 5*time.Second)
	open = max(open, cmp.Or(p.Breaker.MaxOpenTimeout, time.Minute))
	attempt := p.AttemptTimeout
	if p.Deadline > 0 && (attempt <= 0 || p.Deadline < attempt) {
		attempt = p.Deadline
	}
	return open + max(attempt, 0)
}

// maxDuration bounds a run's traffic time: a long outage of up to an hour
// with its lead and tail.
const maxDuration = 2 * time.Hour

func (s Scenario) validate() error {
	if _, err := ParseKind(string(s.Kind)); err != nil {
		return err
	}
	switch {
	case s.Tenants < 3:
		return fmt.Errorf("demo: at least 3 tenants are needed (one bad, one poison, one healthy), got %d", s.Tenants)
	case s.Tenants > 10000:
		return fmt.Errorf("demo: at most 10000 tenants, got %d", s.Tenants)
	case s.Rate < 1 || s.Rate > 1000:
		return fmt.Errorf("demo: rate must be in [1, 1000] per tenant, got %d", s.Rate)
	case s.Duration < time.Second || s.Duration > maxDuration:
		return fmt.Errorf("demo: duration must be in [1s, %v], got %v", maxDuration, s.Duration)
	case s.FaultStart < 0 || s.FaultEnd <= s.FaultStart || s.FaultEnd > s.Duration:
		return fmt.Errorf("demo: fault window [%v, %v) must lie within the duration %v", s.FaultStart, s.FaultEnd, s.Duration)
	case s.BadWeight < 1 || s.BadWeight > 100:
		return fmt.Errorf("demo: the bad tenant's weight must be in [1, 100], got %d", s.BadWeight)
	case s.PoisonEvery == 1:
		return fmt.Errorf("demo: PoisonEvery must be at least 2, got %d", s.PoisonEvery)
	case s.Partitions < 1 || s.Partitions > 1000:
		return fmt.Errorf("demo: partitions must be in [1, 1000], got %d", s.Partitions)
	case s.Latency < 0 || s.Latency > time.Second:
		return fmt.Errorf("demo: latency must be in [0, 1s], got %v", s.Latency)
	case s.SlowLatency <= 0 || s.SlowLatency > time.Minute:
		return fmt.Errorf("demo: slow latency must be in (0, 1m], got %v", s.SlowLatency)
	case s.HotFactor < 1 || s.HotFactor > 1000:
		return fmt.Errorf("demo: hot factor must be in [1, 1000], got %d", s.HotFactor)
	case s.Settle < 0 || s.Drain < 0 || s.Stall < 0 || s.ReadBack < 0 || s.ShutdownTimeout < 0:
		return fmt.Errorf("demo: settle, drain, stall, read-back and shutdown bounds must not be negative")
	}
	// The hot tenant's messages are ids in one plan: keep a run's plan
	// within what a demo process should hold (about 50 bytes a message).
	if n := s.messages(); n > maxMessages {
		return fmt.Errorf("demo: the scenario produces about %d messages per run, more than %d: lower the rate, tenants or duration", n, maxMessages)
	}
	return nil
}

// maxMessages bounds a run's plan (a few hundred MB of bookkeeping at most).
const maxMessages = 5_000_000

// messages estimates the messages of the faulty run of s.
func (s Scenario) messages() int {
	perSec := float64(s.Rate) * float64(s.Tenants-1+s.BadWeight)
	n := perSec * s.Duration.Seconds()
	if s.Kind == KindHot {
		n += float64(s.Rate*s.BadWeight*(s.HotFactor-1)) * s.Fault.Seconds()
	}
	return int(n)
}

// DemoPolicy is the guard template of the outage scenarios: a breaker that
// opens after 5 consecutive failures or a failure ratio of 25% over 2s (at
// least 20 calls), for 500ms doubling up to 2s; 3 attempts with exponential
// backoff from 20ms; and a 1s deadline.
func DemoPolicy() policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{
			ConsecutiveFailures: 5,
			FailureRatio:        0.25, Window: 2 * time.Second, MinRequests: 20,
			OpenTimeout: 500 * time.Millisecond, MaxOpenTimeout: 2 * time.Second,
		},
		Retry: policy.Retry{
			MaxAttempts: 3,
			Backoff:     policy.Backoff{Kind: policy.Exponential, Base: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		},
		Deadline: time.Second,
	}
}

// Mode is how a run guards its handler.
type Mode int

// Modes, in the order the demo runs them.
const (
	// Baseline: per-tenant guards and no fault.
	Baseline Mode = iota
	// PerTenant: per-tenant guards (ringfence) with the fault.
	PerTenant
	// Shared: one guard for every message with the fault.
	Shared
)

// Modes lists the modes in run order.
var Modes = []Mode{Baseline, PerTenant, Shared}

// defaultModes are the runs of a scenario: the shared breaker runs beside
// the outage only (it is the demo's story; for the other faults it adds
// little but time).
func defaultModes(k Kind) []Mode {
	if k == KindOutage {
		return Modes
	}
	return []Mode{Baseline, PerTenant}
}

func (m Mode) String() string {
	switch m {
	case Baseline:
		return "baseline"
	case PerTenant:
		return "ringfence"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Title describes the mode in a sentence fragment.
func (m Mode) Title() string {
	switch m {
	case Baseline:
		return "baseline: per-tenant guards, no fault"
	case PerTenant:
		return "ringfence: per-tenant guards, fault"
	case Shared:
		return "shared: one breaker for every tenant, fault"
	}
	return m.String()
}
