package policy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Validation: a Policy is checked and its defaults filled in once, by
// Compile, into the resolved form every guard of it reads.

// resolved is a Policy with every default filled in, checked once by New.
type resolved struct {
	breaker     bool
	consecutive int
	timeoutW    int64 // consecutive failures an attempt timeout counts as
	ratio       float64
	window      time.Duration
	minRequests int
	openTimeout time.Duration
	maxOpen     time.Duration
	probes      int
	exclude     func(error) bool
	// countPermanent: errors marked Permanent count toward the breaker
	// (Breaker.CountPermanent).
	countPermanent bool

	maxAttempts int
	backoff     Backoff

	budget      bool
	earnMilli   int64
	maxMilli    int64
	floorPerSec float64
	floorEvery  int64 // ns per floor retry
	floorCap    int64 // ns of floor that accrue: 1s, or one retry if slower
	quantile    float64
	sampleEvery uint32
	deadline    time.Duration

	attemptTimeout time.Duration
	// Slow calls: slowClock says how an attempt not sampled is timed for
	// the check (clockNone: slow calls off); slowFixed is the fixed
	// threshold, or math.MaxInt64 (none yet, or off); slowDerived: the
	// threshold is derived from the baseline.
	slowClock   uint8
	slowFixed   int64
	slowDerived bool
	slowFactor  float64
	slowFloor   time.Duration

	bulkhead bool // Run enforces a limit
	// plainRun: no Admit hook and no bulkhead; plainAttempt: no
	// AttemptTimeout and no hedge. Run takes the short path for each.
	plainRun      bool
	plainAttempt  bool
	maxConcurrent int
	weight        int
	adaptive      bool

	hedge        bool
	hedgeMin     time.Duration
	admit        func(context.Context) error
	before       func(context.Context, int) error
	onEvent      func(Event)
	clock        Clock
	systemClock  bool
	epoch        time.Time // origin of every guard's nanosecond clock
	originalCopy Policy
}

