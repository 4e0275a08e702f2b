package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// scriptedSource is a one-partition Source that announces its partition
// and delivers a fixed list of messages in the order given, as a NATS
// JetStream consumer does after a crash: a message the dead process held
// unacknowledged comes back only after AckWait, behind newer ones.
type scriptedSource struct {
	p    consumer.Partition
	msgs []*consumer.Message

	mu      sync.Mutex
	settled []int64 // offsets settled (acked), protected by mu
}

func (s *scriptedSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	d.Assigned(s.p)
	for _, m := range s.msgs {
		d.Deliver(m)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *scriptedSource) Settle(_ context.Context, m *consumer.Message) error {
	s.mu.Lock()
	s.settled = append(s.settled, m.Offset)
	s.mu.Unlock()
	return nil
}

func (s *scriptedSource) Commit(context.Context, consumer.Partition, int64) error { return nil }
func (s *scriptedSource) Pause(consumer.Partition)                                {}
func (s *scriptedSource) Resume(consumer.Partition)                               {}

// TestSpillRefeedKeepsLateRedelivery is the spill-kill scenario's loss on
// NATS in miniature, with no broker: a process spilled offsets 1-3 of a
// tenant and died holding offset 5 unacknowledged (it had not appended it
// yet). The next process finds the tenant's spill log pending, so the
// tenant's live messages follow into the log; its source delivers offset 10
// (new) and then offset 5 (redelivered after AckWait). Both are appended,
// 10 before 5, and their originals settled; on re-feed offset 5 must be
// handled (at least once, even if after 10), not dropped as a copy of a
// message re-fed already.
func TestSpillRefeedKeepsLateRedelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := consumer.Partition{Topic: "ORDERS/ringfence-it", ID: 0}
	mk := func(off int64) *consumer.Message {
		return &consumer.Message{Key: []byte("noisy"), Value: payload(fmt.Sprint(off), false), Topic: "orders.noisy",
			Partition: p, Offset: off, Stream: "ORDERS", Time: time.Now()}
	}
	spill := consumertest.NewSpill()
	lane := consumer.SpillLane{Tenant: "noisy", Partition: p}
	if err := spill.Append(ctx, lane, []*consumer.Message{mk(1), mk(2), mk(3)}); err != nil {
		t.Fatal(err)
	}
	src := &scriptedSource{p: p, msgs: []*consumer.Message{mk(10), mk(5)}}

	var mu sync.Mutex
	var handled []int64
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			handled = append(handled, m.Offset)
			mu.Unlock()
			return nil
		}),
		Tenant: consumer.FromKey(),
		DLQ:    consumertest.NewSink(),
		Spill:  spill,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, src) }()
	defer func() {
		stop()
		<-done
	}()

	// Everything delivered is settled at the source and the spill log is
	// read back to its end.
	err = brokertest.PollUntil(ctx, 20*time.Second, 10*time.Millisecond, func(context.Context) error {
		src.mu.Lock()
		settled := len(src.settled)
		src.mu.Unlock()
		st := c.Stats()
		if settled < 2 || st.SpillingTenants > 0 || st.Queued > 0 || st.InFlight > 0 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for the spill log to drain: %v", err)
	}
	mu.Lock()
	got := slices.Clone(handled)
	mu.Unlock()
	src.mu.Lock()
	settled := slices.Clone(src.settled)
	src.mu.Unlock()
	t.Logf("handled offsets %v; settled at the source %v; engine duplicates %d", got, settled, c.Stats().Duplicates)
	for _, off := range []int64{1, 2, 3, 5, 10} {
		if !slices.Contains(got, off) {
			t.Errorf("offset %d never handled (settled at the source: %v): lost", off, slices.Contains(settled, off))
		}
	}
}
