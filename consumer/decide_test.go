package consumer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
)

var errBoom = errors.New("boom")

func TestDecideAttempt(t *testing.T) {
	lim := limits{poisonProbes: 3}
	for _, tc := range []struct {
		name string
		o    outcome
		want verdict
	}{
		{"handled", outcome{}, verdict{act: actSettle}},
		{"handled on a probe", outcome{probe: true}, verdict{act: actSettle}},
		{"permanent", outcome{err: errBoom, permanent: true, closed: true}, verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}},
		{"permanent beats an open breaker", outcome{err: errBoom, permanent: true}, verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}},
		{"plain failure, breaker closed: ask the guard", outcome{err: errBoom, closed: true}, verdict{act: actAskRetry}},
		{"the failure opened the breaker: park, new round", outcome{err: errBoom}, verdict{act: actPark, newRound: true}},
		{"failed probe: park", outcome{err: errBoom, probe: true, probeFails: 1}, verdict{act: actPark, newRound: true}},
		{"third failed probe: park, suspect poison", outcome{err: errBoom, probe: true, probeFails: 3}, verdict{act: actPark, newRound: true, suspect: dlq.ReasonPoison}},
		{"panic counts like a failure", outcome{err: errBoom, panicked: true, closed: true}, verdict{act: actAskRetry}},
		// A handler error that wraps the breaker's sentinel is the
		// handler's: it is decided by the guard's retry answer, never a park
		// by itself.
		{"handler error wrapping ErrOpen", outcome{err: fmt.Errorf("inventory: %w", policy.ErrOpen), closed: true}, verdict{act: actAskRetry}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideAttempt(tc.o, lim); got != tc.want {
				t.Fatalf("decideAttempt(%+v) = %+v, want %+v", tc.o, got, tc.want)
			}
		})
	}
}

func TestDecideRetry(t *testing.T) {
	base := retryFacts{attempts: 1, maxAttempts: 3, longBackoff: 5 * time.Second, deadlineLeft: -1}
	with := func(f func(*retryFacts)) retryFacts { x := base; f(&x); return x }
	for _, tc := range []struct {
		name string
		rd   policy.RetryDecision
		f    retryFacts
		want verdict
	}{
		{"retry after the delay", policy.RetryDecision{Retry: true, Delay: 40 * time.Millisecond}, base, verdict{act: actRetry, delay: 40 * time.Millisecond}},
		{"a zero delay still yields", policy.RetryDecision{Retry: true}, base, verdict{act: actRetry, delay: time.Microsecond}},
		{"the wait outlives the round's deadline: suspect", policy.RetryDecision{Retry: true, Delay: time.Second}, with(func(f *retryFacts) { f.deadlineLeft = 500 * time.Millisecond }), verdict{act: actSuspect, reason: dlq.ReasonExhausted}},
		{"the wait fits the deadline", policy.RetryDecision{Retry: true, Delay: time.Second}, with(func(f *retryFacts) { f.deadlineLeft = 2 * time.Second }), verdict{act: actRetry, delay: time.Second}},
		{"attempts used up: suspect", policy.RetryDecision{Stop: policy.StopAttempts}, with(func(f *retryFacts) { f.attempts = 3 }), verdict{act: actSuspect, reason: dlq.ReasonExhausted}},
		{"attempts used up by panics", policy.RetryDecision{Stop: policy.StopAttempts}, with(func(f *retryFacts) { f.attempts, f.panicked = 3, true }), verdict{act: actSuspect, reason: dlq.ReasonPanic}},
		{"breaker opened by another lane: park", policy.RetryDecision{Stop: policy.StopOpen}, base, verdict{act: actPark, newRound: true}},
		{"budget spent, attempts left: longest backoff", policy.RetryDecision{Stop: policy.StopBudget}, base, verdict{act: actRetry, delay: 5 * time.Second}},
		{"budget spent on the last attempt: suspect", policy.RetryDecision{Stop: policy.StopBudget}, with(func(f *retryFacts) { f.attempts = 3 }), verdict{act: actSuspect, reason: dlq.ReasonExhausted}},
		{"permanent", policy.RetryDecision{Stop: policy.StopPermanent}, base, verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideRetry(tc.rd, tc.f); got != tc.want {
				t.Fatalf("decideRetry(%+v, %+v) = %+v, want %+v", tc.rd, tc.f, got, tc.want)
			}
		})
	}
}

