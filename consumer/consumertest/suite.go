package consumertest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Rebalancer is implemented by harness sources that can simulate a
// rebalance that revokes every partition and assigns them back.
type Rebalancer interface {
	Rebalance()
}

// WaitTimeout bounds every wait of the suite. Brokers in CI can be slow, so
// it is generous; a correct adapter finishes each case in well under a
// second per thousand messages.
var WaitTimeout = 60 * time.Second

// Run runs the conformance suite against the adapter behind newHarness.
// Each case calls newHarness once and must get isolated names.
//
// The cases: per-tenant order across partitions; parking isolation (a
// failing tenant parks while the others finish, then everything of it is
// handled in order with nothing dead-lettered); DLQ routing (permanent
// errors, missing and hostile tenant keys each land in the right DLQ only);
// at-least-once across a restart (a second source on the same group
// handles everything the first did not settle); backpressure (a parked
// tenant over its bound pauses its partition and nothing is lost); when
// the source implements Rebalancer, revocation; and, when the harness
// implements Killer, a dead source (the engine's Run ends with the
// source's error instead of waiting for ever); and, when it implements
// Spiller, spilling: a tenant down past its parked bound spills without
// pausing its partition and is re-fed in order after recovery, across a
// restart too, and a lone stuck message stops holding its partition's
// commit after StuckAfter.
func Run(t *testing.T, newHarness func(t testing.TB) Harness) {
	t.Run("Order", func(t *testing.T) { testOrder(t, newHarness(t)) })
	t.Run("ParkingIsolation", func(t *testing.T) { testParking(t, newHarness(t)) })
	t.Run("DLQRouting", func(t *testing.T) { testRouting(t, newHarness(t)) })
	t.Run("AtLeastOnceAcrossRestart", func(t *testing.T) { testRestart(t, newHarness(t)) })
	t.Run("Backpressure", func(t *testing.T) { testBackpressure(t, newHarness(t)) })
	t.Run("Revocation", func(t *testing.T) { testRevocation(t, newHarness(t)) })
	t.Run("DeadSource", func(t *testing.T) { testDeadSource(t, newHarness(t)) })
	t.Run("Spill", func(t *testing.T) { testSpill(t, newHarness(t)) })
	t.Run("SpillRestart", func(t *testing.T) { testSpillRestart(t, newHarness(t)) })
	t.Run("SpilledVerdictAcrossRestart", func(t *testing.T) { testSpilledVerdict(t, newHarness(t)) })
	t.Run("StuckHead", func(t *testing.T) { testStuckHead(t, newHarness(t)) })
}

// FastPolicy trips after 3 consecutive failures and probes after 20ms, so
// the suite runs quickly on real brokers.
func FastPolicy() policy.Policy {
	return policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: 20 * time.Millisecond, MaxOpenTimeout: 200 * time.Millisecond},
		Retry:   policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
	}
}

// Recorder is an idempotent record of handled messages, by tenant.
type Recorder struct {
	mu    sync.Mutex
	order map[string][]string // tenant -> values in handling order
	seen  map[string]int      // value -> times handled
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{order: make(map[string][]string), seen: make(map[string]int)}
}

// Add records that value was handled for tenant.
func (r *Recorder) Add(tenant, value string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.order[tenant] = append(r.order[tenant], value)
	r.seen[value]++
}

// Distinct counts distinct values handled.
func (r *Recorder) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Count counts handlings of tenant's messages, duplicates included.
func (r *Recorder) Count(tenant string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order[tenant])
}

// Order returns tenant's values in handling order.
func (r *Recorder) Order(tenant string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order[tenant]...)
}

// Has reports whether value was handled.
func (r *Recorder) Has(value string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[value] > 0
}

// Eventually polls cond until it holds or WaitTimeout passes.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", WaitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// EndCounter tells a benchmark when the last message of each of a
// source's partitions was handled, so that it reads the end of a run
// neither with a write per message that workers on both cores would share
// (a count in the handler) nor with a poll of the engine's count that is up
// to its period late (a millisecond on a run of tens of milliseconds). The
// handler calls Saw for each message; WaitEnd then reads the engine's own
// count only for the calls still running.
type EndCounter struct {
	ids   []int32 // partition IDs
	last  []int64 // their last offsets
	left  atomic.Int64
	ended chan struct{}
}

// NewEndCounter makes an EndCounter for partitions whose last offsets are
// last (by partition ID).
func NewEndCounter(last map[int32]int64) *EndCounter {
	e := &EndCounter{ended: make(chan struct{})}
	for id, off := range last {
		e.ids, e.last = append(e.ids, id), append(e.last, off)
	}
	e.left.Store(int64(len(last)))
	return e
}

