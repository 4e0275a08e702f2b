package consumer_test

// Regression tests for the engine defects of issue 14, each seen failing on
// the engine before the rewrite (see the closing note). One list of
// reproductions, one concern, hence the file's length.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// genSource delivers n generated messages on one partition, honouring
// Pause, keeping none of them: what the engine holds is all that is held.
type genSource struct {
	n      int
	gen    func(i int) *consumer.Message
	settle func(m *consumer.Message) error

	mu      sync.Mutex
	cond    *sync.Cond
	paused  bool
	commits atomic.Int64
}

func newGenSource(n int, gen func(i int) *consumer.Message) *genSource {
	s := &genSource{n: n, gen: gen}
	s.cond = sync.NewCond(&s.mu)
	s.commits.Store(-1)
	return s
}

var genPart = consumer.Partition{Topic: "gen", ID: 0}

func (s *genSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	d.Assigned(genPart)
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	batch := make([]*consumer.Message, 0, 64)
	for i := 0; i < s.n && ctx.Err() == nil; {
		s.mu.Lock()
		for s.paused && ctx.Err() == nil {
			s.cond.Wait()
		}
		s.mu.Unlock()
		batch = batch[:0]
		for ; i < s.n && len(batch) < cap(batch); i++ {
			m := s.gen(i)
			m.Partition, m.Offset, m.Topic = genPart, int64(i), genPart.Topic
			batch = append(batch, m)
		}
		d.DeliverBatch(batch)
	}
	<-ctx.Done()
	return nil
}

func (s *genSource) Settle(ctx context.Context, m *consumer.Message) error {
	if s.settle != nil {
		return s.settle(m)
	}
	return nil
}

func (s *genSource) Commit(ctx context.Context, p consumer.Partition, next int64) error {
	s.commits.Store(next)
	return nil
}

func (s *genSource) Pause(consumer.Partition) { s.mu.Lock(); s.paused = true; s.mu.Unlock() }
func (s *genSource) Resume(consumer.Partition) {
	s.mu.Lock()
	s.paused = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

func tenantMsg(tenant string, value string) *consumer.Message {
	return &consumer.Message{Key: []byte(tenant), Value: []byte(value)}
}

// startWith runs an engine over src and stops it at the end of the test.
func startWith(t *testing.T, cfg consumer.Config, src consumer.Source) *consumer.Consumer {
	t.Helper()
	if cfg.Tenant == nil {
		cfg.Tenant = consumer.FromKey()
	}
	if cfg.DLQ == nil {
		cfg.DLQ = consumertest.NewSink()
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return within 20s of cancel")
		}
	})
	return c
}

// Defect 1: a handler whose error wraps policy.ErrOpen (it called a
// downstream through a guard of its own) was taken for the tenant's own
// breaker refusing: its attempts reset and its lane parked, and with no
// breaker it was retried for ever. The handler's errors are the handler's:
// the message uses its attempts and is dead-lettered on evidence.
func TestHandlerErrorWrappingErrOpenIsTheHandlers(t *testing.T) {
	for _, withBreaker := range []bool{false, true} {
		t.Run(fmt.Sprintf("breaker=%v", withBreaker), func(t *testing.T) {
			p := policy.Policy{Retry: policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}}}
			if withBreaker {
				p.Breaker = &policy.Breaker{ConsecutiveFailures: 50, OpenTimeout: 20 * time.Millisecond}
			}
			sink := consumertest.NewSink()
			var calls atomic.Int64
			src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("acme", []string{"inventory", "next"}[i]) })
			c := startWith(t, consumer.Config{
				Scope: scope.New(p, scope.Options[string]{}),
				DLQ:   sink,
				Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
					if string(m.Value) == "inventory" {
						calls.Add(1)
						return fmt.Errorf("inventory service: %w", policy.ErrOpen)
					}
					return nil
				}),
			}, src)
			consumertest.Eventually(t, "the inventory message dead-lettered", func() bool { return len(sink.Records("acme", false)) == 1 })
			rec := sink.Records("acme", false)[0]
			if rec.Reason != dlq.ReasonExhausted || string(rec.Value) != "inventory" {
				t.Fatalf("dead letter %q reason %q, want the inventory message, exhausted", rec.Value, rec.Reason)
			}
			if n := calls.Load(); n > 10 {
				t.Fatalf("the handler was called %d times for one message with 3 attempts", n)
			}
			if s := c.Stats(); s.Handled != 1 {
				t.Fatalf("handled %d, want the message behind it", s.Handled)
			}
		})
	}
}

