package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// oneShotSource delivers its messages once, on partition 0, and then
// waits; it records the commits it is given.
type oneShotSource struct {
	ms []*consumer.Message

	mu        sync.Mutex
	committed int64
}

func (s *oneShotSource) Run(ctx context.Context, d consumer.Dispatcher) error {
	d.Assigned(s.ms[0].Partition)
	d.DeliverBatch(s.ms)
	<-ctx.Done()
	return nil
}

func (s *oneShotSource) Settle(context.Context, *consumer.Message) error { return nil }
func (s *oneShotSource) Pause(consumer.Partition)                        {}
func (s *oneShotSource) Resume(consumer.Partition)                       {}

func (s *oneShotSource) Commit(_ context.Context, _ consumer.Partition, next int64) error {
	s.mu.Lock()
	s.committed = next
	s.mu.Unlock()
	return nil
}

func (s *oneShotSource) next() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// A stuck head's StuckAfter counts from its first delivery to the group,
// its produce time, not from its receipt by this process: a message
// produced long before (delivered again after a restart or a rebalance)
// whose tenant parks spills at once, and its partition's commit moves on,
// although this process received it a moment ago and StuckAfter is an hour.
func TestStuckAgeCountsFromProduceTime(t *testing.T) {
	t.Parallel()
	p := consumer.Partition{Topic: "orders", ID: 0}
	old := time.Now().Add(-2 * time.Hour)
	src := &oneShotSource{ms: []*consumer.Message{
		{Key: []byte("down"), Value: []byte("d0"), Topic: "orders", Partition: p, Offset: 0, Time: old},
		{Key: []byte("up"), Value: []byte("u0"), Topic: "orders", Partition: p, Offset: 1, Time: old},
	}}
	spill := consumertest.NewSpill()
	startWith(t, consumer.Config{
		Spill:      spill,
		StuckAfter: time.Hour,
		Handler: consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
			if string(m.Key) == "down" {
				return errors.New("dependency down")
			}
			return nil
		}),
	}, src)
	consumertest.Eventually(t, "the stuck head spilled and the commit past it", func() bool {
		return spill.Appended() > 0 && src.next() == 2
	})
}
