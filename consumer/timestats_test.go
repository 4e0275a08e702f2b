package consumer_test

// Time per tenant in Stats: TimeLag, OldestParked, SpillBacklogAge,
// OpenSince and the dwell histograms, read against a clock that moves
// only when the test moves it (the engine's and the guards').

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// pushSource delivers what the test pushes, on one partition.
type pushSource struct {
	ch   chan []*consumer.Message
	next atomic.Int64
}

var pushPart = consumer.Partition{Topic: "push", ID: 0}

func newPushSource() *pushSource { return &pushSource{ch: make(chan []*consumer.Message, 16)} }

// push delivers msgs of tenant (its key) produced at at.
func (s *pushSource) push(tenant string, n int, at time.Time) {
	var ms []*consumer.Message
	for range n {
		ms = append(ms, &consumer.Message{Key: []byte(tenant), Value: []byte(tenant), Time: at})
	}
	s.ch <- ms
}

func (s *pushSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	d.Assigned(pushPart)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ms := <-s.ch:
			for _, m := range ms {
				m.Partition, m.Topic, m.Offset = pushPart, pushPart.Topic, s.next.Add(1)-1
			}
			d.DeliverBatch(ms)
		}
	}
}

func (s *pushSource) Settle(context.Context, *consumer.Message) error         { return nil }
func (s *pushSource) Commit(context.Context, consumer.Partition, int64) error { return nil }
func (s *pushSource) Pause(consumer.Partition)                                {}
func (s *pushSource) Resume(consumer.Partition)                               {}

// timeEngine runs cfg over a pushSource with clk as the engine's wall
// clock and its tenants' guards' clock. Tenants in down fail.
type timeEngine struct {
	c    *consumer.Consumer
	src  *pushSource
	clk  *stepClock
	t0   time.Time
	mu   sync.Mutex
	down map[string]bool
}

func startTimeEngine(t *testing.T, cfg consumer.Config) *timeEngine {
	t.Helper()
	e := &timeEngine{src: newPushSource(), clk: &stepClock{}, down: map[string]bool{}}
	e.t0 = e.clk.Now()
	p := policy.Policy{
		Clock: e.clk,
		// Opens at the first failure; a refused lane asks again every 20ms
		// of real time, and is admitted only once the test moves clk.
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenTimeout: 20 * time.Millisecond, MaxOpenTimeout: 20 * time.Millisecond},
		Retry:   policy.Retry{MaxAttempts: 1},
	}
	cfg.Scope = scope.New(p, scope.Options[string]{})
	cfg.Tenant = consumer.FromKey()
	cfg.DLQ = consumertest.NewSink()
	cfg.Handler = consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.down[string(m.Key)] {
			return errors.New("dependency down")
		}
		return nil
	})
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	consumer.UseWallClock(c, e.clk.Now)
	e.c = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, e.src) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return e
}

func (e *timeEngine) setDown(tenant string, down bool) {
	e.mu.Lock()
	e.down[tenant] = down
	e.mu.Unlock()
}

// tenant polls Stats until cond holds for tenant's snapshot, and returns it.
func (e *timeEngine) tenant(t *testing.T, tenant, what string, cond func(consumer.TenantStats) bool) consumer.TenantStats {
	t.Helper()
	var x consumer.TenantStats
	consumertest.Eventually(t, what, func() bool {
		for _, ts := range e.c.Stats().Tenants {
			if ts.Tenant == tenant {
				x = ts
				return cond(x)
			}
		}
		return false
	})
	return x
}

// bucketOf is the index of the first DwellBuckets bound at or above d.
func bucketOf(d time.Duration) int {
	for i, b := range consumer.DwellBuckets() {
		if d <= b {
			return i
		}
	}
	return len(consumer.DwellBuckets())
}

