package consumer_test

// Rebalances: a revoked partition's buffered and parked messages are
// dropped (the broker redelivers them), nothing of it is settled after
// Revoked returns, and a reassigned partition flows again.

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// A partition paused by a bound when a rebalance revokes and reassigns it
// must flow again once the pressure is gone.
func TestPausedPartitionFlowsAfterARebalance(t *testing.T) {
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
	if !within(consumertest.WaitTimeout, func() bool { return e.c.Stats().PausedPartitions == 1 }) {
		t.Fatal("partition 0 never paused at MaxQueuedPerPartition 8")
	}
	// The outage lasts until the partition was revoked, so the engine
	// cannot resume it before.
	e.src.Rebalance()
	if !within(consumertest.WaitTimeout, func() bool { return revoked.Load() == 1 }) {
		t.Fatal("the rebalance did not revoke partition 0")
	}
	down.Store(false)
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll(values...) }) {
		s := e.c.Stats()
		t.Fatalf("after a rebalance of the paused partition: committed %d of 40, queued %d, paused partitions %d; the source's partition stays paused",
			h.B.Committed(h.Group, 0), s.Queued, s.PausedPartitions)
	}
}

// Rebalances while parked lanes resume. Under -race it catches a worker
// that reads its lane's parked flag without the engine's lock while
// Revoked clears it. Whatever the interleaving, nothing may be lost.
func TestRevokeWhileParkedLanesResumeLosesNothing(t *testing.T) {
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
	if !within(consumertest.WaitTimeout, func() bool { return hd.handledAll(values...) }) {
		t.Fatalf("not every message handled after the rebalances: %d distinct of %d", len(slices.Compact(slices.Sorted(slices.Values(hd.handledList())))), len(values))
	}
}

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

func (s *revokeSource) Pause(consumer.Partition) {}

func (s *revokeSource) Resume(consumer.Partition) {}

// Revoked waits for the Settle calls of its partition in progress and
// stops later ones, also those of a quick tenant's run, which settles its
// handled messages together when the run ends (see Consumer.handled).
func TestNoSettleAfterRevoked(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("a revocation can race a batch being handled only with two Ps or more")
	}
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
