package nats

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

// tenantHeader carries the tenant in conformance messages: the suite's
// hostile keys cannot be subject tokens.
const tenantHeader = "tenant"

type harness struct {
	f   *fixture
	dlq *DLQ

	mu       sync.Mutex // serialises Produce
	produced uint64     // messages in the stream
}

func newHarness(srv *natstest.Server) func(t testing.TB) consumertest.Harness {
	return func(t testing.TB) consumertest.Harness {
		// AckWait 2s: the restart case waits for the server to redeliver
		// what the first run left unsettled. MaxAckPending 1000 lowers the
		// engine's partition bound to 999 (PartitionCapacity), above what
		// the suite's cases configure.
		f := newFixture(t, srv, 2*time.Second, 1000)
		n := nameSeq.Add(1)
		q, err := NewDLQ(testCtx(t), f.js, WithDLQStream(fmt.Sprintf("DLQ%d", n)), WithDLQPrefix(fmt.Sprintf("dlq%d", n)))
		if err != nil {
			t.Fatal(err)
		}
		return &harness{f: f, dlq: q}
	}
}

func (h *harness) Partitions() int { return 1 }

func (h *harness) Tenant() consumer.TenantFunc { return consumer.FromHeader(tenantHeader) }

func (h *harness) Produce(t testing.TB, msgs ...consumertest.Msg) {
	t.Helper()
	// Core publishes on one connection keep their order and cost
	// microseconds; the last message is published with a PubAck, whose
	// sequence proves every earlier one was stored (the harness is the
	// stream's only producer). A PubAck per message would make producing,
	// and so the suite's outages, last much longer.
	if len(msgs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, m := range msgs {
		out := &nats.Msg{Subject: h.f.subject + ".in", Data: m.Value}
		if m.Tenant != "" {
			out.Header = nats.Header{tenantHeader: {m.Tenant}}
		}
		if i < len(msgs)-1 {
			if err := h.f.nc.PublishMsg(out); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ack, err := h.f.js.PublishMsg(testCtx(t), out)
		if err != nil {
			t.Fatal(err)
		}
		h.produced += uint64(len(msgs))
		if ack.Sequence != h.produced {
			t.Fatalf("produce: stream at sequence %d, want %d: a message was not stored", ack.Sequence, h.produced)
		}
	}
}

func (h *harness) NewSource(t testing.TB) consumer.Source {
	return rebalancingSource{h.f.source(t)}
}

// SpillLog implements consumertest.Spiller: a new SpillLog on the spill
// stream of the harness's consumer.
func (h *harness) SpillLog(t testing.TB) consumer.SpillLog { return h.f.spillLog(t) }

// rebalancingSource lets the suite's Revocation case take the partitions
// away and give them back (JetStream has no consumer-group rebalance).
type rebalancingSource struct{ *Source }

func (s rebalancingSource) Rebalance() { s.revokeAll() }

func (h *harness) Sink(testing.TB) dlq.Sink { return h.dlq }

func (h *harness) DeadLetters(t testing.TB, tenant string) []dlq.Record {
	t.Helper()
	recs, err := h.dlq.Peek(testCtx(t), tenant, 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func (h *harness) NoTenantLetters(t testing.TB) []dlq.Record { return h.DeadLetters(t, "") }

// KillSource deletes the durable consumer under the running source.
func (h *harness) KillSource(t testing.TB) error {
	t.Helper()
	if err := h.f.js.DeleteConsumer(testCtx(t), h.f.stream, h.f.durable); err != nil {
		t.Fatal(err)
	}
	return ErrConsumerGone
}

var _ consumertest.Spiller = (*harness)(nil)

// TestConformance runs alone (not parallel): the suite's parking cases time
// outages by wall clock, and a loaded machine stretches them.
func TestConformance(t *testing.T) {
	consumertest.Run(t, newHarness(natstest.Start(t)))
}
