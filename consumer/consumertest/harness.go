package consumertest

import (
	"testing"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Msg is one message the suite asks a harness to produce.
type Msg struct {
	// Tenant is written where the harness's Tenant func reads it. Empty
	// means the message carries no tenant key at all.
	Tenant string
	// Partition the message must land in, in [0, Partitions). Harnesses
	// with a single partition ignore it.
	Partition int
	// Value is the payload; the suite puts a unique id in it.
	Value []byte
}

// Harness connects the conformance suite to one adapter over a real (or
// in-memory) broker. Each call of the suite's newHarness func must return a
// harness on fresh, isolated names (topic/stream, group/durable, DLQ).
type Harness interface {
	// Partitions is how many partitions the source has (1 for NATS).
	Partitions() int
	// Tenant extracts the tenant key from messages made by Produce.
	Tenant() consumer.TenantFunc
	// Produce appends msgs to the source, in order, and returns once the
	// broker acknowledged them.
	Produce(t testing.TB, msgs ...Msg)
	// NewSource returns a new Source on the same topic/stream and the same
	// group/durable: a second one started after the first stopped resumes
	// from what the first committed or acknowledged.
	NewSource(t testing.TB) consumer.Source
	// Sink is the durable DLQ sink.
	Sink(t testing.TB) dlq.Sink
	// DeadLetters reads back every record in the tenant's DLQ, oldest first.
	DeadLetters(t testing.TB, tenant string) []dlq.Record
}

// Killer is implemented by harnesses that can make the broker side of
// their sources dead for good while a source runs: the NATS durable
// consumer deleted, the Kafka topic deleted. The suite's DeadSource case
// needs it and is skipped for harnesses without it.
type Killer interface {
	// KillSource kills what every source of the harness reads. It returns
	// an error that the error of the source's Run, and so of the engine's
	// Run, must match with errors.Is (nil: any error will do).
	KillSource(t testing.TB) error
}
