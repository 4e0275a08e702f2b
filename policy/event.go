package policy

import (
	"fmt"
	"time"
)

// EventKind says what happened in a guard.
type EventKind uint8

// Event kinds.
const (
	EventBreakerOpened   EventKind = iota + 1 // the breaker tripped (Delay is the open period)
	EventBreakerHalfOpen                      // the open period ended; probes are admitted
	EventBreakerClosed                        // enough probes succeeded
	EventRetryScheduled                       // a retry will run after Delay
	EventBudgetExhausted                      // a retry was refused by the budget
	EventHedgeStarted                         // a hedged attempt started
	EventAdmitRefused                         // the Admit hook refused the work
	EventRejected                             // the breaker refused an attempt
	EventSlowCall                             // a success slower than the threshold: a failure to the breaker (Delay is its duration)
	EventBulkheadFull                         // Run refused work: the bulkhead was full
)

func (k EventKind) String() string {
	switch k {
	case EventBreakerOpened:
		return "breaker-opened"
	case EventBreakerHalfOpen:
		return "breaker-half-open"
	case EventBreakerClosed:
		return "breaker-closed"
	case EventRetryScheduled:
		return "retry-scheduled"
	case EventBudgetExhausted:
		return "budget-exhausted"
	case EventHedgeStarted:
		return "hedge-started"
	case EventAdmitRefused:
		return "admit-refused"
	case EventRejected:
		return "rejected"
	case EventSlowCall:
		return "slow-call"
	case EventBulkheadFull:
		return "bulkhead-full"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is passed to Policy.OnEvent. Fields that do not apply to a kind are
// zero.
type Event struct {
	Kind EventKind
	// State is the breaker state after the event.
	State State
	// Attempt is the attempt the event is about, counting from 1.
	Attempt int
	// Delay is the backoff before a retry, the open period of a trip, or the
	// duration of a slow call.
	Delay time.Duration
	// Err is the error that caused the event, if any.
	Err error
	// Forced: the state change was made by Guard.Force or Guard.Trip, not
	// by outcomes.
	Forced bool
}