// A tenant in an outage: its TimeLag and OldestParked grow with the clock
// from its messages' produce time, OpenSince says when it parked, and all
// go back to zero once it recovered; its dwell histogram counts each settle
// in the bucket of its time since produce, and the engine's sums the
// tenants'.
func TestStatsTimeOfATenantInAnOutage(t *testing.T) {
	t.Parallel()
	e := startTimeEngine(t, consumer.Config{})
	e.setDown("down", true)
	e.src.push("up", 2, e.t0)
	e.src.push("down", 3, e.t0)

	x := e.tenant(t, "down", "down parks its 3 messages", func(x consumer.TenantStats) bool { return x.Parked == 3 })
	if x.TimeLag != 0 || x.OldestParked != 0 {
		t.Fatalf("before the clock moved: TimeLag %v, OldestParked %v; want 0", x.TimeLag, x.OldestParked)
	}
	if x.OpenSince.Before(e.t0) || x.OpenSince.After(e.t0.Add(time.Millisecond)) {
		t.Fatalf("OpenSince %v, want the park's time %v", x.OpenSince, e.t0)
	}
	for i, step := range []time.Duration{time.Minute, 2 * time.Minute} {
		e.clk.advance(step)
		want := e.clk.Now().Sub(e.t0)
		x = e.tenant(t, "down", "the engine clock moves", func(x consumer.TenantStats) bool { return x.TimeLag == want })
		if x.OldestParked != want || x.Parked != 3 {
			t.Fatalf("step %d: OldestParked %v (parked %d), want %v", i, x.OldestParked, x.Parked, want)
		}
		if x.State == policy.Closed || x.OpenSince.IsZero() {
			t.Fatalf("step %d: state %v, OpenSince %v; want not closed, set", i, x.State, x.OpenSince)
		}
		st := e.c.Stats()
		if p := st.Partitions[0]; p.TimeLag != want {
			t.Fatalf("step %d: partition TimeLag %v, want %v", i, p.TimeLag, want)
		}
	}

	e.setDown("down", false)
	// Past the open period: the next ask probes. The settles read the
	// engine clock, which housekeeping's next tick moves: before or after
	// this step.
	const last = 21 * time.Millisecond
	dwell := e.clk.Now().Sub(e.t0)
	e.clk.advance(last)
	x = e.tenant(t, "down", "down recovers", func(x consumer.TenantStats) bool { return x.Handled == 3 && x.Queued == 0 })
	if x.TimeLag != 0 || x.OldestParked != 0 || !x.OpenSince.IsZero() || x.State != policy.Closed {
		t.Fatalf("after recovery: TimeLag %v, OldestParked %v, OpenSince %v, state %v; want zeros, closed", x.TimeLag, x.OldestParked, x.OpenSince, x.State)
	}
	if x.Dwell.Count != 3 || x.Dwell.Sum < 3*dwell || x.Dwell.Sum > 3*(dwell+last) {
		t.Fatalf("down's dwell: count %d, sum %v; want 3, 3x %v (+%v)", x.Dwell.Count, x.Dwell.Sum, dwell, last)
	}
	b := bucketOf(dwell)
	for i, n := range x.Dwell.Counts {
		if want := map[bool]uint64{true: 3, false: 0}[i >= b]; n != want {
			t.Fatalf("down's bucket %d (le %v) counts %d, want %d (dwell %v)", i, consumer.DwellBuckets()[i], n, want, dwell)
		}
	}
	up := e.tenant(t, "up", "up handled", func(x consumer.TenantStats) bool { return x.Handled == 2 })
	if up.Dwell.Count != 2 || up.Dwell.Counts[0] != 2 || up.TimeLag != 0 || !up.OpenSince.IsZero() {
		t.Fatalf("up: dwell %+v, TimeLag %v, OpenSince %v; want 2 settles in the first bucket, no lag", up.Dwell, up.TimeLag, up.OpenSince)
	}
	st := e.c.Stats()
	if st.Dwell.Count != 5 || st.Dwell.Sum != x.Dwell.Sum+up.Dwell.Sum || st.Dwell.Counts[0] != 2 || st.Partitions[0].TimeLag != 0 {
		t.Fatalf("totals: dwell %+v, partition TimeLag %v; want 5 settles, the tenants' sum, 2 in the first bucket, no lag", st.Dwell, st.Partitions[0].TimeLag)
	}
}

// A message without a produce time counts from its receipt.
func TestStatsTimeLagOfAMessageWithoutTime(t *testing.T) {
	t.Parallel()
	e := startTimeEngine(t, consumer.Config{})
	e.setDown("down", true)
	e.src.push("down", 1, time.Time{})
	e.tenant(t, "down", "down parks", func(x consumer.TenantStats) bool { return x.Parked == 1 })
	e.clk.advance(time.Minute)
	x := e.tenant(t, "down", "the engine clock moves", func(x consumer.TenantStats) bool { return x.TimeLag > 0 })
	if x.TimeLag != time.Minute || x.OldestParked != time.Minute {
		t.Fatalf("TimeLag %v, OldestParked %v; want 1m from receipt", x.TimeLag, x.OldestParked)
	}
}

// A tenant that spills: SpillBacklogAge is the age of the oldest of its
// spilled messages not yet re-fed and settled, counted from their produce
// time (the spill log keeps it), and zero once all are settled.
func TestStatsSpillBacklogAge(t *testing.T) {
	t.Parallel()
	sp := consumertest.NewSpill()
	e := startTimeEngine(t, consumer.Config{Spill: sp, MaxParkedPerTenant: 2})
	e.setDown("down", true)
	e.src.push("down", 1, e.t0)
	e.tenant(t, "down", "down parks", func(x consumer.TenantStats) bool { return x.Parked == 1 })
	e.src.push("down", 6, e.t0.Add(time.Second))
	x := e.tenant(t, "down", "down spills", func(x consumer.TenantStats) bool { return x.Spilled > 0 && x.Spilling > 0 })
	if x.SpillBacklogAge != 0 {
		t.Fatalf("before the clock moved: SpillBacklogAge %v, want 0", x.SpillBacklogAge)
	}
	e.clk.advance(time.Minute)
	want := time.Minute - time.Second // the spilled ones were produced a second after t0
	x = e.tenant(t, "down", "the engine clock moves", func(x consumer.TenantStats) bool { return x.TimeLag == time.Minute })
	if x.SpillBacklogAge != want && x.SpillBacklogAge != time.Minute {
		// The re-fed head may be the first message (spilled once the lane
		// spilled, parked ones included) or a later one.
		t.Fatalf("SpillBacklogAge %v, want %v or 1m (SpillLag %d)", x.SpillBacklogAge, want, x.SpillLag)
	}
	if x.SpillLag == 0 {
		t.Fatal("SpillLag 0 while the backlog has an age")
	}
	e.setDown("down", false)
	e.clk.advance(time.Minute)
	x = e.tenant(t, "down", "down recovers", func(x consumer.TenantStats) bool { return x.Handled == 7 && x.Queued == 0 && x.SpillLag == 0 })
	if x.SpillBacklogAge != 0 || x.TimeLag != 0 {
		t.Fatalf("after recovery: SpillBacklogAge %v, TimeLag %v; want 0", x.SpillBacklogAge, x.TimeLag)
	}
	if x.Dwell.Count != 7 {
		t.Fatalf("dwell count %d, want 7 (each spilled message once)", x.Dwell.Count)
	}
}
