package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// scripted is a handler whose outcome per message value is decided by fail
// (called with the value and its 1-based call number); successes are
// recorded in order.
type scripted struct {
	fail func(value string, call int) error

	mu      sync.Mutex
	calls   map[string]int
	handled []string
}

func newScripted(fail func(value string, call int) error) *scripted {
	return &scripted{fail: fail, calls: map[string]int{}}
}

func (s *scripted) Handle(ctx context.Context, m *consumer.Message) error {
	v := string(m.Value)
	s.mu.Lock()
	s.calls[v]++
	call := s.calls[v]
	s.mu.Unlock()
	if err := s.fail(v, call); err != nil {
		return err
	}
	s.mu.Lock()
	s.handled = append(s.handled, v)
	s.mu.Unlock()
	return nil
}

func (s *scripted) callsOf(v string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[v]
}

func (s *scripted) handledAll(vs ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range vs {
		if !slices.Contains(s.handled, v) {
			return false
		}
	}
	return true
}

// startScripted runs an engine over h with policy p and cfg's limits.
func startScripted(t *testing.T, h *consumertest.MemHarness, p policy.Policy, cfg consumer.Config, hd consumer.Handler) *runningEngine {
	t.Helper()
	cfg.Scope = scope.New(p, scope.Options[string]{})
	cfg.Handler = hd
	cfg.Tenant = h.Tenant()
	cfg.DLQ = h.S
	cfg.Group = h.Group
	cfg.DLQRetry = time.Millisecond
	cfg.DrainTimeout = 2 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := h.B.Source(h.Group)
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEngine{c: c, src: src, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx, src) }()
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// within polls cond every 2ms for up to d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// knownBug skips a reproduction of an open engine bug unless
// -prop.knownbugs is set; remove the call once the bug is fixed.
func knownBug(t *testing.T, what string) {
	t.Helper()
	if !*propKnown {
		t.Skip("known bug: " + what + " (run with -prop.knownbugs)")
	}
}

func (s *scripted) handledList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handled)
}

func produceValues(h *consumertest.MemHarness, tenant string, p int, values ...string) {
	for _, v := range values {
		h.B.Append(p, nil, []byte(v), dlq.Header{Key: consumertest.TenantHeader, Value: []byte(tenant)})
	}
}

func dlqValues(h *consumertest.MemHarness, tenant string) []string {
	var out []string
	for _, r := range h.S.Records(tenant, false) {
		out = append(out, string(r.Value))
	}
	return out
}

// TestPropertyPausedRebalance: a partition paused by a bound when a
// rebalance revokes and reassigns it must flow again once the pressure is
// gone.
func TestPropertyPausedRebalance(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	var values []string
	for i := range 40 {
		values = append(values, fmt.Sprintf("m%02d", i))
	}
	produceValues(h, "A", 0, values...)
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(string, int) error {
		if down.Load() {
			return errOutage
		}
		return nil
	})
	var revoked atomic.Int32
	p := consumertest.FastPolicy()
	e := startScripted(t, h, p, consumer.Config{MaxQueuedPerPartition: 8, OnEvent: func(ev consumer.Event) {
		if ev.Kind == consumer.EventRevoked {
			revoked.Add(1)
		}
	}}, hd)
	if !within(5*time.Second, func() bool { return e.c.Stats().PausedPartitions == 1 }) {
		t.Fatal("partition 0 never paused at MaxQueuedPerPartition 8")
	}
	// The outage lasts until the partition was revoked, so the engine
	// cannot resume it before.
	e.src.Rebalance()
	if !within(5*time.Second, func() bool { return revoked.Load() == 1 }) {
		t.Fatal("the rebalance did not revoke partition 0")
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll(values...) }) {
		s := e.c.Stats()
		t.Fatalf("after a rebalance of the paused partition: committed %d of 40, queued %d, paused partitions %d; the source's partition stays paused",
			h.B.Committed(h.Group, 0), s.Queued, s.PausedPartitions)
	}
}

