package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/scope"
)

const tenantHeader = "tenant"

// harness runs the conformance suite over a kfake cluster through the real
// Kafka protocol.
type harness struct {
	c     *kafkatest.Cluster
	topic string
	group string
	parts int
	dlq   *DLQ
}

func newHarness(t testing.TB, c *kafkatest.Cluster) *harness {
	t.Helper()
	h := &harness{c: c, topic: uniq("conf"), group: uniq("g"), parts: 3}
	cl := &kafkago.Client{Addr: kafkago.TCP(c.Addrs()...)}
	if err := createTopic(testCtx(t, 10*time.Second), cl, h.topic, h.parts, -1); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.dlq, err = NewDLQ(c.Addrs(), h.topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.dlq.Close() })
	return h
}

func (h *harness) Partitions() int             { return h.parts }
func (h *harness) Tenant() consumer.TenantFunc { return consumer.FromHeader(tenantHeader) }
func (h *harness) Sink(testing.TB) dlq.Sink    { return h.dlq }

func (h *harness) Produce(t testing.TB, msgs ...consumertest.Msg) {
	t.Helper()
	out := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafkago.Message{Partition: m.Partition, Value: m.Value}
		if m.Tenant != "" {
			out[i].Headers = []kafkago.Header{{Key: tenantHeader, Value: []byte(m.Tenant)}}
		}
	}
	produce(t, h.c.Addrs(), h.topic, out...)
}

func (h *harness) NewSource(t testing.TB) consumer.Source {
	t.Helper()
	return &rebalancingSource{Source: h.source(t), h: h, t: t}
}

func (h *harness) source(t testing.TB) *Source {
	t.Helper()
	s, err := NewSource(h.c.Addrs(), h.topic, h.group, fastOpts(WithUnknownTopicTimeout(time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// SpillLog returns a spill log of the harness's topic and group; every
// call a new instance over the same topics and cursors, as a restarted
// process would open.
func (h *harness) SpillLog(t testing.TB) consumer.SpillLog {
	t.Helper()
	l, err := NewSpillLog(h.c.Addrs(), h.topic, h.group)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

var _ consumertest.Spiller = (*harness)(nil)

// rebalancingSource lets the suite's Revocation case trigger a real
// rebalance.
type rebalancingSource struct {
	*Source
	h *harness
	t testing.TB
}

// Rebalance has a second member join the group, take its share of the
// partitions (handling and committing nothing) and leave again. Each join
// and leave ends the generation, so every partition of the first member is
// revoked and later assigned back.
func (r *rebalancingSource) Rebalance() {
	other := r.h.source(r.t)
	col := newCollector(false)
	stop := consumertest.StartSource(r.t, other, col)
	col.waitFor(r.t, testCtx(r.t, 30*time.Second), "the second member's assignment", func() bool { return len(col.assigned) > 0 })
	stop()
}

func (h *harness) DeadLetters(t testing.TB, tenant string) []dlq.Record {
	t.Helper()
	recs, err := h.dlq.Peek(testCtx(t, 10*time.Second), tenant, 0)
	if err != nil {
		t.Fatalf("peek %q: %v", tenant, err)
	}
	return recs
}

func (h *harness) NoTenantLetters(t testing.TB) []dlq.Record {
	return h.DeadLetters(t, "")
}

// KillSource deletes the source topic. The cluster does not create topics
// on demand, so it stays deleted, and the harness's sources give up on it
// after a short UnknownTopicTimeout.
func (h *harness) KillSource(t testing.TB) error {
	t.Helper()
	cl := &kafkago.Client{Addr: kafkago.TCP(h.c.Addrs()...)}
	resp, err := cl.DeleteTopics(testCtx(t, 10*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{h.topic}})
	if err == nil {
		err = resp.Errors[h.topic]
	}
	if err != nil {
		t.Fatalf("delete topic %s: %v", h.topic, err)
	}
	return ErrUnknownTopic
}

// TestConformance runs alone, not in parallel with the package's other
// tests, to keep CPU contention under -race from eating into the suite's
// bounded waits.
func TestConformance(t *testing.T) {
	c := startStrictCluster(t)
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return newHarness(t, c) })
}

// A tenant parked on partition 0 does not stop another tenant on
// partition 0: parking is per tenant, not per partition.
func TestParkedTenantDoesNotBlockItsPartition(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	h := newHarness(t, c)
	var stuck, fine []consumertest.Msg
	for i := range 30 {
		stuck = append(stuck, consumertest.Msg{Tenant: "stuck", Partition: 0, Value: []byte(fmt.Sprintf("stuck-%d", i))})
		fine = append(fine, consumertest.Msg{Tenant: "fine", Partition: 0, Value: []byte(fmt.Sprintf("fine-%d", i))})
	}
	h.Produce(t, stuck...)

	var down = make(chan struct{})
	rec := consumertest.NewRecorder()
	cons, err := consumer.New(consumer.Config{
		Scope:  scope.New(consumertest.FastPolicy(), scope.Options[string]{}),
		Tenant: h.Tenant(),
		DLQ:    h.dlq,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			tn, _ := h.Tenant()(m)
			if tn == "stuck" {
				select {
				case <-down:
				default:
					return errStuck
				}
			}
			rec.Add(tn, string(m.Value))
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx, h.NewSource(t)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait := testCtx(t, 60*time.Second)
	eventually(t, wait, "the failing tenant parked", func() bool { ts, _ := cons.Tenant("stuck"); return ts.Parked > 0 })
	// Its messages hold partition 0's commit point, not its consumption.
	h.Produce(t, fine...)
	eventually(t, wait, "the healthy tenant on partition 0 handled", func() bool { return rec.Count("fine") == 30 })
	if n := rec.Count("stuck"); n != 0 {
		t.Fatalf("stuck tenant handled %d while failing", n)
	}
	if ts, _ := cons.Tenant("stuck"); ts.Parked == 0 {
		t.Fatalf("stuck tenant no longer parked while failing: %+v", ts)
	}
	close(down)
	eventually(t, wait, "the stuck tenant handled after recovery", func() bool { return rec.Count("stuck") >= 30 })
	if dl := h.DeadLetters(t, "stuck"); len(dl) != 0 {
		t.Fatalf("a transient failure dead-lettered %d messages", len(dl))
	}
}

var errStuck = errors.New("dependency down")
