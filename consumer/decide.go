package consumer

import (
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

// This file is the engine's decision core: pure functions from a message's
// state, the guard's answer and an attempt's outcome to what happens next.
// They do no I/O, take no lock and read no clock; step.go carries their
// verdicts out. The package doc's "Dead letters" section states the rules
// and Consumer.judge (step.go) the judge round in full; decide_test.go
// pins them with tables.

// act is what happens to a lane's head message next.
type act uint8

const (
	actSettle     act = iota + 1 // it was handled: settle it
	actRetry                     // attempt it again after delay
	actPark                      // its tenant's breaker refused or opened: the lane waits delay
	actSuspect                   // its own attempts are used up: judge it at once
	actDeadLetter                // write its dead letter (reason), then settle it
	actAskRetry                  // ask the guard for a retry decision (NextRetry), then decideRetry
	actJudgeNext                 // judge round: try the messages behind it
	actWait                      // no evidence either way: a new round after decideWait
)

func (a act) String() string {
	switch a {
	case actSettle:
		return "settle"
	case actRetry:
		return "retry"
	case actPark:
		return "park"
	case actSuspect:
		return "suspect"
	case actDeadLetter:
		return "dead-letter"
	case actAskRetry:
		return "ask-retry"
	case actJudgeNext:
		return "judge-next"
	case actWait:
		return "wait"
	}
	return "act(?)"
}

// verdict is a decision.
type verdict struct {
	act    act
	delay  time.Duration // retry, park: how long the lane waits
	reason dlq.Reason    // dead-letter, suspect: why
	// newRound: the message's attempts start over (the failure was its
	// tenant's, not its own).
	newRound bool
	// suspect, with any act, marks the head suspect for the next step.
	suspect dlq.Reason
}

// outcome is what one handler call of a head message produced, with the
// guard's state right after its outcome was recorded.
type outcome struct {
	err        error // nil: handled
	permanent  bool  // err is marked policy.Permanent
	panicked   bool
	probe      bool // the attempt ran on a half-open probe permit
	closed     bool // the breaker is closed after the outcome
	probeFails int  // failed probes in a row of this message, this one included
}

// limits are the engine settings the decisions depend on.
type limits struct {
	poisonProbes int
}

// decideRefused: the guard refused a permit (breaker open, or Admit said
// no). The lane parks until the refusal says to ask again. A message
// waiting for a dead-letter write is never asked about: see decideBefore.
func decideRefused(retryAfter time.Duration) verdict {
	return verdict{act: actPark, delay: max(retryAfter, time.Millisecond)}
}

// decideAttempt maps one failed or successful attempt of the head (outside
// a judge round) to what happens next. A failure that the breaker saw as
// its tenant's (a failed probe, or a breaker no longer closed) parks the
// lane and starts the message's attempts over; any other failure asks the
// guard whether to retry.
func decideAttempt(o outcome, lim limits) verdict {
	switch {
	case o.err == nil:
		return verdict{act: actSettle}
	case o.permanent:
		return verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}
	case o.probe || !o.closed:
		v := verdict{act: actPark, newRound: true}
		if o.probe && o.probeFails >= lim.poisonProbes {
			v.suspect = dlq.ReasonPoison
		}
		return v
	}
	return verdict{act: actAskRetry}
}

// retryFacts are the inputs of decideRetry besides the guard's decision.
type retryFacts struct {
	attempts    int           // attempts of the current round, the failed one included
	maxAttempts int           // the policy's
	panicked    bool          // the failed attempt panicked
	longBackoff time.Duration // the policy's longest backoff (budget refused a retry)
	// deadlineLeft is what is left of the round's Deadline; negative when
	// the policy has none.
	deadlineLeft time.Duration
}

// decideRetry maps the guard's retry decision to what happens next. A
// breaker that opened (another lane of the tenant tripped it) parks; a
// spent budget delays the retry by the longest backoff instead of giving up
// (the message is not at fault); attempts used up, or a wait that would
// outlive the round's deadline, make the message suspect, to be judged.
func decideRetry(rd policy.RetryDecision, f retryFacts) verdict {
	exhausted := verdict{act: actSuspect, reason: dlq.ReasonExhausted}
	if f.panicked {
		exhausted.reason = dlq.ReasonPanic
	}
	switch {
	case rd.Retry:
		if f.deadlineLeft >= 0 && rd.Delay > f.deadlineLeft {
			return exhausted
		}
		return verdict{act: actRetry, delay: max(rd.Delay, time.Microsecond)}
	case rd.Stop == policy.StopOpen:
		return verdict{act: actPark, newRound: true}
	case rd.Stop == policy.StopBudget && f.attempts < f.maxAttempts:
		return verdict{act: actRetry, delay: max(f.longBackoff, time.Microsecond)}
	case rd.Stop == policy.StopPermanent:
		return verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}
	}
	return exhausted
}