// Defect 2: one lone failing message held a watermark entry for every
// message delivered after it (a million successes of another tenant cost
// 16 MiB and zero commits). Memory must follow what is unsettled, and the
// commit lag the stuck tenant causes must show in Stats.
func TestLoneStuckMessageHoldsOnlyItself(t *testing.T) {
	n := 400_000
	if testing.Short() {
		n = 100_000
	}
	var handled atomic.Int64
	src := newGenSource(n+1, func(i int) *consumer.Message {
		if i == 0 {
			return tenantMsg("stuck", "lone")
		}
		return tenantMsg("busy", "ok")
	})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := startWith(t, consumer.Config{
		Scope:       scope.New(policy.Policy{Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 10 * time.Millisecond}}}, scope.Options[string]{}),
		Concurrency: 4,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "lone" {
				return errors.New("waits for evidence")
			}
			handled.Add(1)
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "the busy tenant's messages handled", func() bool { return handled.Load() == int64(n) })
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap growth with %d messages settled behind one stuck message: %d KiB", n, growth/1024)
	if growth > 2<<20 {
		t.Fatalf("heap grew by %d KiB for %d settled messages behind one unsettled one", growth/1024, n)
	}
	s := c.Stats()
	if len(s.Partitions) != 1 {
		t.Fatalf("partitions %+v", s.Partitions)
	}
	ps := s.Partitions[0]
	if ps.Unsettled != 1 || ps.CommitLag != int64(n+1) || ps.OldestTenant != "stuck" {
		t.Fatalf("partition stats %+v, want 1 unsettled, commit lag %d, held by stuck", ps, n+1)
	}
	for _, ts := range s.Tenants {
		if ts.Tenant == "stuck" && ts.CommitLag != int64(n+1) {
			t.Fatalf("the stuck tenant's commit lag is %d, want %d", ts.CommitLag, n+1)
		}
	}
}

// Defect 3: an OnEvent hook that calls Stats (the obvious metrics hook)
// deadlocked when an event was emitted under the engine lock.
func TestOnEventMayCallTheConsumer(t *testing.T) {
	const n = 3000
	var c *consumer.Consumer
	var events, resumed atomic.Int64
	var ready atomic.Bool
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%d", i%7), "v") })
	release := make(chan struct{})
	var handled atomic.Int64
	c = startWith(t, consumer.Config{
		Concurrency:           2,
		MaxQueuedPerPartition: 20, // pauses and resumes the partition over and over
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			<-release
			handled.Add(1)
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if !ready.Load() {
				return
			}
			_ = c.Stats()
			_, _ = c.Tenant(e.Tenant)
			events.Add(1)
			if e.Kind == consumer.EventResumedPartition {
				resumed.Add(1)
			}
		},
	}, src)
	ready.Store(true)
	close(release)
	if !within(20*time.Second, func() bool { return handled.Load() == n }) {
		t.Fatalf("not every message handled with a hook calling Stats: %d of %d; stats %+v; lanes %v", handled.Load(), n, c.Stats().Partitions, consumer.DumpLanes(c))
	}
	if resumed.Load() == 0 {
		t.Fatalf("the partition was never resumed (%d events): the test exercised nothing", events.Load())
	}
}