// Saw is called by the handler for each message it handled: a read of its
// partition's last offset, and a count only for that last message.
func (e *EndCounter) Saw(m *consumer.Message) {
	for i, id := range e.ids {
		if id == m.Partition.ID {
			if m.Offset == e.last[i] && e.left.Add(-1) == 0 {
				close(e.ended)
			}
			return
		}
	}
}

// WaitEnd returns once c has handled at least want messages: it waits until
// the handler saw every partition's last message (e), then reads c's count,
// yielding between reads, until the other workers' calls of that moment
// are counted too. It fails t after five minutes.
func WaitEnd(t testing.TB, c *consumer.Consumer, e *EndCounter, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	select {
	case <-e.ended:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the last message of every partition not handled in 5 minutes (%d of %d handled)", c.Totals().Handled, want)
	}
	for c.Totals().Handled < want {
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d messages in 5 minutes", c.Totals().Handled, want)
		}
		runtime.Gosched()
	}
}

// running is one engine run in the background.
type running struct {
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, h Harness, src consumer.Source, cfg consumer.Config) *running {
	t.Helper()
	if cfg.Tenant == nil {
		cfg.Tenant = h.Tenant()
	}
	if cfg.DLQ == nil {
		cfg.DLQ = h.Sink(t)
	}
	if cfg.Scope == nil {
		cfg.Scope = scope.New(FastPolicy(), scope.Options[string]{})
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.DLQRetry == 0 {
		cfg.DLQRetry = 5 * time.Millisecond
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, src) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(WaitTimeout):
		t.Errorf("Run did not return within %v of cancel", WaitTimeout)
	}
}

// ended waits for the engine's Run to return by itself (it was not
// cancelled) and returns its error; it fails the test after WaitTimeout.
func (r *running) ended(t testing.TB) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.cancel()
		r.cancel = nil
		return err
	case <-time.After(WaitTimeout):
		t.Fatalf("the engine's Run still running %v after its source died", WaitTimeout)
		return nil
	}
}

// id renders a unique message value: tenant/partition/seq.
func id(tenant string, p, seq int) string { return fmt.Sprintf("%s/%d/%06d", tenant, p, seq) }

// parseSeq returns the partition and sequence of an id.
func parseSeq(v string) (int, int) {
	parts := strings.Split(v, "/")
	p, _ := strconv.Atoi(parts[len(parts)-2])
	s, _ := strconv.Atoi(parts[len(parts)-1])
	return p, s
}

// checkOrder fails unless each partition's values of tenant appear in
// increasing sequence (duplicates from redelivery may repeat a prefix).
func checkOrder(t testing.TB, tenant string, values []string) {
	t.Helper()
	last := map[int]int{}
	for _, v := range values {
		p, s := parseSeq(v)
		if prev, ok := last[p]; ok && s < prev {
			t.Fatalf("tenant %q partition %d: %s handled after sequence %d", tenant, p, v, prev)
		}
		last[p] = s
	}
}

func produceTenants(t testing.TB, h Harness, tenants []string, perTenant int) (total int) {
	var msgs []Msg
	for i := range perTenant {
		for ti, tn := range tenants {
			p := (ti + i) % h.Partitions()
			msgs = append(msgs, Msg{Tenant: tn, Partition: p, Value: []byte(id(tn, p, i))})
		}
	}
	h.Produce(t, msgs...)
	return len(msgs)
}

func recordHandler(rec *Recorder, tenant consumer.TenantFunc, fail func(tenant, value string) error) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		tn, _ := tenant(m)
		if fail != nil {
			if err := fail(tn, string(m.Value)); err != nil {
				return err
			}
		}
		rec.Add(tn, string(m.Value))
		return nil
	})
}

func testOrder(t *testing.T, h Harness) {
	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli"}
	total := produceTenants(t, h, tenants, 40)
	rec := NewRecorder()
	r := start(t, h, h.NewSource(t), consumer.Config{Handler: recordHandler(rec, h.Tenant(), nil), Concurrency: 8})
	Eventually(t, "every message handled", func() bool { return rec.Distinct() == total })
	for _, tn := range tenants {
		checkOrder(t, tn, rec.Order(tn))
	}
	r.stop(t)
	if s := r.c.Stats(); s.DeadLettered != 0 {
		t.Fatalf("dead-lettered %d in a clean run", s.DeadLettered)
	}
}

var errDown = errors.New("consumertest: dependency down")

