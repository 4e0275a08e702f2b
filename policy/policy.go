package policy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Policy is a template for a [Guard]. It is a plain value: copy it, change a
// field, and build another instance with [New]. Zero fields mean the defaults
// written on each field; [Default] returns the recommended template.
//
// A Policy holds no state. Every Guard built from it owns its own breaker,
// retry budget and latency estimate, so two guards built from one Policy never
// share failures or tokens.
type Policy struct {
	// Breaker configures the circuit breaker. Nil means no breaker: every
	// attempt is permitted. &Breaker{} means a breaker with default settings.
	Breaker *Breaker

	// Retry configures how many attempts one unit of work may make and how
	// long to wait between them.
	Retry Retry

	// Budget limits retries per guard. Nil means the default budget
	// (see [Budget]); a Budget with Disabled set turns it off.
	Budget *Budget

	// Deadline is the total time one unit of work may take across all its
	// attempts and backoffs. Zero means no deadline (only ctx bounds it).
	Deadline time.Duration

	// AttemptTimeout bounds each attempt (TEMPORARY stand-in on the engine
	// branch; the policy-core branch brings the real field).
	AttemptTimeout time.Duration

	// Latency configures the streaming latency estimate.
	Latency Latency

	// Hedge, when Enabled, starts a second attempt once the first has run
	// longer than the latency estimate. Off by default: handlers are not
	// always idempotent.
	Hedge Hedge

	// Admit, if set, is asked before any attempt of a unit of work. A non-nil
	// error refuses the work: Run returns an [*AdmitError] wrapping it and
	// emits [EventAdmitRefused]. It must be cheap and safe for concurrent use.
	Admit func(ctx context.Context) error

	// BeforeAttempt, if set, runs after the breaker permitted an attempt and
	// before it starts; attempt counts from 1. A non-nil error ends the unit
	// of work with that error (the attempt is not counted by the breaker).
	// It must be cheap and safe for concurrent use.
	BeforeAttempt func(ctx context.Context, attempt int) error

	// OnEvent, if set, receives every [Event] of the guard, synchronously.
	// It must be cheap and safe for concurrent use.
	OnEvent func(Event)

	// Clock supplies the time for the breaker, budget and latency estimate.
	// Nil means the system clock. Backoff waits use real timers (tests use
	// testing/synctest for those).
	Clock Clock
}

// Default returns the recommended template: a breaker with default settings,
// 3 attempts with decorrelated-jitter exponential backoff from 50ms capped at
// 5s, the default retry budget, and no deadline.
func Default() Policy {
	return Policy{
		Breaker: &Breaker{},
		Retry: Retry{
			MaxAttempts: 3,
			Backoff:     Backoff{Kind: Exponential, Base: 50 * time.Millisecond, Max: 5 * time.Second},
		},
	}
}

// Breaker configures a circuit breaker. The zero value is a breaker that
// opens after 5 consecutive failures, stays open 5s (doubling on each
// repeated trip up to 1 minute) and admits 1 probe while half-open.
type Breaker struct {
	// ConsecutiveFailures trips the breaker after this many failures in a
	// row. Zero means 5, unless FailureRatio is set, in which case zero
	// disables the consecutive rule. Negative is invalid.
	ConsecutiveFailures int

	// FailureRatio, in (0, 1], trips the breaker when the ratio of failures
	// in the rolling Window reaches it and the window holds at least
	// MinRequests outcomes. Zero disables the ratio rule.
	FailureRatio float64

	// Window is the rolling window of the ratio rule. Zero means 10s.
	Window time.Duration

	// MinRequests is the minimum number of outcomes in the window before the
	// ratio rule may trip. Zero means 20.
	MinRequests int

	// OpenTimeout is how long the breaker stays open after its first trip.
	// Zero means 5s.
	OpenTimeout time.Duration

	// MaxOpenTimeout caps the open period, which doubles on each trip that
	// follows a failed probe. Zero means 1 minute; it must not be below
	// OpenTimeout.
	MaxOpenTimeout time.Duration

	// HalfOpenProbes is how many attempts the half-open breaker admits at
	// once, and how many of them must succeed to close it. Zero means 1.
	HalfOpenProbes int

	// Exclude reports errors that count as neither success nor failure.
	// Nil means context.Canceled is excluded (a caller giving up says nothing
	// about the dependency). Permanent errors are always counted as failures
	// unless excluded here.
	Exclude func(error) bool
}

// Retry configures attempts of one unit of work.
type Retry struct {
	// MaxAttempts is the total number of attempts, first one included. Zero
	// means 1 (no retry). Negative is invalid.
	MaxAttempts int

	// Backoff computes the wait before each retry.
	Backoff Backoff
}

// BackoffKind selects a backoff formula.
type BackoffKind uint8