// Defect 4: Settle and Commit ran under the partition's lock, which
// delivery waited for while holding the global lock: settles were fully
// serial and Stats stalled behind a slow Settle. Settles of one partition
// must overlap, and Stats must answer while a Settle is blocked.
func TestSettleIsNotUnderALock(t *testing.T) {
	const tenants = 16
	var inSettle, most atomic.Int64
	block := make(chan struct{})
	src := newGenSource(tenants*4, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%02d", i%tenants), "v") })
	var settled atomic.Int64
	src.settle = func(m *consumer.Message) error {
		n := inSettle.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-block
		inSettle.Add(-1)
		settled.Add(1)
		return nil
	}
	c := startWith(t, consumer.Config{
		Concurrency: 8,
		Handler:     consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error { return nil }),
	}, src)
	consumertest.Eventually(t, "settles of one partition overlapping", func() bool { return most.Load() >= 4 })
	stats := make(chan consumer.Stats, 1)
	go func() { stats <- c.Stats() }()
	select {
	case s := <-stats:
		if s.Handled == 0 {
			t.Fatalf("stats %+v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stats did not return while Settle calls were blocked")
	}
	close(block)
	consumertest.Eventually(t, "every message settled", func() bool { return settled.Load() == tenants*4 })
}

// Defect 6: a tenant key equal to the engine's old reserved bucket name
// was dead-lettered as invalid-tenant and never handled. The no-tenant
// bucket is kept apart by type: every key is a tenant.
func TestNoKeyIsReserved(t *testing.T) {
	h := consumertest.NewMemHarness(1)
	for _, key := range []string{"\x00ringfence:no-tenant", "\x00", "no-tenant"} {
		h.Produce(t, consumertest.Msg{Tenant: key, Value: []byte(key)})
	}
	h.Produce(t, consumertest.Msg{Value: []byte("orphan")})
	rec := consumertest.NewRecorder()
	c := startWith(t, consumer.Config{
		Tenant: h.Tenant(),
		DLQ:    h.S,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			rec.Add("", string(m.Value))
			return nil
		}),
	}, h.NewSource(t))
	consumertest.Eventually(t, "three tenants handled, the orphan dead-lettered", func() bool {
		return rec.Distinct() == 3 && len(h.S.Records("", true)) == 1
	})
	if n := h.S.Total(); n != 1 {
		t.Fatalf("%d dead letters, want only the orphan", n)
	}
	var none, named int
	for _, ts := range c.Stats().Tenants {
		if ts.NoTenant {
			none++
		} else {
			named++
		}
	}
	if none != 1 || named != 3 {
		t.Fatalf("stats list %d no-tenant buckets and %d tenants, want 1 and 3", none, named)
	}
}

// Defect 8: a typed nil DLQ (or handler, or spill log) passed New and
// panicked a worker at the first dead letter.
func TestNewRefusesTypedNils(t *testing.T) {
	var sink *consumertest.Sink
	var spill *consumertest.Spill
	var hf consumer.HandlerFunc
	ok := consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil })
	for _, tc := range []struct {
		name string
		cfg  consumer.Config
	}{
		{"nil *Sink as DLQ", consumer.Config{Handler: ok, Tenant: consumer.FromKey(), DLQ: sink}},
		{"nil HandlerFunc", consumer.Config{Handler: hf, Tenant: consumer.FromKey(), DLQ: consumertest.NewSink()}},
		{"nil *Spill as Spill", consumer.Config{Handler: ok, Tenant: consumer.FromKey(), DLQ: consumertest.NewSink(), Spill: spill}},
	} {
		if _, err := consumer.New(tc.cfg); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", tc.name, err)
		}
	}
}

// Defect 8: with more active tenants than the scope keeps, a failing
// tenant's guard was evicted between its failures and never tripped. The
// engine pins the guards of the tenants it tracks.
func TestFailingTenantTripsAmongManyTenants(t *testing.T) {
	const n = 4000 // every fourth message is t00's; the others each a new tenant
	src := newGenSource(n, func(i int) *consumer.Message {
		if i%4 == 0 {
			return tenantMsg("t00", "v")
		}
		return tenantMsg(fmt.Sprintf("u%05d", i), "v")
	})
	var parked atomic.Bool
	p := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 8, OpenTimeout: time.Hour},
		Retry:   policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}},
	}
	var good atomic.Int64
	startWith(t, consumer.Config{
		Scope:       scope.New(p, scope.Options[string]{MaxKeys: 2}),
		Concurrency: 8,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "t00" {
				return errors.New("t00's dependency is down")
			}
			good.Add(1)
			return nil
		}),
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventParked && e.Tenant == "t00" {
				parked.Store(true)
			}
		},
	}, src)
	consumertest.Eventually(t, "the others handled", func() bool { return good.Load() == n*3/4 })
	consumertest.Eventually(t, "t00's breaker tripped and parked it", parked.Load)
}