// TestPropertyLoneMessageOutage: a tenant's only message fails during an
// outage. With the default shape of policy (the breaker allows more
// consecutive failures than one message has attempts), it must wait for
// the outage to end, not be dead-lettered as exhausted.
func TestPropertyLoneMessageOutage(t *testing.T) {
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
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("only") >= 7 }) {
		t.Fatal("the lone message was neither retried nor probed")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		t.Fatalf("a lone message dead-lettered during an outage after %d calls: %v", hd.callsOf("only"), h.S.Records("A", false)[0].Reason)
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("only") }) {
		t.Fatal("the lone message was not handled after the outage")
	}
}

// TestPropertyAdjacentBadMessages: a poison message followed in its lane by
// another message that can never succeed (poison or permanent) must not
// stall the lane: both end in the DLQ and the good message after them is
// handled.
func TestPropertyAdjacentBadMessages(t *testing.T) {
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
			if !within(3*time.Second, func() bool { return hd.handledAll("good") && h.S.Total() == 2 }) {
				t.Fatalf("lane stalled: DLQ %v, handled %v, calls bad-1 %d bad-2 %d committed %d of 3",
					dlqValues(h, "A"), hd.handledList(), hd.callsOf("bad-1"), hd.callsOf("bad-2-"+second), h.B.Committed(h.Group, 0))
			}
		})
	}
}

// TestPropertyStaleJudge: PoisonProbes failed probes are needed before a
// head is judged as poison. A healthy message that failed PoisonProbes
// probes alone during an outage and then succeeded must not leave its lane
// marked: the next head would be judged after its first failed probe.
func TestPropertyStaleJudge(t *testing.T) {
	for _, suspect := range []bool{false, true} {
		t.Run(fmt.Sprintf("suspect-before=%v", suspect), func(t *testing.T) {
			testStaleJudge(t, suspect)
		})
	}
}

