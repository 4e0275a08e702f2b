package policy

import (
	"context"
	"fmt"
	"time"
)

// Policy is a template for a [Guard]. It is a plain value: copy it, change a
// field, and build another instance with [New]. Zero fields mean the defaults
// written on each field; [Default] returns the recommended template.
//
// A Policy holds no state. Every Guard built from it owns its own breaker,
// retry budget, latency estimate and bulkhead, so two guards built from one
// Policy never share failures, tokens or slots.
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
	// Each attempt is bounded by AttemptTimeout as well.
	Deadline time.Duration

	// AttemptTimeout bounds each attempt: the ctx given to the attempt ends
	// after it (or at the Deadline, if that comes first). An attempt it ends
	// is a failure like any other: its context.DeadlineExceeded counts
	// toward the breaker (only context.Canceled is excluded by default), and
	// it is retried. Zero means none (the zero Policy has none); [Default]
	// sets 10s, so that a hanging dependency ends and trips the breaker
	// instead of holding a worker for ever.
	//
	// In Run, attempts of a guard that start with the same ctx within
	// AttemptTimeout/128 of each other share one context, whose deadline
	// is the first one's plus that span, so that a handler that never asks
	// for Done costs no allocation: an attempt may end that much late (under
	// 1%), never early. A shared context ends when the last attempt using
	// it returns (a handler that keeps it sees it end no sooner). The guard
	// keeps the last such context, and with it the ctx given to Run, until
	// it makes another.
	AttemptTimeout time.Duration

	// Bulkhead bounds the units of work of this guard in flight at once,
	// and weighs the guard in a fair scheduler. The zero value is no bound
	// in Run (an engine applies its own default) and weight 1.
	Bulkhead Bulkhead

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

// Default returns the recommended template: a breaker with default settings
// (which count slow calls as failures, see [SlowCall]), 3 attempts with
// decorrelated-jitter exponential backoff from 50ms capped at 5s, the
// default retry budget, no total Deadline, and an AttemptTimeout of 10s, so
// that a hanging dependency ends (and counts as a failure) instead of
// holding its caller for ever. No bulkhead in Run.
func Default() Policy {
	return Policy{
		Breaker: &Breaker{},
		Retry: Retry{
			MaxAttempts: 3,
			Backoff:     Backoff{Kind: Exponential, Base: 50 * time.Millisecond, Max: 5 * time.Second},
		},
		AttemptTimeout: 10 * time.Second,
	}
}

// Breaker configures a circuit breaker. The zero value is a breaker that
// opens after 5 consecutive failures, stays open 5s (doubling on each
// repeated trip up to 1 minute), admits 1 probe while half-open, and counts
// a success slower than a threshold derived from the guard's latency as a
// failure (SlowCall).
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
	// about the dependency). Errors marked Permanent are not counted either,
	// whatever Exclude says, unless CountPermanent is set.
	Exclude func(error) bool

	// CountPermanent makes errors marked [Permanent] count as failures of
	// the breaker. Off by default: a permanent error says the unit of work
	// can never succeed (a message that cannot be parsed), not that the
	// dependency is down, so the breaker counts it as neither success nor
	// failure (resilience4j's ignoreExceptions): a burst of such work does
	// not open the breaker, and a half-open probe that fails permanently
	// frees its slot for the next attempt. Nor is its duration a sample of
	// the latency estimate (a message rejected in a microsecond says
	// nothing of a dependency that answers in milliseconds). It is still
	// a failure in [Stats]. Set it when a permanent error may also mean
	// the dependency is unwell (a handler that marks every refusal of its
	// downstream as permanent).
	CountPermanent bool

	// SlowCall makes slow successes failures to the breaker. On by default.
	SlowCall SlowCall

	// TimeoutFailures is how many failures an attempt that ran out its
	// AttemptTimeout counts as toward ConsecutiveFailures. Zero means
	// ConsecutiveFailures itself: one timeout trips the breaker, because a
	// call that did not answer for AttemptTimeout (10s by default, far past
	// any normal latency) is a hang, and with its tenant's calls made one at
	// a time (a consumer lane) waiting for five of them would hold a worker
	// for minutes. 1 makes a timeout an ordinary failure. Negative is
	// invalid. Running out the Deadline (the round's budget) rather than
	// AttemptTimeout is an ordinary failure.
	TimeoutFailures int
}

// SlowCall configures slow calls, after resilience4j's slow-call threshold:
// an attempt that succeeds but took longer than the threshold is recorded
// by the breaker as a failure (by the consecutive and ratio rules, and as a
// failed probe when half-open), emits [EventSlowCall] and earns no retry
// token; the caller still gets its success. A dependency that turns slow
// without failing so trips the breaker like a failing one. Every attempt is
// checked, timed with a coarse clock when Policy.Clock is the system clock
// (about 5ms resolution) and with Policy.Clock otherwise.
//
// The zero value derives the threshold from the guard's own latency: the
// larger of Floor (100ms) and Factor (5) times a baseline, the configured
// latency quantile (p90) of the successes under the threshold. The baseline
// learns from the first 32 attempts before the threshold applies, and then
// does not learn the slowness it detects: while attempts stay slow it only
// drifts up, by at most a doubling a minute, so that a dependency that
// moves for good from L to L' is accepted after about log2(L'/(Factor*L))
// minutes of slow calls (1ms to 500ms: 7 minutes, about 8 with the breaker
// parking the caller between probes); until then its calls are slow calls
// and keep the breaker opening.
type SlowCall struct {
	// Disabled turns slow-call counting off.
	Disabled bool
	// Threshold is a fixed threshold, applied from the first attempt. Zero
	// means derived (see SlowCall).
	Threshold time.Duration
	// Factor: a derived threshold is max(Floor, Factor x baseline). Zero
	// means 5; otherwise at least 1.
	Factor float64
	// Floor is the least derived threshold. Zero means 100ms.
	Floor time.Duration
}

// Bulkhead bounds one guard's units of work in flight, and weighs the guard
// against others (the consumer's fair scheduler reads it; Run does not).
// [Guard.Run] enforces MaxConcurrent (and the adaptive limit), refusing
// work at once with [ErrBulkheadFull]; [Guard.Allow] does not: an engine
// counts its own units in flight and asks [Guard.Concurrency] for the
// limit. A scope's Shape sets it per tenant.
type Bulkhead struct {
	// MaxConcurrent is how many units of work of this guard may be in
	// flight at once. Zero means no cap in Run, and the engine's default in
	// the consumer (Guard.Concurrency's def). Negative is invalid.
	MaxConcurrent int
	// Weight is this guard's share in a fair scheduler. Zero means 1.
	// Negative is invalid.
	Weight int
	// Adaptive makes the limit move with measured latency, between 1 and
	// the cap (MaxConcurrent, or the engine's default, or 1000 in Run): a
	// gradient limit after Netflix concurrency-limits' Gradient2, which
	// falls when the guard's latency rises several-fold above its long-term
	// level and climbs back when it recovers. It updates on latency samples
	// (Latency.SampleEvery), from Run and two-step use alike.
	Adaptive bool
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
