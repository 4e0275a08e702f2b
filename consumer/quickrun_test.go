package consumer_test

import (
	"context"
	"fmt"
	"runtime"
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

// revokeSource assigns its one partition, delivers a batch and revokes the
// partition as soon as the first of its messages is settled, round after
// round, while the workers are in the middle of the batch. Each message
// carries its round in Handle; a Settle of a round whose Revoked has
// returned (begun before or after it) breaks the Source contract: no
// Settle for a partition after Revoked returns.
type revokeSource struct {
	rounds, batch int
	revoked       atomic.Int64   // the last round whose Revoked returned; -1 none
	settled       []atomic.Int64 // settles per round
	late          atomic.Int64   // settles of a revoked round
	lateRound     atomic.Int64
	done          chan struct{}
}

func (s *revokeSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	p := consumer.Partition{Topic: "rv", ID: 0}
	ms := make([]*consumer.Message, s.batch)
	for r := range s.rounds {
		d.Assigned(p)
		for i := range ms {
			ms[i] = &consumer.Message{Key: []byte(fmt.Sprintf("t%d", i%2)), Topic: p.Topic, Partition: p, Offset: int64(i), Handle: r}
		}
		d.DeliverBatch(ms)
		for deadline := time.Now().Add(time.Second); s.settled[r].Load() == 0 && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		d.Revoked(p)
		s.revoked.Store(int64(r))
	}
	close(s.done)
	<-ctx.Done()
	return nil
}

func (s *revokeSource) Settle(_ context.Context, m *consumer.Message) error {
	r := int64(m.Handle.(int))
	s.settled[r].Add(1)
	if r <= s.revoked.Load() {
		s.late.Add(1)
		s.lateRound.Store(r)
	}
	return nil
}

func (s *revokeSource) Commit(context.Context, consumer.Partition, int64) error { return nil }
func (s *revokeSource) Pause(consumer.Partition)                                {}
func (s *revokeSource) Resume(consumer.Partition)                               {}

// Revoked waits for the Settle calls of its partition in progress and
// stops later ones, also those of a quick tenant's run, which settles its
// handled messages together when the run ends (see Consumer.handled).
func TestNoSettleAfterRevoked(t *testing.T) {
	// Each of the two tenants gets two runs' worth of messages a round, so
	// that the revocation after the first settle finds runs still going.
	src := &revokeSource{rounds: 400, batch: 4 * consumer.RunMax, settled: make([]atomic.Int64, 400), done: make(chan struct{})}
	src.revoked.Store(-1)
	p := policy.Default()
	p.Clock = &stepClock{} // every call takes no time by the guards' clock: quick, whatever the load
	c := startWith(t, consumer.Config{
		Scope:             scope.New(p, scope.Options[string]{}),
		Concurrency:       2,
		TenantConcurrency: 2,
		Handler:           consumer.HandlerFunc(func(context.Context, *consumer.Message) error { return nil }),
	}, src)
	select {
	case <-src.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the rounds did not end")
	}
	if n := src.late.Load(); n > 0 {
		t.Fatalf("%d Settle calls for a partition after its Revoked returned (round %d)", n, src.lateRound.Load())
	}
	// The revocations cut into the batches: some rounds had messages
	// settled and others not.
	cut := 0
	for r := range src.settled {
		if n := src.settled[r].Load(); n > 0 && n < int64(src.batch) {
			cut++
		}
	}
	if cut == 0 {
		t.Fatal("no revocation came while a batch was being handled: the test raced nothing")
	}
	requireQuick(t, c)
}

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
