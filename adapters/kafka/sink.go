package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
)

// SinkOption configures a Sink or an Inspector. Each option checks its own
// argument.
type SinkOption func(*sinkConfig) error

type sinkConfig struct {
	dialer       *kafkago.Dialer
	shared       string
	partitions   int
	replication  int
	batchTimeout time.Duration
	cursorGroup  string
	deleteDrain  bool
}

func defaultSinkConfig() sinkConfig {
	return sinkConfig{
		dialer:       kafkago.DefaultDialer,
		partitions:   1,
		replication:  -1,
		batchTimeout: 2 * time.Millisecond,
		cursorGroup:  DefaultCursorGroup,
	}
}

// DefaultCursorGroup is the consumer group whose committed offsets mark
// how far each DLQ topic was replayed or purged.
const DefaultCursorGroup = "ringfence-dlq"

// SinkDialer sets the dialer (TLS, SASL, timeouts). Default: kafka-go's
// DefaultDialer.
func SinkDialer(d *kafkago.Dialer) SinkOption {
	return func(c *sinkConfig) error {
		if d == nil {
			return invalid("nil dialer")
		}
		c.dialer = d
		return nil
	}
}

// SinkSharedTopic writes every tenant's dead letters to the one topic
// name, partitioned by tenant (the original key is kept). In an Inspector,
// it reads that topic and keeps one cursor group per tenant. Default: a
// topic per tenant, dlq.KafkaTopic(source, tenant).
func SinkSharedTopic(name string) SinkOption {
	return func(c *sinkConfig) error {
		if err := validTopic(name); err != nil {
			return err
		}
		c.shared = name
		return nil
	}
}

// SinkPartitions sets the partition count of DLQ topics the sink creates.
// Default: 1 (a tenant's dead letters stay in order).
func SinkPartitions(n int) SinkOption {
	return func(c *sinkConfig) error {
		if n < 1 {
			return invalid("partitions %d is not positive", n)
		}
		c.partitions = n
		return nil
	}
}

// SinkReplication sets the replication factor of DLQ topics the sink
// creates. Default: -1, the broker's default.
func SinkReplication(n int) SinkOption {
	return func(c *sinkConfig) error {
		if n < 1 && n != -1 {
			return invalid("replication factor %d is neither positive nor -1", n)
		}
		c.replication = n
		return nil
	}
}

// SinkBatchTimeout sets how long the writer waits to batch concurrent
// dead letters before sending. Default: 2ms.
func SinkBatchTimeout(d time.Duration) SinkOption {
	return func(c *sinkConfig) error {
		if d <= 0 {
			return invalid("batch timeout %v is not positive", d)
		}
		c.batchTimeout = d
		return nil
	}
}

// CursorGroup sets the consumer group an Inspector keeps its cursors in.
// Default: DefaultCursorGroup.
func CursorGroup(name string) SinkOption {
	return func(c *sinkConfig) error {
		if name == "" {
			return invalid("empty cursor group")
		}
		c.cursorGroup = name
		return nil
	}
}

// DeleteDrained lets Inspector.Purge delete a per-tenant DLQ topic once it
// is drained. Only use it while no consumer writes to that tenant's DLQ: a
// record written between the purge and the delete would be lost. Default:
// off.
func DeleteDrained() SinkOption {
	return func(c *sinkConfig) error {
		c.deleteDrain = true
		return nil
	}
}

func buildSinkConfig(brokers []string, opts []SinkOption) (sinkConfig, error) {
	cfg := defaultSinkConfig()
	if len(brokers) == 0 {
		return cfg, invalid("no brokers")
	}
	for _, b := range brokers {
		if b == "" || !strings.Contains(b, ":") {
			return cfg, invalid("broker %q is not host:port", b)
		}
	}
	for _, o := range opts {
		if o == nil {
			return cfg, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// Sink writes dead-letter records to Kafka. Write returns only after every
// in-sync replica acknowledged the record. Sink is safe for concurrent use.
type Sink struct {
	cfg    sinkConfig
	client *kafkago.Client
	w      *kafkago.Writer

	mu      sync.Mutex
	created map[string]bool // topics known to exist; guarded by mu
}

// NewSink returns a Sink writing through brokers (host:port).
func NewSink(brokers []string, opts ...SinkOption) (*Sink, error) {
	cfg, err := buildSinkConfig(brokers, opts)
	if err != nil {
		return nil, err
	}
	tr := transportFor(cfg.dialer)
	return &Sink{
		cfg:    cfg,
		client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr},
		w: &kafkago.Writer{
			Addr:         kafkago.TCP(brokers...),
			Balancer:     tenantBalancer{},
			RequiredAcks: kafkago.RequireAll,
			BatchTimeout: cfg.batchTimeout,
			Transport:    tr,
		},
		created: map[string]bool{},
	}, nil
}

// Topic returns the DLQ topic that r goes to.
func (s *Sink) Topic(r *dlq.Record) string {
	if s.cfg.shared != "" {
		return s.cfg.shared
	}
	return dlq.KafkaTopic(r.Source, r.Bucket())
}

// Write writes r to its tenant's DLQ topic, creating the topic on first
// use, and returns once the broker acknowledged it.
func (s *Sink) Write(ctx context.Context, r *dlq.Record) error {
	if r.Source == "" {
		return errors.New("kafka: dead letter without a source topic")
	}
	topic := s.Topic(r)
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("kafka: dead-letter topic for source %q: %w", r.Source, err)
	}
	if err := s.ensureTopic(ctx, topic); err != nil {
		return err
	}
	msg := kafkago.Message{
		Topic:   topic,
		Key:     r.Key,
		Value:   r.Value,
		Headers: toKafkaHeaders(r.EncodeHeaders()),
	}
	if err := s.w.WriteMessages(ctx, msg); err != nil {
		return fmt.Errorf("kafka: write dead letter to %s: %w", topic, err)
	}
	return nil
}

// Close flushes and closes the writer.
func (s *Sink) Close() error { return s.w.Close() }

// ensureTopic creates topic once per Sink; an existing topic is fine.
func (s *Sink) ensureTopic(ctx context.Context, topic string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created[topic] {
		return nil
	}
	if err := createTopic(ctx, s.client, topic, s.cfg.partitions, s.cfg.replication); err != nil {
		return err
	}
	s.created[topic] = true
	return nil
}

func createTopic(ctx context.Context, cl *kafkago.Client, topic string, partitions, replication int) error {
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: replication}},
	})
	if err != nil {
		return fmt.Errorf("kafka: create topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		return fmt.Errorf("kafka: create topic %s: %w", topic, err)
	}
	return nil
}

func toKafkaHeaders(hs []dlq.Header) []kafkago.Header {
	out := make([]kafkago.Header, len(hs))
	for i, h := range hs {
		out[i] = kafkago.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

func fromKafkaHeaders(hs []kafkago.Header) []dlq.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]dlq.Header, len(hs))
	for i, h := range hs {
		out[i] = dlq.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// tenantBalancer partitions a shared DLQ topic by tenant token, so one
// tenant's dead letters stay in order while the original key is kept.
// Per-tenant topics have one partition, where any choice is the same.
type tenantBalancer struct{}

func (tenantBalancer) Balance(m kafkago.Message, partitions ...int) int {
	for _, h := range m.Headers {
		if h.Key == dlq.HeaderTenantToken {
			f := fnv.New32a()
			_, _ = f.Write(h.Value)
			return partitions[int(f.Sum32()%uint32(len(partitions)))]
		}
	}
	return partitions[0]
}
