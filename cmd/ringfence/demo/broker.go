package demo

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/dlq"
)

// Broker is one message system the demo runs on. Each run of the scenario
// gets a fresh Topic from it.
type Broker interface {
	// Name is "kafka", "nats" or "memory".
	Name() string
	// Open creates a fresh topic (Kafka) or stream (NATS) for one run, with
	// the given number of partitions where the broker has them.
	Open(ctx context.Context, run string, partitions int) (Topic, error)
	// Close stops an in-process broker and closes connections.
	Close() error
}

// spillTopic is a Topic whose broker gives the engine a spill log for a
// group (consumer.Config.Spill).
type spillTopic interface {
	SpillLog(group string) (consumer.SpillLog, error)
}

// Topic is one run's topic or stream.
type Topic interface {
	// Produce writes msgs and returns once the broker has them; messages of
	// one tenant keep their order.
	Produce(ctx context.Context, msgs []Msg) error
	// Source returns a new consumer.Source reading the topic as group;
	// tenant is the engine's tenant function (sources that track tenants
	// themselves need it), and oneTenant says that it maps every message to
	// one key (the Shared mode).
	Source(group string, tenant consumer.TenantFunc, oneTenant bool) (consumer.Source, error)
	// Tenant is the broker's natural tenant function (Kafka: the message
	// key; NATS: a subject token).
	Tenant() consumer.TenantFunc
	// Sink receives the engine's dead letters.
	Sink() dlq.Sink
	// DeadLetters reads back every dead letter written for the given engine
	// tenant keys.
	DeadLetters(ctx context.Context, tenants []string) ([]dlq.Record, error)
	// Close releases the topic's clients.
	Close() error
}

// Msg is one message to produce.
type Msg struct {
	Tenant string
	Value  []byte
}

// Message values are "tenant|id|kind": the handler and the dead-letter
// count read the real tenant and the id from the value, so they work the
// same whatever key the engine's tenant function returns.
const (
	kindOK     = 'o'
	kindPoison = 'p'
)

func encodeValue(tenant string, id int, kind byte) []byte {
	return append(fmt.Appendf(nil, "%s|%d|", tenant, id), kind)
}

func decodeValue(v []byte) (tenant string, id int, kind byte, ok bool) {
	s := string(v)
	i := strings.IndexByte(s, '|')
	j := strings.LastIndexByte(s, '|')
	if i <= 0 || j <= i || j != len(s)-2 {
		return "", 0, 0, false
	}
	id, err := strconv.Atoi(s[i+1 : j])
	if err != nil || id < 0 || (s[j+1] != kindOK && s[j+1] != kindPoison) {
		return "", 0, 0, false
	}
	return s[:i], id, s[j+1], true
}

// memBroker is the in-memory stand-in, for tests and --broker memory.
type memBroker struct{}

func (memBroker) Name() string { return "memory" }
func (memBroker) Close() error { return nil }

func (memBroker) Open(_ context.Context, run string, partitions int) (Topic, error) {
	return &memTopic{b: consumertest.NewBroker(run, partitions), s: consumertest.NewSink(), parts: partitions}, nil
}

type memTopic struct {
	b     *consumertest.Broker
	s     *consumertest.Sink
	parts int
	mu    sync.Mutex
}

func (t *memTopic) Produce(_ context.Context, msgs []Msg) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		t.b.Append(partitionOf(m.Tenant, t.parts), []byte(m.Tenant), m.Value)
	}
	return nil
}

func (t *memTopic) Source(group string, _ consumer.TenantFunc, _ bool) (consumer.Source, error) {
	return t.b.Source(group), nil
}
func (t *memTopic) Tenant() consumer.TenantFunc { return consumer.FromKey() }
func (t *memTopic) Sink() dlq.Sink              { return t.s }
func (t *memTopic) Close() error                { return nil }

func (t *memTopic) DeadLetters(_ context.Context, tenants []string) ([]dlq.Record, error) {
	var out []dlq.Record
	for _, k := range tenants {
		out = append(out, t.s.Records(k, false)...)
	}
	return out, nil
}

// partitionOf spreads tenants over partitions the way a key hash would,
// deterministically.
func partitionOf(tenant string, parts int) int {
	h := uint32(2166136261)
	for i := 0; i < len(tenant); i++ {
		h ^= uint32(tenant[i])
		h *= 16777619
	}
	return int(h % uint32(parts))
}
