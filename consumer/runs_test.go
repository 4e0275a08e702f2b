package consumer_test

// Runs: the messages of a lane a worker steps between two visits to its
// partition's lock.

import (
	"context"
	"errors"
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

// requireQuick fails t unless some tenant of c is quick by its estimate
// (under half of the engine's 10µs quick turn), so that a test of quick
// runs did run them.
func requireQuick(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	for _, ts := range c.Stats().Tenants {
		if ts.Latency > 0 && ts.Latency < 5*time.Microsecond {
			return
		}
	}
	t.Fatal("no tenant's estimate is quick (under 5µs): the run path was not exercised")
}

// A quick tenant's run keeps one call of the worker's context open from
// message to message (see call). Each call must still get a context that
// is not cancelled when it starts, with a deadline ahead of it; a context
// a handler observed (Done) is cancelled once that call returns and is
// never handed to a later call; and once the runs end no worker counts as
// in a call.
func TestQuickRunContexts(t *testing.T) {
	const n = 4000
	var (
		calls, stale, noDeadline, reused atomic.Int64
		observed                         = make(chan context.Context, n)
		seen                             sync.Map // contexts observed, by identity
	)
	src := newGenSource(n, func(i int) *consumer.Message { return tenantMsg(fmt.Sprintf("t%d", i%2), strconv.Itoa(i)) })
	p := policy.Default()
	p.AttemptTimeout = time.Minute
	p.Clock = &stepClock{} // every call takes no time by the guards' clock: quick, whatever the load
	c := startWith(t, consumer.Config{
		Scope:             scope.New(p, scope.Options[string]{}),
		Concurrency:       2,
		TenantConcurrency: 2,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			i := calls.Add(1)
			if ctx.Err() != nil {
				stale.Add(1)
			}
			if d, ok := ctx.Deadline(); !ok || !d.After(time.Now()) {
				noDeadline.Add(1)
			}
			if _, ok := seen.Load(ctx); ok {
				reused.Add(1)
			}
			if i%7 == 0 { // observe it: Done must close once this call returns
				_ = ctx.Done()
				seen.Store(ctx, true)
				observed <- ctx
			}
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "every message handled", func() bool { return c.Totals().Handled == n })
	if stale.Load() != 0 || noDeadline.Load() != 0 || reused.Load() != 0 {
		t.Fatalf("of %d calls: %d began cancelled, %d had no deadline ahead, %d got a context an earlier call observed", calls.Load(), stale.Load(), noDeadline.Load(), reused.Load())
	}
	close(observed)
	for ctx := range observed {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a context the handler observed was not cancelled after its call returned")
		}
	}
	requireQuick(t, c)
	consumertest.Eventually(t, "no worker in a call once the runs ended", func() bool { return c.Stats().InFlight == 0 })
}

// A worker runs several messages of a lane between two visits to the
// shard's lock (a run). A failure inside a run ends it there: the failed
// message is retried before anything behind it runs, so the lane's order
// holds, and a dead-lettered message inside a run is settled in its place.
func TestFailureEndsALanesRun(t *testing.T) {
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
