package consumer_test

// Settles and commits: what a settled message still costs, and which
// Settle calls a source gets.

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
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// One lone failing message holds back its partition's commit, but holds
// no memory for the messages settled after it (a watermark entry each
// would grow with every success of another tenant): memory follows what is
// unsettled, and the commit lag the stuck tenant causes shows in Stats.
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

// A worker keeps no pointer to the messages of its last job (its run's
// settled list, the run itself) once it goes idle: such messages would be
// outside every bound the engine counts (MaxQueuedPerPartition,
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
