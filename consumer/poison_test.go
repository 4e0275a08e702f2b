package consumer_test

// Poison: a message that keeps failing is dead-lettered only on evidence
// that the failure is its own (a later message of its tenant succeeded),
// never during what may be its tenant's outage. A suspect head is judged:
// the messages behind it are tried, and it gets a last attempt.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// closedBreakerPolicy fails messages through their attempts without
// tripping the breaker, so that a failing head becomes suspect and is
// judged (rather than parked behind an open breaker).
func closedBreakerPolicy() policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1000},
		Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
	}
}

// A message that always fails while the breaker stays closed is
// dead-lettered after max attempts, once the tenant's next message shows
// that the failure is the message's own.
func TestExhaustedMessageIsDeadLetteredOnEvidence(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 5 {
		produce(h, "A", 0, i)
	}
	p := fastPolicy()
	p.Breaker.ConsecutiveFailures = 10 // stays closed through 3 attempts
	var calls atomic.Int64
	rec := consumertest.NewRecorder()
	run(t, h, p, consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000001" {
			calls.Add(1)
			return errors.New("bad row")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "4 handled, 1 dead letter", func() bool { return rec.Distinct() == 4 && h.S.Total() == 1 })
	got := h.S.Records("A", false)[0]
	// 3 attempts, then one last attempt after the next message succeeded.
	if got.Reason != dlq.ReasonExhausted || got.Attempts != 4 || calls.Load() != 4 {
		t.Fatalf("reason %q attempts %d calls %d", got.Reason, got.Attempts, calls.Load())
	}
}

// The head exhausts its attempts, the next message succeeds, and the head's
// last attempt succeeds too (the failure ended just then): nothing is
// dead-lettered.
func TestJudgeGivesTheHeadALastChance(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 3 {
		produce(h, "A", 0, i)
	}
	p := fastPolicy()
	p.Breaker.ConsecutiveFailures = 10
	var calls atomic.Int64
	rec := consumertest.NewRecorder()
	run(t, h, p, consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000000" && calls.Add(1) <= 3 {
			return errors.New("flaky")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "all three handled", func() bool { return rec.Distinct() == 3 })
	if h.S.Total() != 0 {
		t.Fatalf("dead-lettered %d", h.S.Total())
	}
	if got := rec.Order("A"); got[0] != "A/0/000001" || got[1] != "A/0/000000" {
		t.Fatalf("order %v: want the judge (000001) first, then the head", got)
	}
}

// A suspect head's last attempt in a judge round is a round of its own: it
// must not inherit what little its spent round left of the policy's
// Deadline, or a transient outage would dead-letter a message (the judge
// would take a timeout for evidence against it). The head fails until the
// message behind it has won the judge round; its last attempt then
// succeeds only if its deadline lies past its first round's: a round that
// began later. The engine's own deadlines decide, not how long the
// machine takes over the calls.
func TestJudgedAttemptGetsAFreshDeadline(t *testing.T) {
	sink := consumertest.NewSink()
	src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("a", []string{"head", "next"}[i]) })
	p := policy.Policy{
		Deadline: 100 * time.Millisecond,
		Retry:    policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 60 * time.Millisecond}},
	}
	var handled atomic.Int64
	var nextDone atomic.Bool
	var firstRound atomic.Pointer[time.Time] // the deadline of the head's first call
	startWith(t, consumer.Config{
		Scope: scope.New(p, scope.Options[string]{}),
		DLQ:   sink,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			dl, ok := ctx.Deadline()
			if !ok {
				return policy.Permanent(fmt.Errorf("%s: a call without a deadline under a policy with one", m.Value))
			}
			switch {
			case string(m.Value) == "next":
				nextDone.Store(true)
			case !nextDone.Load():
				firstRound.CompareAndSwap(nil, &dl)
				return errors.New("down for the head's first round")
			case !dl.After(*firstRound.Load()):
				return fmt.Errorf("the judged attempt's deadline %v is its first round's (%v)", dl, *firstRound.Load())
			}
			handled.Add(1)
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "both handled", func() bool { return handled.Load() == 2 || len(sink.Records("a", false)) > 0 })
	if recs := sink.Records("a", false); len(recs) != 0 {
		t.Fatalf("the head was dead-lettered (%q) after its last attempt inherited its round's spent deadline", recs[0].Error)
	}
}