// Defect 8: Deadline meant "across all attempts" in Guard.Run and "per
// attempt" in the engine. Now both read it as the time budget of a round of
// attempts, and AttemptTimeout bounds each attempt.
func TestAttemptTimeoutAndDeadline(t *testing.T) {
	t.Run("AttemptTimeout ends a hanging call", func(t *testing.T) {
		var calls atomic.Int64
		src := newGenSource(1, func(int) *consumer.Message { return tenantMsg("a", "hang") })
		p := policy.Policy{AttemptTimeout: 30 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}}}
		var errs sync.Map
		startWith(t, consumer.Config{
			Scope: scope.New(p, scope.Options[string]{}),
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if calls.Add(1) <= 2 {
					<-ctx.Done()
					errs.Store(calls.Load(), ctx.Err())
					return ctx.Err()
				}
				return nil
			}),
		}, src)
		consumertest.Eventually(t, "a third call after two timed out", func() bool { return calls.Load() >= 3 })
		if err, _ := errs.Load(int64(1)); !errors.Is(err.(error), context.DeadlineExceeded) {
			t.Fatalf("the hanging call ended with %v, want DeadlineExceeded", err)
		}
	})
	// Only running out AttemptTimeout is a hang (weighed as
	// Breaker.TimeoutFailures, by default tripping the breaker at once);
	// running out what is left of the Deadline is an ordinary failure. Found
	// by examples/shaping: its standard tenant's 100ms deadline tripped the
	// breaker on the first report and parked the tenant for the open timeout.
	t.Run("running out the Deadline is not a hang", func(t *testing.T) {
		sink := consumertest.NewSink()
		src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("a", []string{"slow", "ok"}[i]) })
		p := policy.Policy{
			Deadline: 20 * time.Millisecond,
			Breaker:  &policy.Breaker{ConsecutiveFailures: 5, OpenTimeout: time.Hour},
			Retry:    policy.Retry{MaxAttempts: 1},
		}
		sc := scope.New(p, scope.Options[string]{})
		startWith(t, consumer.Config{
			Scope: sc,
			DLQ:   sink,
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if string(m.Value) == "slow" {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}),
		}, src)
		// With the deadline taken for a hang the breaker opens for an hour
		// and neither message settles.
		consumertest.Eventually(t, "slow dead-lettered", func() bool { return len(sink.Records("a", false)) == 1 })
		if st := sc.For("a").State(); st != policy.Closed {
			t.Fatalf("breaker %v after one deadline expiry, want closed", st)
		}
	})
	t.Run("Deadline is the round's budget", func(t *testing.T) {
		sink := consumertest.NewSink()
		var calls atomic.Int64
		src := newGenSource(2, func(i int) *consumer.Message { return tenantMsg("a", []string{"bad", "good"}[i]) })
		// 100 attempts allowed, 40ms apart, but only 100ms for the round: it
		// ends (and is judged) after about three.
		p := policy.Policy{Deadline: 100 * time.Millisecond, Retry: policy.Retry{MaxAttempts: 100, Backoff: policy.Backoff{Kind: policy.Constant, Base: 40 * time.Millisecond}}}
		startWith(t, consumer.Config{
			Scope: scope.New(p, scope.Options[string]{}),
			DLQ:   sink,
			Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
				if string(m.Value) == "bad" {
					calls.Add(1)
					return errors.New("bad")
				}
				return nil
			}),
		}, src)
		consumertest.Eventually(t, "bad dead-lettered", func() bool { return len(sink.Records("a", false)) == 1 })
		if n := calls.Load(); n > 6 {
			t.Fatalf("%d attempts within a 100ms deadline at 40ms apart", n)
		}
	})
}

