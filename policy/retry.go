package policy

import (
	"context"
	"fmt"
	"time"
)

// RetryDecision is what to do after a failed attempt. It is a value, never
// an error: an engine tells "retry after Delay" from "stop, because Stop"
// without inspecting the attempt's error, which is the handler's and may
// wrap anything (an [ErrOpen] from a guard of its own, for instance).
type RetryDecision struct {
	Retry bool          // true: try again after Delay
	Delay time.Duration // the backoff before the next attempt, when Retry
	Stop  StopReason    // why not, when Retry is false
}

// StopReason says why a [RetryDecision] is not to retry.
type StopReason uint8

// Stop reasons.
const (
	StopNone      StopReason = iota // a retry, or no error to retry
	StopPermanent                   // the error is marked with Permanent
	StopAttempts                    // Retry.MaxAttempts used up
	StopOpen                        // the breaker is open and will still be after the backoff: park instead
	StopBudget                      // the retry budget refused

	// stopDeadline: the backoff would outlive the deadline of Run's ctx.
	// Run only; NextRetry has no deadline to check.
	stopDeadline
)

func (s StopReason) String() string {
	switch s {
	case StopNone:
		return "none"
	case StopPermanent:
		return "permanent"
	case StopAttempts:
		return "attempts"
	case StopOpen:
		return "open"
	case StopBudget:
		return "budget"
	}
	return fmt.Sprintf("StopReason(%d)", uint8(s))
}

// NextRetry is the retry decision of the executor, for engines that
// schedule their own attempts. Given the attempt that just failed (from 1),
// its error, and the previous backoff (0 before the first retry), it decides
// whether to retry and after how long. Everything that ends the work without
// a retry is checked before a budget token is spent, in this order: a
// permanent error (StopPermanent), the last attempt (StopAttempts), a
// breaker that will still be open after the backoff (StopOpen: park rather
// than retry), and the budget (StopBudget). Only a retry spends a token. It
// emits EventRetryScheduled, EventRejected (StopOpen) or
// EventBudgetExhausted accordingly. A nil err gives the zero decision.
//
// err is only classified (Permanent or not): an error that wraps [ErrOpen]
// is retried like any other; only this guard's own breaker gives StopOpen.
func (h *Guard) NextRetry(attempt int, err error, prev time.Duration) RetryDecision {
	g, sh := h.enter(draw())
	d := g.nextRetry(context.Background(), attempt, err, prev)
	g.exit(sh)
	return d
}

// nextRetry decides a retry (see NextRetry); Run also stops when the wait
// would outlive ctx's deadline.
func (g *guard) nextRetry(ctx context.Context, attempt int, err error, prev time.Duration) RetryDecision {
	if err == nil {
		return RetryDecision{}
	}
	if IsPermanent(err) {
		return RetryDecision{Stop: StopPermanent}
	}
	if attempt >= g.r.maxAttempts {
		return RetryDecision{Stop: StopAttempts}
	}
	d := g.r.backoffFor(attempt, err, prev)
	if g.r.breaker {
		if st, _ := unpack(g.state.Load()); st == Open && g.openUntil.Load()-g.now() > int64(d) {
			g.counts[draw()&(counterShards-1)].rejected.Add(1)
			g.emit(Event{Kind: EventRejected, Attempt: attempt + 1, Err: g.openErr.Load()})
			return RetryDecision{Stop: StopOpen}
		}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return RetryDecision{Stop: stopDeadline}
	}
	if !g.spend() {
		g.emit(Event{Kind: EventBudgetExhausted, Attempt: attempt, Err: err})
		return RetryDecision{Stop: StopBudget}
	}
	g.retries.Add(1)
	g.emit(Event{Kind: EventRetryScheduled, Attempt: attempt, Delay: d, Err: err})
	return RetryDecision{Retry: true, Delay: d}
}