// A message that trips its tenant's breaker and fails every probe is
// dead-lettered as poison once the tenant's next message succeeds as a
// probe.
func TestLonePoisonDoesNotParkForever(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	produce(h, "A", 0, 0)
	rec := consumertest.NewRecorder()
	var poisonCalls atomic.Int64
	e := run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) == "A/0/000000" {
			poisonCalls.Add(1)
			return errors.New("always fails")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	// Alone, it trips the breaker (3 consecutive) and is probed again and
	// again: it must not be dead-lettered as exhausted during what could be
	// an outage.
	consumertest.Eventually(t, "the lone message probed past PoisonProbes", func() bool { return poisonCalls.Load() >= 6 })
	if h.S.Total() != 0 {
		t.Fatal("lone failing message dead-lettered without evidence it is poison")
	}
	for i := 1; i <= 3; i++ {
		produce(h, "A", 0, i)
	}
	consumertest.Eventually(t, "the poison message dead-lettered, the others handled", func() bool {
		return h.S.Total() == 1 && rec.Distinct() == 3
	})
	got := h.S.Records("A", false)[0]
	if got.Reason != dlq.ReasonPoison || string(got.Value) != "A/0/000000" {
		t.Fatalf("dead letter reason %q value %q", got.Reason, got.Value)
	}
	assertPartitionOrder(t, rec.Order("A"))
	e.stop()
	if c := h.B.Committed(h.Group, 0); c != 4 {
		t.Fatalf("committed %d, want 4", c)
	}
}

// A tenant's only message fails during an outage. With the default shape of
// policy (the breaker allows more consecutive failures than one message has
// attempts), it must wait for the outage to end, not be dead-lettered as
// exhausted.
func TestLoneMessageWaitsOutAnOutage(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	produceValues(h, "A", 0, "only")
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(string, int) error {
		if down.Load() {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 5 // policy.Default: 5 failures, 3 attempts
	startScripted(t, h, p, consumer.Config{}, hd)
	if !within(consumertest.WaitTimeout, func() bool { return h.S.Total() > 0 || hd.callsOf("only") >= 7 }) {
		t.Fatal("the lone message was neither retried nor probed")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		t.Fatalf("a lone message dead-lettered during an outage after %d calls: %v", hd.callsOf("only"), h.S.Records("A", false)[0].Reason)
	}
	down.Store(false)
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("only") }) {
		t.Fatal("the lone message was not handled after the outage")
	}
}

// A poison message followed in its lane by
// another message that can never succeed (poison or permanent) must not
// stall the lane: both end in the DLQ and the good message after them is
// handled.
func TestAdjacentBadMessagesAreBothDeadLettered(t *testing.T) {
	for _, second := range []string{"poison", "permanent"} {
		t.Run(second, func(t *testing.T) {
			h := consumertest.NewMemHarness(1)
			produceValues(h, "A", 0, "bad-1", "bad-2-"+second, "good")
			hd := newScripted(func(v string, _ int) error {
				switch v {
				case "bad-1", "bad-2-poison":
					return errors.New("cannot process")
				case "bad-2-permanent":
					return policy.Permanent(errors.New("malformed"))
				}
				return nil
			})
			p := consumertest.FastPolicy()
			p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
			startScripted(t, h, p, consumer.Config{PoisonProbes: 2}, hd)
			if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("good") && h.S.Total() == 2 }) {
				t.Fatalf("lane stalled: DLQ %v, handled %v, calls bad-1 %d bad-2 %d committed %d of 3",
					dlqValues(h, "A"), hd.handledList(), hd.callsOf("bad-1"), hd.callsOf("bad-2-"+second), h.B.Committed(h.Group, 0))
			}
		})
	}
}