// Backoff kinds. The zero value is Exponential.
const (
	// Exponential is exponential backoff with decorrelated jitter: each wait
	// is uniform in [Base, 3*previous wait], capped at Max.
	Exponential BackoffKind = iota
	// Constant waits Base every time.
	Constant
	// Linear waits Base*attempt, capped at Max.
	Linear
	// CustomKind calls Backoff.Custom.
	CustomKind
)

func (k BackoffKind) String() string {
	switch k {
	case Exponential:
		return "exponential"
	case Constant:
		return "constant"
	case Linear:
		return "linear"
	case CustomKind:
		return "custom"
	}
	return fmt.Sprintf("BackoffKind(%d)", uint8(k))
}

// Backoff computes the wait before a retry. The zero value is exponential
// backoff with decorrelated jitter from 50ms, capped at 5s.
type Backoff struct {
	// Kind selects the formula. Setting Custom selects CustomKind whatever
	// Kind says.
	Kind BackoffKind
	// Base is the first wait. Zero means 50ms.
	Base time.Duration
	// Max caps every wait. Zero means 5s, or Base if that is longer.
	Max time.Duration
	// Custom, if set, computes the wait from the attempt that just failed
	// (counting from 1) and its error. Its result is capped at Max.
	Custom func(attempt int, err error) time.Duration
}

// Budget is a token bucket that limits retries per guard, after gRPC retry
// throttling and Finagle's RetryBudget: each success deposits Ratio tokens
// (up to MaxTokens), each retry withdraws one, and a retry is refused when
// no whole token is left. A floor of MinPerSecond retries per second is
// always available, so a tenant with little traffic can still retry. The
// zero value means Ratio 0.2, MaxTokens 10, MinPerSecond 1.
type Budget struct {
	// Disabled turns the budget off: retries are limited by MaxAttempts only.
	Disabled bool
	// Ratio is the tokens earned by each success, in (0, 1]. Zero means 0.2.
	Ratio float64
	// MaxTokens caps the bucket; it starts full. Zero means 10.
	MaxTokens float64
	// MinPerSecond is the floor of retries per second allowed even with an
	// empty bucket; up to one second's worth (at least one retry) accrues
	// while unused. Zero means 1; negative means no floor.
	MinPerSecond float64
}

// Latency configures the streaming latency estimate.
type Latency struct {
	// Quantile is the quantile estimated, in (0, 1). Zero means 0.9.
	Quantile float64

	// SampleEvery times one attempt in SampleEvery, chosen at random, after
	// the first 32 (which are all timed). Reading the clock is most of the
	// cost of an attempt through a guard, and a random sample estimates the
	// same quantile. Zero means 8; 1 times every attempt. Negative is
	// invalid.
	SampleEvery int
}

// Hedge configures hedged attempts. A hedged attempt runs fn on a second
// goroutine once the first has run for the latency estimate (at least
// MinDelay); the first success wins and the other copy's ctx is cancelled.
// Both copies share one breaker permit and count as one attempt. A panic in
// either copy is returned as an error, not re-raised (it happened on another
// goroutine).
type Hedge struct {
	// Enabled turns hedging on. Off by default.
	Enabled bool
	// MinDelay is the least time to wait before hedging, whatever the
	// estimate. Zero means 1ms.
	MinDelay time.Duration
}

// resolved is a Policy with every default filled in, checked once by New.
type resolved struct {
	breaker     bool
	consecutive int
	ratio       float64
	window      time.Duration
	minRequests int
	openTimeout time.Duration
	maxOpen     time.Duration
	probes      int
	exclude     func(error) bool

	maxAttempts int
	backoff     Backoff

	budget       bool
	earnMilli    int64
	maxMilli     int64
	floorPerSec  float64
	floorEvery   int64 // ns per floor retry
	floorCap     int64 // ns of floor that accrue: 1s, or one retry if slower
	quantile     float64
	sampleEvery  uint32
	deadline     time.Duration
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
		}
		r.consecutive = b.ConsecutiveFailures
		if r.consecutive == 0 && b.FailureRatio == 0 {
			r.consecutive = 5
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
	if p.Hedge.MinDelay < 0 {
		return r, invalid("Hedge.MinDelay", "must not be negative, got %v", p.Hedge.MinDelay)
	}
	r.hedge = p.Hedge.Enabled
	r.hedgeMin = orDuration(p.Hedge.MinDelay, time.Millisecond)
	r.admit = p.Admit
	r.before = p.BeforeAttempt
	r.onEvent = p.OnEvent
	r.clock = p.Clock
	if r.clock == nil {
		r.clock = systemClock{}
		r.systemClock = true
	}
	r.epoch = r.clock.Now()
	return r, nil
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
