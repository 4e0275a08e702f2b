package policy

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is; the struct errors below carry
// details and match their sentinel.
var (
	// ErrOpen: the breaker is open (or half-open with every probe taken).
	// The error returned is an [*OpenError] carrying the retry-after.
	ErrOpen = errors.New("policy: circuit breaker is open")

	// ErrBudgetExhausted: a retry was refused because the guard's retry
	// budget is spent. The error returned is an [*ExhaustedError] that
	// unwraps to the last attempt's error.
	ErrBudgetExhausted = errors.New("policy: retry budget exhausted")

	// ErrAdmitRefused: the Admit hook refused the work. The error returned is
	// an [*AdmitError] that unwraps to the hook's error.
	ErrAdmitRefused = errors.New("policy: admission refused")

	// ErrInvalidPolicy: New was given an invalid Policy. The error returned
	// is an [*InvalidPolicyError] naming the field.
	ErrInvalidPolicy = errors.New("policy: invalid policy")

	// ErrBulkheadFull: Run refused the work because as many units of work
	// of the guard as its bulkhead allows were in flight. The error returned
	// is a [*BulkheadError] carrying the limit.
	ErrBulkheadFull = errors.New("policy: bulkhead full")

	// ErrSlowCall is the Err of an [EventSlowCall], and of the
	// [EventBreakerOpened] a slow call caused. No call returns it: a slow
	// call succeeded.
	ErrSlowCall = errors.New("policy: slow call")

	// ErrBatchEnded: Batch.Allow was called on a batch that was ended (or
	// never started). A caller bug: start a new one with Guard.Batch.
	ErrBatchEnded = errors.New("policy: batch ended")
)

// OpenError is returned when the breaker refuses an attempt. One OpenError
// is made per trip and shared by every refusal of that trip, so rejections
// allocate nothing; do not modify it.
type OpenError struct {
	// State is the breaker state that refused: Open, or HalfOpen with every
	// probe slot taken.
	State State
	// Until is when the open period ends and a probe will be admitted; zero
	// for HalfOpen.
	Until time.Time

	clock Clock
	g     *guard
	life  uint64 // g's life when this error was made
	// forced is the wait RetryAfter reports for a breaker held open by
	// OverrideOpen (see Guard.Force); zero otherwise.
	forced time.Duration
}

// RetryAfter is how long until the breaker admits a probe. For a half-open
// breaker whose probes are all taken it is the guard's latency estimate
// (between 1ms and 1s): about when a probe's outcome is known.
func (e *OpenError) RetryAfter() time.Duration {
	if e.forced > 0 {
		return e.forced
	}
	if e.State == HalfOpen || e.clock == nil {
		if e.g == nil || e.g.life.Load() != e.life {
			// No guard, or its state now serves another guard.
			return time.Millisecond
		}
		return min(max(time.Duration(e.g.lat.est.Load()), time.Millisecond), time.Second)
	}
	return max(e.Until.Sub(e.clock.Now()), 0)
}

func (e *OpenError) Error() string {
	return fmt.Sprintf("policy: circuit breaker is %s (retry after %v)", e.State, e.RetryAfter())
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// ExhaustedError is returned when the retry budget refused a retry.
type ExhaustedError struct {
	// Attempts made before the budget refused another.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("policy: retry budget exhausted after %d attempt(s): %v", e.Attempts, e.Err)
}

// Is reports whether target is ErrBudgetExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrBudgetExhausted }

// Unwrap returns the last attempt's error.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// BulkheadError is returned by Run when the guard's bulkhead was full.
type BulkheadError struct {
	// Limit is the number of units of work in flight that refused this one:
	// Bulkhead.MaxConcurrent, or the adaptive limit then.
	Limit int
}

func (e *BulkheadError) Error() string {
	return fmt.Sprintf("policy: bulkhead full (%d in flight)", e.Limit)
}

// Is reports whether target is ErrBulkheadFull.
func (e *BulkheadError) Is(target error) bool { return target == ErrBulkheadFull }

// AdmitError is returned when the Admit hook refused the work.
type AdmitError struct{ Err error }

func (e *AdmitError) Error() string { return "policy: admission refused: " + e.Err.Error() }

// Is reports whether target is ErrAdmitRefused.
func (e *AdmitError) Is(target error) bool { return target == ErrAdmitRefused }

// Unwrap returns the hook's error.
func (e *AdmitError) Unwrap() error { return e.Err }

// InvalidPolicyError names the Policy field that New refused.
type InvalidPolicyError struct {
	Field  string
	Reason string
}

func (e *InvalidPolicyError) Error() string {
	return "policy: invalid " + e.Field + ": " + e.Reason
}

// Is reports whether target is ErrInvalidPolicy.
func (e *InvalidPolicyError) Is(target error) bool { return target == ErrInvalidPolicy }

// ErrAttemptTimeout: an attempt ran out its Policy.AttemptTimeout. The
// error Run returns for such an attempt is an [*AttemptTimeoutError]; an
// engine that runs attempts itself reports one to Permit.Done the same way
// (see [AttemptTimedOut]), so that the breaker weighs it as
// Breaker.TimeoutFailures.
var ErrAttemptTimeout = errors.New("policy: attempt timed out")

// AttemptTimeoutError is the failure of an attempt that ran out its
// AttemptTimeout: it matches ErrAttemptTimeout and unwraps to the
// attempt's own error (usually wrapping context.DeadlineExceeded).
type AttemptTimeoutError struct{ Err error }

func (e *AttemptTimeoutError) Error() string {
	return "policy: attempt timed out: " + e.Err.Error()
}

// Is reports whether target is ErrAttemptTimeout.
func (e *AttemptTimeoutError) Is(target error) bool { return target == ErrAttemptTimeout }

// Unwrap returns the attempt's error.
func (e *AttemptTimeoutError) Unwrap() error { return e.Err }

// AttemptTimedOut marks err, the error of an attempt that ran out its
// AttemptTimeout, as such. AttemptTimedOut(nil) is nil.
func AttemptTimedOut(err error) error {
	if err == nil || errors.Is(err, ErrAttemptTimeout) {
		return err
	}
	return &AttemptTimeoutError{Err: err}
}

// Permanent marks err as not retryable: Run returns it at once and the
// consumer dead-letters the message without further attempts. It is the
// work's fault, not the dependency's: the breaker does not count it (unless
// Breaker.CountPermanent is set), so permanent failures never open it.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentError wraps an error that must not be retried.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err, or an error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