func TestDecideJudge(t *testing.T) {
	t.Run("start", func(t *testing.T) {
		for _, tc := range []struct {
			name             string
			f                judgeFacts
			judge, headFirst bool
		}{
			{"not suspect", judgeFacts{behind: 3}, false, false},
			{"exhausted, no evidence: behind first", judgeFacts{reason: dlq.ReasonExhausted, behind: 2}, true, false},
			{"exhausted, alone: head first", judgeFacts{reason: dlq.ReasonExhausted}, true, true},
			{"exhausted with evidence: head first", judgeFacts{reason: dlq.ReasonExhausted, evidence: true, behind: 2}, true, true},
			{"panic, no evidence: behind first", judgeFacts{reason: dlq.ReasonPanic, behind: 1}, true, false},
			{"poison on a normal permit: just run", judgeFacts{reason: dlq.ReasonPoison, behind: 2}, false, false},
			{"poison on a probe: head first", judgeFacts{reason: dlq.ReasonPoison, probe: true, behind: 2}, true, true},
			{"poison with evidence: head first", judgeFacts{reason: dlq.ReasonPoison, evidence: true, behind: 2}, true, true},
		} {
			judge, headFirst := decideJudgeStart(tc.f)
			if judge != tc.judge || headFirst != tc.headFirst {
				t.Errorf("%s: decideJudgeStart(%+v) = %v, %v; want %v, %v", tc.name, tc.f, judge, headFirst, tc.judge, tc.headFirst)
			}
		}
	})
	t.Run("head", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			o    outcome
			f    judgeFacts
			want verdict
		}{
			{"handled", outcome{}, judgeFacts{reason: dlq.ReasonPoison, behind: 2}, verdict{act: actSettle}},
			{"permanent", outcome{err: errBoom, permanent: true}, judgeFacts{reason: dlq.ReasonPoison, behind: 2}, verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}},
			{"alone with evidence: dead letter", outcome{err: errBoom}, judgeFacts{reason: dlq.ReasonExhausted, evidence: true}, verdict{act: actDeadLetter, reason: dlq.ReasonExhausted}},
			{"alone without evidence: wait", outcome{err: errBoom}, judgeFacts{reason: dlq.ReasonExhausted}, verdict{act: actWait}},
			{"with messages behind: try them", outcome{err: errBoom}, judgeFacts{reason: dlq.ReasonPoison, behind: 1}, verdict{act: actJudgeNext}},
			{"evidence and messages behind: check it against them", outcome{err: errBoom}, judgeFacts{reason: dlq.ReasonPoison, evidence: true, behind: 1}, verdict{act: actJudgeNext}},
		} {
			if got := decideJudgeHead(tc.o, tc.f); got != tc.want {
				t.Errorf("%s: decideJudgeHead = %+v, want %+v", tc.name, got, tc.want)
			}
		}
	})
	t.Run("end", func(t *testing.T) {
		f := judgeFacts{reason: dlq.ReasonPoison, behind: 2}
		for _, tc := range []struct {
			name    string
			won     bool
			last    outcome
			refused bool
			want    verdict
		}{
			{"nothing behind succeeded: outage, wait", false, outcome{}, false, verdict{act: actWait}},
			{"won, last attempt refused: park with evidence", true, outcome{}, true, verdict{act: actPark}},
			{"won, head handled at last", true, outcome{}, false, verdict{act: actSettle}},
			{"won, head failed again: dead letter", true, outcome{err: errBoom}, false, verdict{act: actDeadLetter, reason: dlq.ReasonPoison}},
			{"won, head failed permanently", true, outcome{err: errBoom, permanent: true}, false, verdict{act: actDeadLetter, reason: dlq.ReasonPermanent}},
		} {
			if got := decideJudgeEnd(tc.won, tc.last, tc.refused, f); got != tc.want {
				t.Errorf("%s: decideJudgeEnd = %+v, want %+v", tc.name, got, tc.want)
			}
		}
	})
	t.Run("confirm", func(t *testing.T) {
		f := judgeFacts{reason: dlq.ReasonExhausted, behind: 1}
		if got := decideConfirm(true, f); got != (verdict{act: actDeadLetter, reason: dlq.ReasonExhausted}) {
			t.Errorf("a message behind the winner succeeded after the head failed: %+v, want a dead letter", got)
		}
		if got := decideConfirm(false, f); got != (verdict{act: actWait}) {
			t.Errorf("every message behind the winner failed too: %+v, want wait", got)
		}
	})
}