// judgeFacts describe a suspect head at the start of its judge step.
type judgeFacts struct {
	reason   dlq.Reason // why it is suspect
	evidence bool       // it already failed while a later message succeeded
	probe    bool       // the permit is a half-open probe
	behind   int        // messages behind it the judge may try (its span)
}

// decideJudgeStart says whether a suspect head is judged now, and how. A
// poison suspect (it failed its probes) is judged only on a probe permit or
// with evidence: a normal permit means the breaker closed again, and the
// head simply runs. The head itself is tried first unless its last failure
// just happened (exhausted or panic, no evidence yet): then the messages
// behind it go first.
func decideJudgeStart(f judgeFacts) (judge, headFirst bool) {
	if f.reason == "" {
		return false, false
	}
	if f.reason == dlq.ReasonPoison && !f.probe && !f.evidence {
		return false, false
	}
	return true, f.reason == dlq.ReasonPoison || f.evidence || f.behind == 0
}

// decideJudgeHead maps the outcome of trying a suspect head in its judge
// round. Handled: settle. Permanent: dead-letter. With nothing behind it to
// try: dead-letter on evidence, else wait (nothing says it is at fault).
// Otherwise the messages behind it are tried next, also when it has
// evidence: an earlier round's evidence is checked against the dependency
// as it is now, so that an outage that came back (a message that failed
// before a winner only because the outage ended mid-round) dead-letters
// nothing, where evidence alone would dead-letter such a head.
func decideJudgeHead(o outcome, f judgeFacts) verdict {
	switch {
	case o.err == nil:
		return verdict{act: actSettle}
	case o.permanent:
		return verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}
	case f.behind == 0 && f.evidence:
		return verdict{act: actDeadLetter, reason: f.reason}
	case f.behind == 0:
		return verdict{act: actWait}
	}
	return verdict{act: actJudgeNext}
}

// decideJudgeEnd maps the end of a judge round whose messages behind the
// head were tried. If one of them was handled (won), the head failed while
// its tenant's dependency worked: its last attempt decides (handled: settle;
// refused: park, keeping the evidence; failed: dead-letter). If they all
// failed, the tenant is failing broadly: nothing is the head's fault, its
// round starts over after a growing wait.
func decideJudgeEnd(won bool, last outcome, refused bool, f judgeFacts) verdict {
	switch {
	case !won:
		return verdict{act: actWait}
	case refused:
		return verdict{act: actPark}
	case last.err == nil:
		return verdict{act: actSettle}
	case last.permanent:
		return verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}
	}
	return verdict{act: actDeadLetter, reason: f.reason}
}

// decideConfirm maps the check of a head that failed its last attempt
// after a winner (see Consumer.confirm): a message behind the winner
// succeeded after that failure (confirmed): dead-letter; all failed: the
// dependency is failing again, wait.
func decideConfirm(confirmed bool, f judgeFacts) verdict {
	if confirmed {
		return verdict{act: actDeadLetter, reason: f.reason}
	}
	return verdict{act: actWait}
}

// decideWait: a head that waits for evidence starts a new round after a
// backoff that grows round to round, or parks if its breaker is not closed.
func decideWait(closed bool, backoff time.Duration) verdict {
	if !closed {
		return verdict{act: actPark, newRound: true}
	}
	return verdict{act: actRetry, delay: max(backoff, time.Millisecond), newRound: true}
}

// decideDLQFailed: a dead letter that could not be written keeps the
// message unsettled and is written again after a wait that starts at
// retry and doubles up to probe: the DLQ is down (the dependency of the
// dead letter, not the message, is at fault), and each write is a probe
// of it, so the wait must not grow past what the DLQ's return may cost.
// A record the sink says can never be written is set aside instead (see
// setAside).
func decideDLQFailed(fails int, retry, probe time.Duration, unwritable bool) (wait time.Duration, aside bool) {
	if unwritable {
		return 0, true
	}
	wait = retry
	for i := 1; i < fails && wait < probe; i++ {
		wait *= 2
	}
	return min(wait, probe), false
}

// decideStuckSpill says why a lane whose oldest message held its
// partition's commit for StuckAfter spills: its DLQ refusing the dead
// letter it waits on (dlqDown), or simply stuck (an open breaker, a
// retrying or hanging head).
func decideStuckSpill(dlqDown bool) SpillReason {
	if dlqDown {
		return SpillDLQUnavailable
	}
	return SpillStuck
}