func testParking(t *testing.T, h Harness) {
	tenants := []string{"noisy", "calm-1", "calm-2", "calm-3"}
	const per = 30
	total := produceTenants(t, h, tenants, per)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	var parked atomic.Int64
	r := start(t, h, h.NewSource(t), consumer.Config{
		Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
			if tn == "noisy" && down.Load() {
				return errDown
			}
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventParked && e.Tenant == "noisy" {
				parked.Add(1)
			}
		},
	})
	Eventually(t, "calm tenants handled while noisy is down", func() bool {
		return rec.Count("calm-1")+rec.Count("calm-2")+rec.Count("calm-3") >= 3*per
	})
	if n := rec.Count("noisy"); n != 0 {
		t.Fatalf("noisy handled %d while its dependency was down", n)
	}
	Eventually(t, "noisy parked", func() bool { return parked.Load() > 0 })
	down.Store(false)
	Eventually(t, "noisy handled after recovery", func() bool { return rec.Distinct() == total })
	checkOrder(t, "noisy", rec.Order("noisy"))
	if dl := h.DeadLetters(t, "noisy"); len(dl) != 0 {
		t.Fatalf("a transient outage dead-lettered %d messages", len(dl))
	}
	r.stop(t)
}

func testRouting(t *testing.T, h Harness) {
	hostile := "evil.*>/ ..\xff"
	h.Produce(t,
		Msg{Tenant: "acme", Value: []byte(id("acme", 0, 0))},
		Msg{Tenant: "acme", Value: []byte("poison")},
		Msg{Tenant: "acme", Value: []byte(id("acme", 0, 2))},
		Msg{Tenant: "", Value: []byte("orphan")},
		Msg{Tenant: hostile, Value: []byte("hostile-poison")},
		Msg{Tenant: "acme.*", Value: []byte(id("acme.*", 0, 1))},
	)
	rec := NewRecorder()
	r := start(t, h, h.NewSource(t), consumer.Config{Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
		if strings.HasSuffix(v, "poison") {
			return policy.Permanent(errors.New("unparseable order"))
		}
		return nil
	})})
	Eventually(t, "handled messages", func() bool { return rec.Distinct() == 3 })
	Eventually(t, "acme's poison in acme's DLQ", func() bool { return len(h.DeadLetters(t, "acme")) == 1 })
	Eventually(t, "hostile tenant's poison in its own DLQ", func() bool { return len(h.DeadLetters(t, hostile)) == 1 })
	got := h.DeadLetters(t, "acme")[0]
	if string(got.Value) != "poison" || got.Reason != dlq.ReasonPermanent || got.Attempts != 1 || got.Tenant != "acme" {
		t.Fatalf("acme's dead letter = value %q reason %q attempts %d tenant %q", got.Value, got.Reason, got.Attempts, got.Tenant)
	}
	if !strings.Contains(got.Error, "unparseable order") {
		t.Fatalf("dead letter error %q lacks the cause", got.Error)
	}
	hd := h.DeadLetters(t, hostile)[0]
	if string(hd.Value) != "hostile-poison" || hd.Tenant != hostile {
		t.Fatalf("hostile dead letter = %q tenant %q", hd.Value, hd.Tenant)
	}
	for _, other := range []string{"acme.*", "evil", "acme_2e_2a", "*", ">"} {
		if dl := h.DeadLetters(t, other); len(dl) != 0 {
			t.Fatalf("tenant %q got %d dead letters that are not its own", other, len(dl))
		}
	}
	if ns, ok := h.(interface {
		NoTenantLetters(t testing.TB) []dlq.Record
	}); ok {
		Eventually(t, "orphan in the no-tenant bucket", func() bool { return len(ns.NoTenantLetters(t)) == 1 })
		if r := ns.NoTenantLetters(t)[0]; r.Reason != dlq.ReasonNoTenant || string(r.Value) != "orphan" {
			t.Fatalf("no-tenant record = %q reason %q", r.Value, r.Reason)
		}
	} else {
		Eventually(t, "orphan dead-lettered", func() bool { return r.c.Stats().DeadLettered == 3 })
	}
	r.stop(t)
}

func testRestart(t *testing.T, h Harness) {
	tenants := []string{"a", "b", "c"}
	total := produceTenants(t, h, tenants, 60)
	rec := NewRecorder()
	var handled atomic.Int64
	tenantOf := h.Tenant()
	// A third is handled; the rest block until the drain gives up on them,
	// so they are unsettled when the first run stops.
	stalling := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if handled.Add(1) > int64(total/3) {
			<-ctx.Done()
			return ctx.Err()
		}
		tn, _ := tenantOf(m)
		rec.Add(tn, string(m.Value))
		return nil
	})
	r1 := start(t, h, h.NewSource(t), consumer.Config{Handler: stalling, DrainTimeout: 50 * time.Millisecond})
	Eventually(t, "a third handled", func() bool { return rec.Distinct() >= total/3 })
	r1.stop(t)
	first := rec.Distinct()
	r2 := start(t, h, h.NewSource(t), consumer.Config{Handler: recordHandler(rec, h.Tenant(), nil)})
	Eventually(t, "everything handled after restart", func() bool { return rec.Distinct() == total })
	r2.stop(t)
	if first >= total {
		t.Fatalf("first run handled everything (%d); the restart proved nothing", first)
	}
	for _, tn := range tenants {
		if dl := h.DeadLetters(t, tn); len(dl) != 0 {
			t.Fatalf("tenant %s dead-lettered %d across a restart", tn, len(dl))
		}
	}
}

