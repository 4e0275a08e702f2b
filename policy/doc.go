// Package policy builds per-instance resilience: a [Policy] is a plain,
// copyable template, and [New] turns it into a [Guard] that owns its own
// circuit breaker, retry budget and latency estimate.
//
// # Executor
//
// [Guard.Run] is one flat loop, no nested decorators:
//
//	Admit -> breaker permit -> BeforeAttempt -> attempt (under Deadline)
//	      -> record outcome -> retry decision (budget + backoff) -> next attempt
//
// The success path with a closed breaker takes no lock and allocates nothing.
//
// # Two-step use
//
// Engines that schedule their own attempts (the consumer parks a tenant
// instead of blocking) use [Guard.Allow] to ask "may I run now, and if not,
// for how long not?" and [Permit.Done] to report the outcome later, after
// gobreaker's two-step breaker. [Guard.NextRetry] gives them the executor's
// retry decision.
//
// # Breaker
//
// The breaker trips on N consecutive failures, or on a failure ratio over a
// rolling window once the window holds a minimum number of outcomes. It stays
// open for OpenTimeout, doubling after each failed probe up to MaxOpenTimeout,
// then admits HalfOpenProbes probes. Each state change starts a new
// generation, and outcomes from an older generation do not move the breaker.
//
// # Retry budget
//
// Each guard has its own token bucket (gRPC retry throttling, Finagle's
// RetryBudget): a success earns Budget.Ratio of a token, a retry spends one,
// and a small per-second floor lets a quiet tenant retry at all. One
// tenant's failures can never spend another tenant's tokens.
//
// # Time
//
// Policy.Clock injects the time used by the breaker, budget and latency
// estimate, so tests drive breaker timing without sleeping.
package policy