func TestDecideWaitAndDLQ(t *testing.T) {
	if got := decideWait(true, 30*time.Millisecond); got != (verdict{act: actRetry, delay: 30 * time.Millisecond, newRound: true}) {
		t.Errorf("closed: %+v", got)
	}
	if got := decideWait(true, 0); got.delay != time.Millisecond {
		t.Errorf("a zero backoff waits 1ms, got %v", got.delay)
	}
	if got := decideWait(false, 30*time.Millisecond); got != (verdict{act: actPark, newRound: true}) {
		t.Errorf("not closed: %+v", got)
	}
	if got := decideRefused(0); got != (verdict{act: actPark, delay: time.Millisecond}) {
		t.Errorf("decideRefused(0) = %+v", got)
	}
}

// TestDecideStuckSpill: a lane stuck behind a dead letter its DLQ refuses
// spills for that reason; any other stuck lane as stuck.
func TestDecideStuckSpill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dlqDown bool
		want    SpillReason
	}{
		{false, SpillStuck},
		{true, SpillDLQUnavailable},
	} {
		if got := decideStuckSpill(tc.dlqDown); got != tc.want {
			t.Errorf("decideStuckSpill(dlqDown=%v) = %v, want %v", tc.dlqDown, got, tc.want)
		}
	}
}

// TestDecideDLQFailed: a refused dead letter is written again after a wait
// that doubles from DLQRetry up to DLQProbe (each write a probe of the
// DLQ), never longer, however long the DLQ stays down; one the DLQ can
// never take is set aside at once.
func TestDecideDLQFailed(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	for _, tc := range []struct {
		name         string
		fails        int
		retry, probe time.Duration
		unwritable   bool
		wait         time.Duration
		aside        bool
	}{
		{"first failure: DLQRetry", 1, 100 * ms, time.Second, false, 100 * ms, false},
		{"second: doubled", 2, 100 * ms, time.Second, false, 200 * ms, false},
		{"fourth", 4, 100 * ms, time.Second, false, 800 * ms, false},
		{"fifth: capped at DLQProbe", 5, 100 * ms, time.Second, false, time.Second, false},
		{"a minute of failures: still DLQProbe", 60, 100 * ms, time.Second, false, time.Second, false},
		{"a million failures: no overflow", 1 << 20, time.Hour, 2 * time.Hour, false, 2 * time.Hour, false},
		{"DLQProbe equal to DLQRetry: constant", 7, time.Second, time.Second, false, time.Second, false},
		{"unwritable: set aside", 1, 100 * ms, time.Second, true, 0, true},
		{"unwritable after transient failures", 9, 100 * ms, time.Second, true, 0, true},
	} {
		wait, aside := decideDLQFailed(tc.fails, tc.retry, tc.probe, tc.unwritable)
		if wait != tc.wait || aside != tc.aside {
			t.Errorf("%s: decideDLQFailed(%d, %v, %v, %v) = %v, %v; want %v, %v", tc.name, tc.fails, tc.retry, tc.probe, tc.unwritable, wait, aside, tc.wait, tc.aside)
		}
	}
}