// A run of poison messages needs a success behind each of them. Followed
// by one good message, the first is dead-lettered on its evidence; the
// others failed in that round too, but as heads their evidence is checked
// against the messages behind them (an outage may be back), those fail,
// and they wait like lone messages: never dead-lettered without a success
// behind them. The tenant's next good messages are that evidence.
func TestRunOfPoisonNeedsASuccessBehindEach(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 4 {
		produce(h, "A", 0, i) // 0-2 poison, 3 good
	}
	rec := consumertest.NewRecorder()
	var calls atomic.Int64
	run(t, h, fastPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		calls.Add(1)
		if v := string(m.Value); v < "A/0/000003" {
			return errors.New("poison")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "the first poison message dead-lettered, the good one handled", func() bool {
		return h.S.Total() == 1 && rec.Distinct() == 1
	})
	// The other two keep being tried, and are not dead-lettered without a
	// success behind them.
	n := calls.Load()
	consumertest.Eventually(t, "the others tried again", func() bool { return calls.Load() >= n+6 })
	if got := h.S.Total(); got != 1 {
		t.Fatalf("%d dead letters with no success behind the last poison messages, want 1", got)
	}
	produce(h, "A", 0, 4)
	produce(h, "A", 0, 5)
	consumertest.Eventually(t, "all three poison messages dead-lettered, the good ones handled", func() bool {
		return h.S.Total() == 3 && rec.Distinct() == 3
	})
	for i, r := range h.S.Records("A", false) {
		if want := fmt.Sprintf("A/0/%06d", i); string(r.Value) != want {
			t.Errorf("dead letter %d is %q, want %q (in order)", i, r.Value, want)
		}
	}
	consumertest.Eventually(t, "committed past all six", func() bool { return h.B.Committed(h.Group, 0) == 6 })
}

// Poison and good messages alternate in one lane. Each poison message
// needs a success behind it before its last failure and, when a message is
// behind that one, a success after it too (a confirmer); the successes are
// used up out of order (a winner or a confirmer is handled ahead of the
// suspect head), so the last poison messages of the burst may wait for
// the tenant's next messages, as a run of poison messages does. Those
// come: every poison message is then dead-lettered, in order, no good one
// is, and a confirmer that is itself poison never keeps a head waiting
// once good messages follow.
func TestAlternatingPoisonAreAllDeadLettered(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	const n = 8
	for i := range n {
		produce(h, "A", 0, i) // even: poison
	}
	rec := consumertest.NewRecorder()
	var poisonCalls atomic.Int64
	run(t, h, closedBreakerPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		var seq int
		if _, err := fmt.Sscanf(string(m.Value), "A/0/%06d", &seq); err != nil {
			return policy.Permanent(err)
		}
		if seq < n && seq%2 == 0 {
			poisonCalls.Add(1)
			return errors.New("poison")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	consumertest.Eventually(t, "the good messages of the burst handled, a poison one dead-lettered", func() bool {
		return rec.Distinct() == n/2 && h.S.Total() >= 1
	})
	calls := poisonCalls.Load()
	consumertest.Eventually(t, "the poison messages left tried again", func() bool { return poisonCalls.Load() >= calls+6 })
	for i := n; i < n+4; i++ {
		produce(h, "A", 0, i) // the tenant's next messages: good
	}
	consumertest.Eventually(t, "every poison message dead-lettered, every good one handled", func() bool {
		return h.S.Total() == n/2 && rec.Distinct() == n/2+4
	})
	for i, r := range h.S.Records("A", false) {
		if want := fmt.Sprintf("A/0/%06d", 2*i); string(r.Value) != want {
			t.Errorf("dead letter %d is %q, want %q (in order)", i, r.Value, want)
		}
	}
	consumertest.Eventually(t, "committed past all", func() bool { return h.B.Committed(h.Group, 0) == n+4 })
}

// A suspect head whose dependency comes back for the winner's call and is
// down again for its own last attempt failed for the outage, not for
// itself: the message behind the winner is tried to confirm, fails too,
// and the head waits instead of being dead-lettered: an outage that
// returns between the winner's call and the head's must not dead-letter a
// good message.
func TestSuspectHeadFailingAfterTheWinnerIsConfirmed(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	for i := range 3 {
		produce(h, "A", 0, i) // 0 the head, 1 the winner, 2 the confirmer
	}
	var down atomic.Bool
	down.Store(true)
	var winnerCalls, confirmerCalls atomic.Int64
	rec := consumertest.NewRecorder()
	run(t, h, closedBreakerPolicy(), consumer.Config{Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		switch string(m.Value) {
		case "A/0/000001":
			if winnerCalls.Add(1) == 1 {
				// The outage ends for this one call and is back at once.
				rec.Add("A", string(m.Value))
				return nil
			}
		case "A/0/000002":
			confirmerCalls.Add(1)
		}
		if down.Load() {
			return errors.New("dependency down")
		}
		rec.Add("A", string(m.Value))
		return nil
	})})
	// The confirmer's second call comes from a later round: the first
	// round's verdict on the head is in by then.
	consumertest.Eventually(t, "the message behind the winner tried in two rounds", func() bool { return confirmerCalls.Load() >= 2 })
	if n := h.S.Total(); n != 0 {
		t.Fatalf("%d dead letters: the head failed its last attempt while the outage was back, and the message behind the winner failed too", n)
	}
	down.Store(false)
	consumertest.Eventually(t, "all three handled", func() bool { return rec.Distinct() == 3 })
	consumertest.Eventually(t, "committed past all three", func() bool { return h.B.Committed(h.Group, 0) == 3 })
	if n := h.S.Total(); n != 0 {
		t.Fatalf("%d dead letters for three messages that can succeed", n)
	}
}

// Poison heads of several tenants fill a partition's queue bound (no spill
// log): each waits, behind its open breaker, for a later message of its
// tenant as evidence, and those are still in the broker. The full-queue
// pause counts only messages that can run, so it lifts, the later messages
// arrive, and the poison ones are dead-lettered on their evidence (were the
// pause to wait for the parked poison messages to leave, they would wait
// for it to lift).
func TestPoisonHeadsFillingTheQueueDoNotStallThePartition(t *testing.T) {
	t.Parallel()
	h := consumertest.NewMemHarness(1)
	tenants := []string{"A", "B", "C"}
	for _, tn := range tenants {
		produce(h, tn, 0, 0) // poison
	}
	for i := range 6 {
		produce(h, "X", 0, i)
	}
	for _, tn := range tenants {
		produce(h, tn, 0, 1) // good: the evidence
	}
	rec := consumertest.NewRecorder()
	run(t, h, fastPolicy(), consumer.Config{
		MaxQueuedPerPartition: 4,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if strings.HasSuffix(string(m.Value), "/000000") && !strings.HasPrefix(string(m.Value), "X/") {
				return errors.New("poison")
			}
			rec.Add(string(m.Key), string(m.Value))
			return nil
		}),
	})
	consumertest.Eventually(t, "the three poison messages dead-lettered, everything else handled", func() bool {
		return h.S.Total() == 3 && rec.Distinct() == 9
	})
	consumertest.Eventually(t, "committed past all twelve", func() bool { return h.B.Committed(h.Group, 0) == 12 })
}