// A spill log that is down when a partition is assigned holds the source's
// Assigned callback: the engine retries Pending there, before any message
// of the partition is delivered, so that each spilled tenant's order holds.
// Cancelling Run must still end it: the drain ends what waits on the
// engine's context, and the source's Run returns. Found by the property
// test (seeds 9014, 11031 and others: "Run did not return within 10s of
// cancel").
func TestRunEndsWhileSpillLogIsDownAtAssign(t *testing.T) {
	h := consumertest.NewMemHarness(2)
	h.Sp.SetDown(true)
	c, err := consumer.New(consumer.Config{
		Handler:      consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
		Tenant:       h.Tenant(),
		DLQ:          h.S,
		Spill:        h.Sp,
		DrainTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h.NewSource(t)) }()
	consumertest.Eventually(t, "Pending refused and retried", func() bool { return h.Sp.Failures() >= 2 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel while the spill log was down at assignment")
	}
}

// noopSettleSource is a genSource whose Settle it says does nothing.
type noopSettleSource struct{ *genSource }

func (noopSettleSource) SettleIsNoop() bool { return true }

// A source that says its Settle does nothing (consumer.SettleNooper, as
// Kafka's) gets no Settle call, handled or dead-lettered, and its commit
// still reaches the end.
func TestSettleNooperGetsNoSettle(t *testing.T) {
	const n = 300
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%d", i%3), strconv.Itoa(i)) })
	var settles atomic.Int64
	src.settle = func(*consumer.Message) error { settles.Add(1); return nil }
	sink := consumertest.NewSink()
	startWith(t, consumer.Config{
		DLQ: sink,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if i, _ := strconv.Atoi(string(m.Value)); i%50 == 7 {
				return policy.Permanent(errors.New("bad message"))
			}
			return nil
		}),
	}, noopSettleSource{src})
	consumertest.Eventually(t, "everything committed", func() bool { return src.commits.Load() == n })
	if got := settles.Load(); got != 0 {
		t.Fatalf("Settle called %d times on a SettleNooper", got)
	}
	if got := sink.Total(); got != 6 {
		t.Fatalf("%d dead letters, want 6 (the test must cover the dead-letter path)", got)
	}
}

// A worker runs several messages of a lane between two visits to the
// shard's lock (a run). A failure inside a run ends it there: the failed
// message is retried before anything behind it runs, so the lane's order
// holds, and a dead-lettered message inside a run is settled in its place.
func TestRunOfALaneStopsAtAFailure(t *testing.T) {
	const n = 40
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg("solo", strconv.Itoa(i)) })
	var mu sync.Mutex
	var calls []int
	failed := map[int]bool{}
	sink := consumertest.NewSink()
	startWith(t, consumer.Config{
		Concurrency: 1,
		DLQ:         sink,
		Scope: scope.New(policy.Policy{Retry: policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Constant, Base: time.Millisecond}}},
			scope.Options[string]{}),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			i, _ := strconv.Atoi(string(m.Value))
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, i)
			switch {
			case i%10 == 3 && !failed[i]:
				failed[i] = true
				return errors.New("transient")
			case i%10 == 6:
				return policy.Permanent(errors.New("bad message"))
			}
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "everything committed", func() bool { return src.commits.Load() == n })
	mu.Lock()
	defer mu.Unlock()
	var want []int
	for i := range n {
		want = append(want, i)
		if i%10 == 3 {
			want = append(want, i) // its retry, before anything behind it
		}
	}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("handler calls\n got %v\nwant %v", calls, want)
	}
	if got := sink.Total(); got != n/10 {
		t.Fatalf("%d dead letters, want %d", got, n/10)
	}
}

