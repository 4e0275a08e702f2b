package consumer_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// pauseLog records the engine's pause events of one partition, in order.
type pauseLog struct {
	mu     sync.Mutex
	events []string // a PauseReason's String, or "resumed"
}

func (p *pauseLog) on(e consumer.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch e.Kind {
	case consumer.EventPaused:
		p.events = append(p.events, e.Pause.String())
	case consumer.EventResumedPartition:
		p.events = append(p.events, "resumed")
	}
}

func (p *pauseLog) get() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.events...)
}

func (p *pauseLog) has(ev string) bool {
	for _, e := range p.get() {
		if e == ev {
			return true
		}
	}
	return false
}

// startQuickBlocked runs an engine over src whose tenants are quick by the
// guards' clock (every call takes no time on it) and whose calls wait for
// release, counted in handled once released; log records its pauses.
func startQuickBlocked(t *testing.T, src consumer.Source, concurrency, readAhead, maxQueued int, log *pauseLog, release <-chan struct{}, handled *atomic.Int64) *consumer.Consumer {
	t.Helper()
	p := policy.Default()
	p.Clock = &stepClock{}
	return startWith(t, consumer.Config{
		Scope:                 scope.New(p, scope.Options[string]{}),
		Concurrency:           concurrency,
		ReadAhead:             readAhead,
		MaxQueuedPerPartition: maxQueued,
		MaxQueuedPerTenant:    maxQueued,
		OnEvent:               log.on,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			<-release
			handled.Add(1)
			return nil
		}),
	}, src)
}

// The partition of quick tenants holds ReadAhead of their messages, not
// MaxQueuedPerPartition: the engine pauses it there (PauseReadAhead). Its
// tenants' calls then hang: the count cannot fall, so housekeeping lifts
// the pause after a while and the partition reads on to its own bound
// (PauseQueueFull). Once the calls return, every message is handled.
func TestReadAheadBoundsQuickTenants(t *testing.T) {
	const n, readAhead, maxQueued = 3000, 100, 1000
	release := make(chan struct{})
	var handled atomic.Int64
	var log pauseLog
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%d", i%4), strconv.Itoa(i)) })
	c := startQuickBlocked(t, src, 4, readAhead, maxQueued, &log, release, &handled)
	consumertest.Eventually(t, "a read-ahead pause", func() bool { return log.has("read-ahead") })
	if st := c.Stats().Partitions[0]; st.Queued >= maxQueued {
		t.Fatalf("paused for read-ahead with %d queued: want fewer than MaxQueuedPerPartition %d", st.Queued, maxQueued)
	}
	consumertest.Eventually(t, "the stalled read-ahead pause lifted, then the partition's own bound", func() bool { return log.has("queue-full") })
	st := c.Stats().Partitions[0]
	if st.Queued < maxQueued || st.QuickQueued != st.Queued {
		t.Fatalf("at the queue-full pause: queued %d, counted against read-ahead %d; want %d of quick tenants", st.Queued, st.QuickQueued, maxQueued)
	}
	got := log.get()
	if got[0] != "read-ahead" || got[1] != "resumed" {
		t.Fatalf("pause events %v; want read-ahead, resumed (lifted), then queue-full", got)
	}
	close(release)
	consumertest.Eventually(t, "every message handled", func() bool { return handled.Load() == n })
	consumertest.Eventually(t, "nothing left queued", func() bool { return c.Stats().Queued == 0 })
}