// PoisonProbes failed probes are needed before a head is judged as poison. A
// healthy message that failed PoisonProbes probes alone during an outage and
// then succeeded must not leave its lane marked: the next head would be
// judged after its first failed probe.
func TestRecoveredHeadLeavesNoStaleJudge(t *testing.T) {
	for _, suspect := range []bool{false, true} {
		t.Run(fmt.Sprintf("suspect-before=%v", suspect), func(t *testing.T) {
			testRecoveredHeadLeavesNoStaleJudge(t, suspect)
		})
	}
}

func testRecoveredHeadLeavesNoStaleJudge(t *testing.T, suspect bool) {
	h := consumertest.NewMemHarness(1)
	var down atomic.Bool
	down.Store(suspect)
	// flaky fails its first 4 calls: 2 while closed (trips the breaker at
	// 2), then 2 failed probes, fewer than PoisonProbes (3), then succeeds.
	hd := newScripted(func(v string, call int) error {
		if v == "flaky" && call <= 4 {
			return errors.New("flaked")
		}
		if down.Load() {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 2
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
	startScripted(t, h, p, consumer.Config{PoisonProbes: 3}, hd)
	produceValues(h, "A", 0, "first")
	if suspect {
		// 2 failures trip the breaker, then PoisonProbes probes fail: the
		// lone head is now suspect.
		if !within(consumertest.WaitTimeout, func() bool { return hd.callsOf("first") >= 2+3+1 }) {
			t.Fatal("the lone head was not probed past PoisonProbes")
		}
		down.Store(false)
	}
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("first") }) {
		t.Fatal("the first message was not handled")
	}
	produceValues(h, "A", 0, "flaky", "next")
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("flaky", "next") || h.S.Total() > 0 }) {
		t.Fatalf("flaky and next not settled: calls %d", hd.callsOf("flaky"))
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls (PoisonProbes 3 failed probes never happened)", got, r.Reason, r.Attempts)
	}
	if got := hd.callsOf("flaky"); got != 5 {
		t.Fatalf("flaky called %d times, want 5 (2 closed, 2 failed probes, 1 success)", got)
	}
}

