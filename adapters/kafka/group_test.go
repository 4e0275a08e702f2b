package kafka

import (
	"errors"

	kafkago "github.com/segmentio/kafka-go"
	"testing"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
)

// groupHarness is the conformance harness over GroupSource.
type groupHarness struct{ *harness }

func (h groupHarness) NewSource(t testing.TB) consumer.Source {
	t.Helper()
	return &rebalancingGroupSource{GroupSource: h.source(t), h: h, t: t}
}

func (h groupHarness) source(t testing.TB) *GroupSource {
	t.Helper()
	s, err := NewGroupSource(h.c.Addrs(), h.topic, h.group, groupOpts(WithUnknownTopicTimeout(time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// groupOpts are GroupSource options for tests (fastOpts without the join
// backoff, which a GroupSource ignores).
func groupOpts(extra ...SourceOption) []SourceOption {
	return fastOpts(extra...)
}

// rebalancingGroupSource lets the suite's Revocation case trigger a real
// rebalance: a second member joins, takes its share and leaves.
type rebalancingGroupSource struct {
	*GroupSource
	h groupHarness
	t testing.TB
}

func (r *rebalancingGroupSource) Rebalance() {
	other := r.h.source(r.t)
	col := newCollector(false)
	stop := consumertest.StartSource(r.t, other, col)
	col.waitFor(r.t, testCtx(r.t, 30*time.Second), "the second member's assignment", func() bool { return len(col.assigned) > 0 })
	stop()
}

func TestGroupConformance(t *testing.T) {
	c := startStrictCluster(t)
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return groupHarness{newHarness(t, c)} })
}

func TestNewGroupSourceValidates(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	tests := []struct {
		name    string
		brokers []string
		topic   string
		group   string
		opts    []SourceOption
	}{
		{"no brokers", nil, "t", "g", nil},
		{"empty topic", ok, "", "g", nil},
		{"bad topic char", ok, "a/b", "g", nil},
		{"empty group", ok, "t", "", nil},
		{"nil option", ok, "t", "g", []SourceOption{nil}},
		{"kafka-go dialer", ok, "t", "g", []SourceOption{WithDialer(kafkago.DefaultDialer)}},
		{"nil kgo option", ok, "t", "g", []SourceOption{WithClientOptions(nil)}},
		{"zero commit interval", ok, "t", "g", []SourceOption{WithCommitInterval(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGroupSource(tt.brokers, tt.topic, tt.group, tt.opts...)
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
	if _, err := NewGroupSource(ok, "orders.v1", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSource(ok, "orders.v1", "g", WithClientOptions()); err != nil {
		t.Fatal(err) // no kgo option given
	}
}