// Workers on a partition's quick lanes wake no other once there are as
// many as cores (see runQuick), and a worker that finds enough of them on
// a partition waits instead of taking its lanes. If the calls of those
// workers all hang (a quick tenant's dependency stops answering), the
// partition's other tenants must still flow: housekeeping sees the
// partition take no lane for a tick and wakes a worker that takes them.
// More tenants hang here than that count allows; every other tenant's
// messages are handled while they still hang.
func TestQuickTenantsThatHangHoldNoOneElse(t *testing.T) {
	hangers := runtime.GOMAXPROCS(0) + 1
	const others, warm, after = 8, 3000, 2000
	release := make(chan struct{})
	var releaseOnce sync.Once
	tenants := others + hangers
	n := warm + hangers + after
	src := newGenSource(n, func(i int) *consumer.Message {
		switch {
		case i < warm: // every tenant, quick calls: their estimates become quick
			return tenantMsg(fmt.Sprintf("t%d", i%tenants), "ok")
		case i < warm+hangers: // then each hanger's next call hangs
			return tenantMsg(fmt.Sprintf("t%d", others+i-warm), "hang")
		default: // and the others go on
			return tenantMsg(fmt.Sprintf("t%d", (i-warm-hangers)%others), "ok")
		}
	})
	var handled, hanging atomic.Int64
	c := startWith(t, consumer.Config{
		Concurrency:       4 * hangers,
		TenantConcurrency: 1,
		Scope:             scope.New(policy.Policy{}, scope.Options[string]{}),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "hang" {
				hanging.Add(1)
				<-release // ignores ctx: a call that really hangs
				return nil
			}
			handled.Add(1)
			return nil
		}),
	}, src)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before startWith's: Run's drain waits for the calls
	consumertest.Eventually(t, "every hanger's call to hang", func() bool { return hanging.Load() == int64(hangers) })
	consumertest.Eventually(t, "the other tenants' messages handled while the hangers hang", func() bool {
		return handled.Load() == int64(warm+after)
	})
	if got := hanging.Load(); got != int64(hangers) {
		t.Fatalf("%d calls hanging, want %d", got, hangers)
	}
	// Without the rescue this test stalls (checked by disabling it): the
	// partition had to be rescued, and Stats says so.
	if ps := c.Stats().Partitions; len(ps) != 1 || ps[0].Rescues == 0 {
		t.Fatalf("partition stats %+v: want one partition, rescued at least once", ps)
	}
	releaseOnce.Do(func() { close(release) })
	consumertest.Eventually(t, "everything committed", func() bool { return src.commits.Load() == int64(n) })
}

// Defect: a worker kept pointers to the messages of its last job (the
// run's settled list, never cleared, and the run itself) after it went
// idle: 188-341 of 3,936 handled messages stayed reachable, with 64
// workers, after everything was committed, and up to ~129 a worker in
// all, outside every bound the engine counts (MaxQueuedPerPartition,
// ReadAhead), each pinning its value. A message settled (handled or
// dead-lettered) must be the collector's once the engine is done with it.
func TestSettledMessagesAreNotKept(t *testing.T) {
	const n = 4000
	var mu sync.Mutex
	var kept []weak.Pointer[consumer.Message]
	src := newGenSource(n, func(i int) *consumer.Message {
		m := tenantMsg(fmt.Sprintf("t%d", i%10), strconv.Itoa(i))
		if i < n-64 { // the source's own batch keeps the last 64 until it returns
			mu.Lock()
			kept = append(kept, weak.Make(m))
			mu.Unlock()
		}
		return m
	})
	sink := consumertest.NewSink()
	startWith(t, consumer.Config{
		Concurrency: 64,
		DLQ:         sink,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if i, _ := strconv.Atoi(string(m.Value)); i%100 == 3 {
				return policy.Permanent(errors.New("bad message"))
			}
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "everything committed", func() bool { return src.commits.Load() == n })
	if got := sink.Total(); got != n/100 {
		t.Fatalf("%d dead letters, want %d (the test must cover the dead-letter path)", got, n/100)
	}
	alive := func() (k int) {
		runtime.GC()
		mu.Lock()
		defer mu.Unlock()
		for _, p := range kept {
			if p.Value() != nil {
				k++
			}
		}
		return k
	}
	consumertest.Eventually(t, "no settled message reachable", func() bool { return alive() == 0 })
}