func testStaleJudge(t *testing.T, suspect bool) {
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
		if !within(5*time.Second, func() bool { return hd.callsOf("first") >= 2+3+1 }) {
			t.Fatal("the lone head was not probed past PoisonProbes")
		}
		down.Store(false)
	}
	if !within(5*time.Second, func() bool { return hd.handledAll("first") }) {
		t.Fatal("the first message was not handled")
	}
	produceValues(h, "A", 0, "flaky", "next")
	if !within(5*time.Second, func() bool { return hd.handledAll("flaky", "next") || h.S.Total() > 0 }) {
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

// TestPropertyRevokeWhileResuming: rebalances while parked lanes resume.
// Under -race it catches a worker that reads its lane's parked flag without
// the engine's lock while Revoked clears it (9 runs in 10 before the fix).
// Whatever the interleaving, nothing may be lost.
func TestPropertyRevokeWhileResuming(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	const tenants, per = 32, 20
	var values []string
	for i := range per {
		for tn := range tenants {
			v := fmt.Sprintf("t%02d-%02d", tn, i)
			values = append(values, v)
			produceValues(h, fmt.Sprintf("t%02d", tn), tn%2, v)
		}
	}
	// Every tenant flaps: its messages fail on odd calls, so lanes park and
	// resume all the time.
	hd := newScripted(func(v string, call int) error {
		if call%2 == 1 {
			return errOutage
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 1
	p.Breaker.OpenTimeout, p.Breaker.MaxOpenTimeout = time.Millisecond, time.Millisecond
	e := startScripted(t, h, p, consumer.Config{}, hd)
	for range 300 {
		e.src.Rebalance()
		time.Sleep(time.Millisecond) // pacing of the rebalances, not a wait for the engine
	}
	if !within(10*time.Second, func() bool { return hd.handledAll(values...) }) {
		t.Fatalf("not every message handled after the rebalances: %d distinct of %d", len(slices.Compact(slices.Sorted(slices.Values(hd.handledList())))), len(values))
	}
}

// TestPropertyEvidenceAcrossOutages: a tenant's dependency fails in two
// windows, and the tenant succeeds between them. A message that failed in
// the first window and fails again in the second is no more at fault than
// the message behind it, which fails too: nothing may be dead-lettered.
func TestPropertyEvidenceAcrossOutages(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	hd := newScripted(func(v string, _ int) error {
		if down.Load() {
			return errOutage
		}
		if v == "between" {
			down.Store(true) // the second window opens right after this success
		}
		return nil
	})
	p := consumertest.FastPolicy()
	p.Breaker.ConsecutiveFailures = 10 // stays closed: the judge decides
	p.Retry.Backoff.Base = 100 * time.Millisecond
	startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head", "behind")
	if !within(5*time.Second, func() bool { return hd.callsOf("head") >= 1 }) {
		t.Fatal("head never attempted")
	}
	// First window over; another message of the tenant succeeds while the
	// head waits for its retry, and the second window opens.
	down.Store(false)
	produceValues(h, "A", 1, "between")
	if !within(5*time.Second, func() bool { return hd.handledAll("between") }) {
		t.Fatal("the message between the windows was not handled")
	}
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 5 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, though the message behind it (called %d times) fails the same way",
			got, r.Reason, r.Attempts, hd.callsOf("behind"))
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("head", "behind") }) {
		t.Fatal("head and behind not handled after the outage")
	}
}

// TestPropertyJudgedNextKeepsRetries: a message that fails twice and then
// succeeds, with MaxAttempts 3, must not be dead-lettered. Here it arrives
// behind two poison messages after their judge span has grown, so its first
// attempt is in the judge round that a later message wins.
func TestPropertyJudgedNextKeepsRetries(t *testing.T) {
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
	if !within(5*time.Second, func() bool { return hd.callsOf("poison-2") >= 3 }) {
		t.Fatal("poison-2 was not tried as evidence")
	}
	produceValues(h, "A", 0, "flaky", "good")
	if !within(5*time.Second, func() bool { return hd.handledAll("good") && h.S.Total() >= 2 && hd.callsOf("flaky") >= 2 }) {
		t.Fatalf("not settled: DLQ %v, handled %v", dlqValues(h, "A"), hd.handledList())
	}
	if !within(5*time.Second, func() bool { return hd.handledAll("flaky") || slices.Contains(dlqValues(h, "A"), "flaky") }) {
		t.Fatal("flaky neither handled nor dead-lettered")
	}
	if got := dlqValues(h, "A"); slices.Contains(got, "flaky") {
		t.Fatalf("DLQ %v: flaky dead-lettered after %d calls, with 3 attempts allowed", got, hd.callsOf("flaky"))
	}
}

// TestPropertyLoneEvidenceAcrossOutages: the lone-head form of
// TestPropertyEvidenceAcrossOutages. A tenant's only message on its
// partition becomes suspect in an outage; between two outage windows a
// message of the tenant on another partition succeeds; the head then fails
// in the second window. That success was not simultaneous with the head's
// failures: nothing may be dead-lettered.
func TestPropertyLoneEvidenceAcrossOutages(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	var down atomic.Bool
	down.Store(true)
	suspect := make(chan struct{})
	var once sync.Once
	hd := newScripted(func(v string, call int) error {
		if down.Load() {
			if v == "head" && call == 4 {
				// 3 attempts, then the judge's own try: the head is now a
				// suspect waiting out its backoff.
				once.Do(func() { close(suspect) })
			}
			return errOutage
		}
		if v == "between" {
			down.Store(true) // the second window opens right after this success
		}
		return nil
	})
	p := consumertest.FastPolicy() // 3 attempts
	p.Breaker.ConsecutiveFailures = 10
	p.Retry.Backoff.Base = 250 * time.Millisecond // room for "between" to run first
	e := startScripted(t, h, p, consumer.Config{}, hd)
	produceValues(h, "A", 0, "head")
	select {
	case <-suspect:
	case <-time.After(5 * time.Second):
		t.Fatal("the head did not become suspect")
	}
	// Its fourth failure is recorded before the tenant's next success.
	if !within(5*time.Second, func() bool { return e.c.Stats().Failed >= 4 }) {
		t.Fatal("the head's fourth failure was not recorded")
	}
	down.Store(false)
	produceValues(h, "A", 1, "between")
	if !within(5*time.Second, func() bool { return h.S.Total() > 0 || hd.callsOf("head") >= 6 }) {
		t.Fatal("head not retried in the second window")
	}
	if got := dlqValues(h, "A"); len(got) != 0 {
		r := h.S.Records("A", false)[0]
		t.Fatalf("%v dead-lettered as %q after %d calls, all of them in outage windows", got, r.Reason, r.Attempts)
	}
	down.Store(false)
	if !within(5*time.Second, func() bool { return hd.handledAll("head", "between") }) {
		t.Fatal("head not handled after the outage")
	}
}