// A tenant's dependency fails in two windows, and the tenant succeeds
// between them. A message that failed in the first window and fails again
// in the second is no more at fault than the message behind it, which
// fails too: nothing may be dead-lettered. The one success between the
// windows is the only call the dependency answers, so that no retry of the
// head can land between them however the calls are timed.
func TestFailuresInTwoOutagesAreNotEvidence(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(v string, _ int) error {
		if v != "between" && down.Load() {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 10 // stays closed: the judge decides
	p.Retry.Backoff.Base = 100 * time.Millisecond
	e := startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head", "behind")
	if !within(consumertest.WaitTimeout, func() bool { return e.c.Stats().Failed >= 1 }) {
		t.Fatal("head never failed")
	}
	// First window over: another message of the tenant succeeds while the
	// head waits for its retry; then the second window.
	produceValues(h, "A", 1, "between")
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("between") }) {
		t.Fatal("the message between the windows was not handled")
	}
	if !within(consumertest.WaitTimeout, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 5 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, though the message behind it (called %d times) fails the same way",
			got, r.Reason, r.Attempts, hd.callsOf("behind"))
	}
	down.Store(false)
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("head", "behind") }) {
		t.Fatal("head and behind not handled after the outage")
	}
}

// The lone-head form of TestFailuresInTwoOutagesAreNotEvidence. A tenant's
// only message on its partition becomes suspect in an outage; between two
// outage windows a message of the tenant on another partition succeeds;
// the head then fails in the second window. That success was not
// simultaneous with the head's failures: nothing may be dead-lettered.
func TestLoneHeadFailingInTwoOutagesIsNotDeadLettered(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	suspect := make(chan struct{})
	var once sync.Once
	hd := newScripted(func(v string, call int) error {
		if v == "between" || !down.Load() {
			return nil // between the windows: the one call the dependency answers
		}
		if v == "head" && call == 4 {
			// 3 attempts, then the judge's own try: the head is now a
			// suspect waiting out its backoff.
			once.Do(func() { close(suspect) })
		}
		return errOutage
	})
	p := consumertest.FastPolicy() // 3 attempts
	p.Breaker.ConsecutiveFailures = 10
	p.Retry.Backoff.Base = 250 * time.Millisecond // room for "between" to run first
	e := startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head")
	select {
	case <-suspect:
	case <-time.After(consumertest.WaitTimeout):
		t.Fatal("the head did not become suspect")
	}
	// Its fourth failure is recorded before the tenant's next success.
	if !within(consumertest.WaitTimeout, func() bool { return e.c.Stats().Failed >= 4 }) {
		t.Fatal("the head's fourth failure was not recorded")
	}
	produceValues(h, "A", 1, "between")
	if !within(consumertest.WaitTimeout, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 6 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, all of them in outage windows", got, r.Reason, r.Attempts)
	}
	down.Store(false)
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("head", "between") }) {
		t.Fatal("head not handled after the outage")
	}
}

// A message that fails twice and then succeeds, with MaxAttempts 3, must not
// be dead-lettered. Here it arrives behind two poison messages after their
// judge span has grown, so its first attempt is in the judge round that a
// later message wins.
func TestMessageTriedAsEvidenceKeepsItsAttempts(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	hd := newScripted(func(v string, call int) error {
		switch {
		case v == "poison-1" || v == "poison-2":
			return errors.New("cannot process")
		case v == "flaky" && call <= 2:
			return errors.New("flaked")
		}
		return nil
	})
	p := consumertest.FastPolicy() // 3 attempts
	p.Breaker.ConsecutiveFailures = 2
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = 5*time.Millisecond, 10*time.Millisecond
	startScripted(t, h, p, consumer.Config{PoisonProbes: 2}, hd)
	produceValues(h, "A", 0, "poison-1", "poison-2")
	// poison-2 fails in judge rounds that nothing wins: the span grows.
	if !within(consumertest.WaitTimeout, func() bool { return hd.callsOf("poison-2") >= 3 }) {
		t.Fatal("poison-2 was not tried as evidence")
	}
	produceValues(h, "A", 0, "flaky", "good")
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("good") && h.S.Total() >= 2 && hd.callsOf("flaky") >= 2 }) {
		t.Fatalf("not settled: DLQ %v, handled %v", dlqValues(h, "A"), hd.handledList())
	}
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll("flaky") || slices.Contains(dlqValues(h, "A"), "flaky") }) {
		t.Fatal("flaky neither handled nor dead-lettered")
	}
	if got := dlqValues(h, "A"); slices.Contains(got, "flaky") {
		t.Fatalf("DLQ %v: flaky dead-lettered after %d calls, with 3 attempts allowed", got, hd.callsOf("flaky"))
	}
}