// Messages of a tenant whose calls are not quick do not count against
// ReadAhead: a slow tenant's backlog is bounded by MaxQueuedPerTenant and
// MaxQueuedPerPartition, and a read-ahead pause on its account would stop
// its partition-mates in the broker. Its first call tells: until then its
// messages count, as a new tenant's do.
func TestReadAheadIgnoresSlowTenants(t *testing.T) {
	const backlog, readAhead = 600, 100
	clk := &stepClock{}
	p := policy.Default()
	p.Clock = clk
	release := make(chan struct{})
	var handled atomic.Int64
	var log pauseLog
	var engine engineRef
	src := newGenSource(backlog, func(i int) *consumer.Message {
		if i == 64 {
			// genSource's second batch comes once the first is handled,
			// which told the tenant is slow; the first batch's 64
			// messages counted until then, below ReadAhead.
			engine.waitIdle(func() bool { return handled.Load() == 64 })
		}
		return tenantMsg("slow", strconv.Itoa(i))
	})
	c := startWith(t, consumer.Config{
		Scope:                 scope.New(p, scope.Options[string]{}),
		ReadAhead:             readAhead,
		MaxQueuedPerPartition: 2 * backlog,
		MaxQueuedPerTenant:    2 * backlog,
		OnEvent:               log.on,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if m.Offset >= 64 {
				<-release
			}
			clk.advance(time.Millisecond) // slow by the guard's clock
			handled.Add(1)
			return nil
		}),
	}, src)
	engine.Store(c)
	consumertest.Eventually(t, "the backlog in the engine", func() bool { return c.Stats().Queued == backlog-64 })
	st := c.Stats().Partitions[0]
	if st.QuickQueued != 0 || st.Paused {
		t.Fatalf("a slow tenant's backlog of %d: %d counted against ReadAhead %d, paused %v (%v); want none counted, not paused", backlog-64, st.QuickQueued, readAhead, st.Paused, st.PauseReason)
	}
	if log.has("read-ahead") {
		t.Fatalf("pause events %v: a read-ahead pause on a slow tenant's account", log.get())
	}
	close(release)
	consumertest.Eventually(t, "every message handled", func() bool { return handled.Load() == backlog })
}

// The read-ahead is shared by a partition's quick lanes: with many of them
// each may still hold a few messages (8), so that a lane's turn serves more
// than one. With 100 quick tenants, each arriving two messages at a time,
// and ReadAhead 40, the partition is paused at 800 messages, not 40.
func TestReadAheadGrowsWithLanes(t *testing.T) {
	const tenants, readAhead, maxQueued = 100, 40, 5000
	release := make(chan struct{})
	var log pauseLog
	var handled atomic.Int64
	src := newGenSource(4000, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%03d", i/2%tenants), strconv.Itoa(i)) })
	c := startQuickBlocked(t, src, 1, readAhead, maxQueued, &log, release, &handled)
	defer close(release)
	consumertest.Eventually(t, "a read-ahead pause", func() bool { return log.has("read-ahead") })
	st := c.Stats().Partitions[0]
	if st.QuickQueued < 8*tenants || st.QuickQueued >= maxQueued {
		t.Fatalf("paused for read-ahead holding %d messages of %d quick tenants; want 8 a lane (%d) or a delivery more, below %d", st.QuickQueued, tenants, 8*tenants, maxQueued)
	}
}

// Lanes holding one message each do not grow the read-ahead: a stream of
// keys each seen once (every message a new tenant) is paused at ReadAhead,
// not at MaxQueuedPerPartition, so that the engine does not keep a tenant
// and a lane live for every message it could hold.
func TestReadAheadKeysSeenOnce(t *testing.T) {
	const readAhead, maxQueued = 100, 5000
	release := make(chan struct{})
	var log pauseLog
	var handled atomic.Int64
	src := newGenSource(4000, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%05d", i), strconv.Itoa(i)) })
	c := startQuickBlocked(t, src, 1, readAhead, maxQueued, &log, release, &handled)
	defer close(release)
	consumertest.Eventually(t, "a read-ahead pause", func() bool { return log.has("read-ahead") })
	st := c.Stats().Partitions[0]
	if st.QuickQueued < readAhead || st.QuickQueued >= 4*readAhead {
		t.Fatalf("paused for read-ahead holding %d messages of as many tenants; want ReadAhead (%d) or a delivery more", st.QuickQueued, readAhead)
	}
}