func testBackpressure(t *testing.T, h Harness) {
	const per, bound = 400, 10
	var msgs []Msg
	for i := range 5 {
		msgs = append(msgs, Msg{Tenant: "stuck", Partition: 0, Value: []byte(id("stuck", 0, i))})
	}
	h.Produce(t, msgs...)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	var paused atomic.Int64
	r := start(t, h, h.NewSource(t), consumer.Config{
		Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
			if tn == "stuck" && down.Load() {
				return errDown
			}
			return nil
		}),
		MaxParkedPerTenant: bound,
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventPaused {
				paused.Add(1)
			}
		},
	})
	Eventually(t, "the stuck tenant parked", func() bool { ts, _ := r.c.Tenant("stuck"); return ts.Parked > 0 })
	msgs = msgs[:0]
	for i := 5; i < per; i++ {
		msgs = append(msgs, Msg{Tenant: "stuck", Partition: 0, Value: []byte(id("stuck", 0, i))})
	}
	h.Produce(t, msgs...)
	Eventually(t, "the stuck tenant's partition paused", func() bool { return paused.Load() > 0 })
	// A fetch already under way may still land, but the engine must not
	// keep taking the whole backlog.
	if s := r.c.Stats(); s.Parked >= per/2 {
		t.Fatalf("parked %d of %d messages despite a bound of %d", s.Parked, per, bound)
	}
	msgs = msgs[:0]
	p := 1 % h.Partitions()
	for i := range 20 {
		msgs = append(msgs, Msg{Tenant: "free", Partition: p, Value: []byte(id("free", p, i))})
	}
	h.Produce(t, msgs...)
	if h.Partitions() > 1 {
		Eventually(t, "the free tenant on another partition handled", func() bool { return rec.Count("free") == 20 })
	}
	down.Store(false)
	Eventually(t, "everything handled", func() bool { return rec.Distinct() == per+20 })
	checkOrder(t, "stuck", rec.Order("stuck"))
	r.stop(t)
}

func testRevocation(t *testing.T, h Harness) {
	src := h.NewSource(t)
	rb, ok := src.(Rebalancer)
	if !ok {
		t.Skip("source does not implement Rebalancer; adapters test rebalances with two real group members")
	}
	total := produceTenants(t, h, []string{"x", "y"}, 50)
	var down atomic.Bool
	down.Store(true)
	rec := NewRecorder()
	r := start(t, h, src, consumer.Config{Handler: recordHandler(rec, h.Tenant(), func(tn, v string) error {
		if tn == "x" && down.Load() {
			return errDown
		}
		return nil
	})})
	Eventually(t, "y handled", func() bool { return rec.Count("y") == 50 })
	Eventually(t, "x parked before the rebalance", func() bool { return r.c.Stats().Parked > 0 })
	rb.Rebalance()
	down.Store(false)
	Eventually(t, "x handled after the rebalance", func() bool { return rec.Distinct() == total })
	checkOrder(t, "x", rec.Order("x"))
	r.stop(t)
}

// testDeadSource kills the broker side of a running source: the engine's
// Run must end with the source's error, not block for ever (a consumer that
// silently consumes nothing) nor return nil (a clean stop).
func testDeadSource(t *testing.T, h Harness) {
	k, ok := h.(Killer)
	if !ok {
		t.Skip("harness does not implement Killer")
	}
	total := produceTenants(t, h, []string{"a", "b"}, 10)
	rec := NewRecorder()
	r := start(t, h, h.NewSource(t), consumer.Config{Handler: recordHandler(rec, h.Tenant(), nil)})
	Eventually(t, "every message handled", func() bool { return rec.Distinct() == total })
	want := k.KillSource(t)
	err := r.ended(t)
	switch {
	case err == nil:
		t.Fatal("the engine's Run returned nil after its source died; want the source's error")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("the engine's Run returned %v after its source died; want the source's error", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("the engine's Run returned %v; want an error matching %v", err, want)
	}
}
