package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/scope"
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
	var ms []*consumer.Message
	for i, k := range []string{"down", "down", "down", "up"} {
		ms = append(ms, &consumer.Message{Key: []byte(k), Value: []byte(k), Topic: "orders", Partition: p, Offset: int64(i), Time: old})
	}
	src := &oneShotSource{ms: ms}
	spill := consumertest.NewSpill()
	startWith(t, consumer.Config{
		Scope:      scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
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
		return spill.Appended() > 0 && src.next() == int64(len(ms))
	})
}

// A healthy tenant's head is old in a backlog, not stuck: its produce time
// long past StuckAfter does not make its lane spill while its handler runs.
func TestOldHealthyHeadDoesNotSpill(t *testing.T) {
	t.Parallel()
	p := consumer.Partition{Topic: "orders", ID: 0}
	src := &oneShotSource{ms: []*consumer.Message{
		{Key: []byte("busy"), Value: []byte("b0"), Topic: "orders", Partition: p, Offset: 0, Time: time.Now().Add(-2 * time.Hour)},
	}}
	release := make(chan struct{})
	c := startWith(t, consumer.Config{
		Spill:      consumertest.NewSpill(),
		StuckAfter: time.Hour,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}),
	}, src)
	defer close(release)
	// Oldest is on the engine clock, which housekeeping advances; it looks
	// for stuck heads every 100ms, so by 400ms it has looked at this one.
	consumertest.Eventually(t, "the head in the engine for 400ms", func() bool {
		st := c.Stats()
		return len(st.Partitions) == 1 && st.Partitions[0].Oldest > 400*time.Millisecond
	})
	for _, l := range consumer.DumpLanes(c) {
		if strings.Contains(l, "want=true") || strings.Contains(l, "on=true") {
			t.Fatalf("a healthy head in progress was sent to spill: %s", l)
		}
	}
}