func invalid(field, format string, args ...any) error {
	return &InvalidPolicyError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func resolve(p Policy) (*resolved, error) {
	r := &resolved{originalCopy: p}
	// The guard keeps its own copies, so a caller changing *p.Breaker after
	// New changes neither the guard nor what Policy() reports.
	if p.Breaker != nil {
		b := *p.Breaker
		r.originalCopy.Breaker = &b
	}
	if p.Budget != nil {
		b := *p.Budget
		r.originalCopy.Budget = &b
	}
	if b := p.Breaker; b != nil {
		r.breaker = true
		switch {
		case b.ConsecutiveFailures < 0:
			return r, invalid("Breaker.ConsecutiveFailures", "must not be negative, got %d", b.ConsecutiveFailures)
		case b.FailureRatio < 0 || b.FailureRatio > 1 || math.IsNaN(b.FailureRatio):
			return r, invalid("Breaker.FailureRatio", "must be in (0, 1] or 0 to disable, got %v", b.FailureRatio)
		case b.Window < 0:
			return r, invalid("Breaker.Window", "must not be negative, got %v", b.Window)
		case b.MinRequests < 0:
			return r, invalid("Breaker.MinRequests", "must not be negative, got %d", b.MinRequests)
		case b.OpenTimeout < 0:
			return r, invalid("Breaker.OpenTimeout", "must not be negative, got %v", b.OpenTimeout)
		case b.MaxOpenTimeout < 0:
			return r, invalid("Breaker.MaxOpenTimeout", "must not be negative, got %v", b.MaxOpenTimeout)
		case b.HalfOpenProbes < 0:
			return r, invalid("Breaker.HalfOpenProbes", "must not be negative, got %d", b.HalfOpenProbes)
		case b.TimeoutFailures < 0:
			return r, invalid("Breaker.TimeoutFailures", "must not be negative, got %d", b.TimeoutFailures)
		}
		r.consecutive = b.ConsecutiveFailures
		if r.consecutive == 0 && b.FailureRatio == 0 {
			r.consecutive = 5
		}
		r.timeoutW = int64(b.TimeoutFailures)
		if r.timeoutW == 0 {
			r.timeoutW = int64(max(r.consecutive, 1))
		}
		r.ratio = b.FailureRatio
		r.window = orDuration(b.Window, 10*time.Second)
		r.minRequests = orInt(b.MinRequests, 20)
		r.openTimeout = orDuration(b.OpenTimeout, 5*time.Second)
		r.maxOpen = orDuration(b.MaxOpenTimeout, time.Minute)
		if b.MaxOpenTimeout == 0 && r.maxOpen < r.openTimeout {
			r.maxOpen = r.openTimeout
		}
		if r.maxOpen < r.openTimeout {
			return r, invalid("Breaker.MaxOpenTimeout", "%v is below OpenTimeout %v", r.maxOpen, r.openTimeout)
		}
		if r.window < windowBuckets {
			return r, invalid("Breaker.Window", "must be at least %dns, got %v", windowBuckets, r.window)
		}
		r.probes = orInt(b.HalfOpenProbes, 1)
		r.exclude = b.Exclude
		r.countPermanent = b.CountPermanent
		if err := r.resolveSlowCall(b.SlowCall); err != nil {
			return r, err
		}
	}
	if r.exclude == nil {
		r.exclude = excludeCanceled
	}

	switch {
	case p.Retry.MaxAttempts < 0:
		return r, invalid("Retry.MaxAttempts", "must be at least 1 (0 means 1), got %d", p.Retry.MaxAttempts)
	case p.Retry.Backoff.Base < 0:
		return r, invalid("Retry.Backoff.Base", "must not be negative, got %v", p.Retry.Backoff.Base)
	case p.Retry.Backoff.Max < 0:
		return r, invalid("Retry.Backoff.Max", "must not be negative, got %v", p.Retry.Backoff.Max)
	case p.Retry.Backoff.Kind > CustomKind:
		return r, invalid("Retry.Backoff.Kind", "unknown kind %v", p.Retry.Backoff.Kind)
	case p.Retry.Backoff.Kind == CustomKind && p.Retry.Backoff.Custom == nil:
		return r, invalid("Retry.Backoff.Custom", "must be set when Kind is CustomKind")
	}
	r.maxAttempts = orInt(p.Retry.MaxAttempts, 1)
	r.backoff = p.Retry.Backoff
	r.backoff.Base = orDuration(r.backoff.Base, 50*time.Millisecond)
	r.backoff.Max = orDuration(r.backoff.Max, max(5*time.Second, r.backoff.Base))
	if r.backoff.Custom != nil {
		r.backoff.Kind = CustomKind
	}
	if r.backoff.Max < r.backoff.Base {
		return r, invalid("Retry.Backoff.Max", "%v is below Base %v", r.backoff.Max, r.backoff.Base)
	}

	b := Budget{}
	if p.Budget != nil {
		b = *p.Budget
	}
	switch {
	case b.Ratio < 0 || b.Ratio > 1 || math.IsNaN(b.Ratio):
		return r, invalid("Budget.Ratio", "must be in (0, 1], got %v", b.Ratio)
	case b.MaxTokens < 0 || math.IsNaN(b.MaxTokens) || math.IsInf(b.MaxTokens, 0):
		return r, invalid("Budget.MaxTokens", "must not be negative, got %v", b.MaxTokens)
	case math.IsNaN(b.MinPerSecond) || math.IsInf(b.MinPerSecond, 0):
		return r, invalid("Budget.MinPerSecond", "must be a number, got %v", b.MinPerSecond)
	}
	r.budget = !b.Disabled
	r.earnMilli = max(int64(math.Round(orFloat(b.Ratio, 0.2)*1000)), 1)
	r.maxMilli = int64(min(math.Round(orFloat(b.MaxTokens, 10)*1000), 1<<62))
	r.floorPerSec = orFloat(b.MinPerSecond, 1)
	if r.floorPerSec < 0 {
		r.floorPerSec = 0
	}
	if r.floorPerSec > 0 {
		r.floorEvery = max(int64(min(float64(time.Second)/r.floorPerSec, 1e18)), 1)
		r.floorCap = max(int64(time.Second), r.floorEvery)
	}

	q := p.Latency.Quantile
	if q < 0 || q >= 1 || math.IsNaN(q) {
		return r, invalid("Latency.Quantile", "must be in (0, 1), got %v", q)
	}
	r.quantile = orFloat(q, 0.9)
	if p.Latency.SampleEvery < 0 {
		return r, invalid("Latency.SampleEvery", "must not be negative, got %d", p.Latency.SampleEvery)
	}
	r.sampleEvery = uint32(min(orInt(p.Latency.SampleEvery, 8), math.MaxUint32))

	if p.Deadline < 0 {
		return r, invalid("Deadline", "must not be negative, got %v", p.Deadline)
	}
	r.deadline = p.Deadline
	if p.AttemptTimeout < 0 {
		return r, invalid("AttemptTimeout", "must not be negative, got %v", p.AttemptTimeout)
	}
	r.attemptTimeout = p.AttemptTimeout
	switch bh := p.Bulkhead; {
	case bh.MaxConcurrent < 0:
		return r, invalid("Bulkhead.MaxConcurrent", "must not be negative, got %d", bh.MaxConcurrent)
	case bh.Weight < 0:
		return r, invalid("Bulkhead.Weight", "must not be negative, got %d", bh.Weight)
	}
	r.maxConcurrent = p.Bulkhead.MaxConcurrent
	r.weight = orInt(p.Bulkhead.Weight, 1)
	r.adaptive = p.Bulkhead.Adaptive
	r.bulkhead = r.maxConcurrent > 0 || r.adaptive
	r.plainAttempt = r.attemptTimeout == 0 && !p.Hedge.Enabled
	if p.Hedge.MinDelay < 0 {
		return r, invalid("Hedge.MinDelay", "must not be negative, got %v", p.Hedge.MinDelay)
	}
	r.hedge = p.Hedge.Enabled
	r.hedgeMin = orDuration(p.Hedge.MinDelay, time.Millisecond)
	r.admit = p.Admit
	r.plainRun = r.admit == nil && !r.bulkhead
	r.before = p.BeforeAttempt
	r.onEvent = p.OnEvent
	r.clock = p.Clock
	if r.clock == nil {
		r.clock = systemClock{}
		r.systemClock = true
	}
	r.epoch = r.clock.Now()
	if r.slowFixed == 0 { // no breaker, or slow calls off
		r.slowFixed = math.MaxInt64
	}
	if r.slowFixed != math.MaxInt64 || r.slowDerived {
		r.slowClock = clockExact
		if r.systemClock {
			r.slowClock = clockCoarse
		}
	}
	return r, nil
}

// resolveSlowCall validates a breaker's SlowCall and fills in its defaults.
func (r *resolved) resolveSlowCall(s SlowCall) error {
	switch {
	case s.Threshold < 0:
		return invalid("Breaker.SlowCall.Threshold", "must not be negative, got %v", s.Threshold)
	case s.Factor != 0 && !(s.Factor >= 1) || math.IsInf(s.Factor, 0):
		return invalid("Breaker.SlowCall.Factor", "must be at least 1 (0 means 5), got %v", s.Factor)
	case s.Floor < 0:
		return invalid("Breaker.SlowCall.Floor", "must not be negative, got %v", s.Floor)
	}
	if s.Disabled {
		return nil
	}
	r.slowFactor = orFloat(s.Factor, 5)
	r.slowFloor = orDuration(s.Floor, 100*time.Millisecond)
	if s.Threshold > 0 {
		r.slowFixed = int64(s.Threshold)
	} else {
		r.slowDerived = true
	}
	return nil
}

func excludeCanceled(err error) bool { return errors.Is(err, context.Canceled) }

func orInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func orFloat(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

func orDuration(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}
