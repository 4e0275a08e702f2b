// Package policy builds per-instance resilience: a [Policy] is a plain,
// copyable template, and [New] turns it into a [Guard] that owns its own
// circuit breaker, retry budget, latency estimate and bulkhead. To build
// many guards of one policy (one per tenant), [Compile] it once: the guards
// of a [Compiled] share the validated policy and each costs only its own
// state.
//
// # Executor
//
// [Guard.Run] is one flat loop, no nested decorators:
//
//	Admit -> bulkhead -> breaker permit -> BeforeAttempt
//	      -> attempt (its ctx ends after AttemptTimeout, or at the Deadline)
//	      -> record outcome (a slow success is a failure to the breaker)
//	      -> retry decision (budget + backoff) -> next attempt
//
// Deadline bounds the whole unit of work, all attempts and backoffs;
// AttemptTimeout bounds each attempt, so that a hanging dependency ends
// ([Default] sets 10s) and counts as a failure. The bulkhead
// (Bulkhead.MaxConcurrent, or the adaptive limit) refuses a unit of work at
// once with [ErrBulkheadFull]; without one Run counts nothing.
//
// The success path with a closed breaker takes no lock and allocates
// nothing, with an AttemptTimeout too: attempts of a guard that start close
// together with the same ctx share their attempt's context, whose timer and
// channel are made only if an attempt asks for Done (and then the next
// attempt gets a context of its own); it loads the state word,
// updates a few atomics and reads a coarse clock for the slow-call check. A
// retry that could not run anyway (the breaker opened and will still be
// open after the backoff, or the backoff would outlive the deadline) spends
// no budget token: Run returns at once.
//
// # Two-step use
//
// Engines that schedule their own attempts (the consumer parks a tenant
// instead of blocking) use [Guard.Allow] to ask "may I run now, and if not,
// for how long not?" and [Permit.Done] to report the outcome later (or
// [Permit.Release] if the attempt never ran), after gobreaker's two-step
// breaker. Done and Release end a permit once: a second call does nothing.
// [Guard.NextRetry] gives them the executor's retry decision as a value,
// [RetryDecision]: retry after a delay, or stop for a [StopReason]; only
// StopOpen (this guard's breaker) means park, whatever the handler's error
// wraps. [Guard.BeforeAttempt] runs the hook as Run would,
// [Guard.AttemptContext] makes an attempt's ctx as Run does, and
// [Guard.Concurrency] and [Guard.Weight] give a scheduler the guard's
// bulkhead and share (Allow does not enforce the bulkhead: the engine
// counts its own units in flight).
//
// # Breaker
//
// The breaker trips on N consecutive failures, or on a failure ratio over a
// rolling window once the window holds a minimum number of outcomes. It stays
// open for OpenTimeout, doubling after each failed probe up to MaxOpenTimeout,
// then admits HalfOpenProbes probes; all of them must succeed to close it.
// Each state change starts a new generation, and outcomes from an older
// generation are counted in [Stats] but do not move the breaker. An
// attempt that ran out its AttemptTimeout (a hang) counts as
// Breaker.TimeoutFailures failures: by default as many as trip it, so one
// hang opens the breaker instead of holding a caller for five timeouts
// (engines report it with [AttemptTimedOut]; Run does so itself).
//
// An operator may override the breaker ([Guard.Force]: held open with no
// probe, or never opened) and a caller that knows better than the outcomes
// so far may open it until a time ([Guard.Trip]); their events are marked
// Forced.
//
// A failure is the dependency's unless it says otherwise: an error marked
// [Permanent] is the unit of work's own fault (a message that can never be
// handled), so by default the breaker counts it as neither success nor
// failure, like an excluded error (resilience4j's record and ignore
// exceptions are the reference), and its duration is no sample of the
// latency estimate. A burst of permanent failures therefore never opens
// the breaker, nor makes a 2ms dependency look like one of microseconds;
// Breaker.CountPermanent counts them for a caller whose permanent errors
// may also mean the dependency is unwell.
//
// # Slow calls
//
// A success slower than the slow-call threshold is a failure to the breaker
// (after resilience4j's slow-call rate): a dependency that turns slow
// without failing trips the breaker, and its tenant parks like a failing
// one, while each caller still gets its success. The threshold is fixed
// (SlowCall.Threshold) or, by default, derived: max(100ms, 5 x a baseline
// latency that learns only from calls under the threshold, and drifts up
// by at most a doubling a minute while calls stay slow), so that 1ms going
// to 500ms trips the default breaker, and a shift that lasts is accepted
// after minutes. See [SlowCall].
//
// # Retry budget
//
// Each guard has its own token bucket (gRPC retry throttling, Finagle's
// RetryBudget): a success earns Budget.Ratio of a token, a retry spends one,
// and a small per-second floor lets a quiet tenant retry at all. One
// tenant's failures can never spend another tenant's tokens.
//
// # Latency estimate and adaptive concurrency
//
// Each guard tracks a quantile (p90 by default) of its attempt durations
// with a streaming estimator in O(1) memory: stochastic gradient steps on the
// pinball loss, relative to the estimate so it follows any scale. Attempts
// are timed at random, one in Latency.SampleEvery (8) after the first 32,
// because reading the clock is most of an attempt's overhead. The estimate
// drives the optional hedge, the slow-call baseline and, with
// Bulkhead.Adaptive, a gradient concurrency limit (after Netflix
// concurrency-limits' Gradient2) that falls when the latency rises
// several-fold above its long-term level and climbs back as it recovers.
//
// # Time
//
// Policy.Clock injects the time used by the breaker, budget, latency
// estimate and slow-call check, so tests drive breaker timing without
// sleeping. With the system clock, the slow-call check of an attempt that
// is not a latency sample reads a coarse clock (one atomic load, refreshed
// every 5ms by one goroutine while attempts read it). Backoff waits, the
// Deadline and AttemptTimeout use real timers; tests run them under
// testing/synctest.
//
// # Many guards
//
// [Compile] validates a Policy once for many guards of it. A keyed
// collection whose keys come and go (the scope package) builds its guards
// with a [Recycler], which reuses the state of a guard the collection
// dropped ([Recycler.Retire]) instead of allocating a new one. Reuse is safe
// for a caller still holding the retired Guard: a Guard built by a Recycler
// counts each call in and out of its state, a state is reused only when no
// call is in, and a retired Guard's next call moves it to a fresh state of
// its own. That counting costs a guard from a Recycler two atomic adds per
// Run (more when two cores run the same guard; BenchmarkSuccess's
// ringfence-recycled rows measure it); other guards skip it. An engine that
// makes attempts on one guard in a row counts in once for all of them with
// a [Batch], which also adds their successes to the guard's counters once.
//
// # Concurrency
//
// A Guard is safe for concurrent use. Hooks (Admit, BeforeAttempt,
// Backoff.Custom, OnEvent) are called synchronously, never with a lock held,
// and must be cheap and safe for concurrent use.
//
// # Files
//
// One concern per file: breaker.go (state machine, window, generations),
// force.go (Force and Trip), budget.go (earn, spend, floor), latency.go
// (the estimate, the slow-call baseline, the gradient limit), backoff.go,
// retry.go ([RetryDecision]),
// executor.go (Run, attempts, hedging), attemptctx.go (an attempt's ctx),
// permit.go (Permit, Allow, Done, Release, the outcome recorded),
// bulkhead.go, guard.go (the state, New, Compile, Stats), handle.go (the
// Guard handle and the Recycler), clock.go (Clock and the coarse clock),
// policy.go (the configuration), resolve.go (its validation and defaults).
package policy
