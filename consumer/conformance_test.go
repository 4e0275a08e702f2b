package consumer_test

import (
	"testing"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

func TestConformanceInMemory(t *testing.T) {
	consumertest.Run(t, func(t testing.TB) consumertest.Harness { return noTenantHarness{consumertest.NewMemHarness(4)} })
}

func TestSpillLogConformanceInMemory(t *testing.T) {
	consumertest.RunSpillLog(t, func(t testing.TB) consumertest.SpillLogHarness { return &memSpillHarness{s: consumertest.NewSpill()} })
}

// memSpillHarness runs the spill log suite on the in-memory log; every Open
// is the same log (it is its own durable state).
type memSpillHarness struct{ s *consumertest.Spill }

func (h *memSpillHarness) Open(testing.TB) consumer.SpillLog { return h.s }

func (h *memSpillHarness) Partition() consumer.Partition {
	return consumer.Partition{Topic: "orders", ID: 0}
}

func (h *memSpillHarness) Other() consumer.Partition {
	return consumer.Partition{Topic: "orders", ID: 3}
}

// noTenantHarness exposes the in-memory sink's no-tenant bucket to the suite.
type noTenantHarness struct{ *consumertest.MemHarness }

func (h noTenantHarness) NoTenantLetters(t testing.TB) []dlq.Record { return h.S.Records("", true) }
