package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/flight"
)

// SinkOption configures a Sink or an Inspector. Each option checks its own
// argument.
type SinkOption func(*sinkConfig) error

type sinkConfig struct {
	dialer      *kafkago.Dialer
	shared      string
	partitions  int
	replication int
	cursorGroup string
	deleteDrain bool
}

func defaultSinkConfig() sinkConfig {
	return sinkConfig{
		dialer:      kafkago.DefaultDialer,
		partitions:  1,
		replication: -1,
		cursorGroup: DefaultCursorGroup,
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
//
// Each DLQ topic is created on its first dead letter, sized from its
// source topic (see Write), and marked with a MarkerDLQ record. Creating
// one tenant's topic never holds up another tenant's dead letters: the
// sink keeps no lock across a network call, and concurrent first writes to
// one topic share a single creation.
type Sink struct {
	cfg    sinkConfig
	tr     *kafkago.Transport
	client *kafkago.Client

	sources flight.Group[int]      // source topic -> its max.message.bytes
	topics  flight.Group[dlqTopic] // DLQ topic -> what the sink knows of it
}

// dlqTopic is what a Sink knows of one of its DLQ topics.
type dlqTopic struct {
	limit      int // max.message.bytes
	partitions int
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
		tr:     tr,
		client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr},
	}, nil
}

// Topic returns the DLQ topic that r goes to.
func (s *Sink) Topic(r *dlq.Record) string {
	if s.cfg.shared != "" {
		return s.cfg.shared
	}
	return dlq.KafkaTopic(r.Source, r.Bucket())
}

// Write writes r to its tenant's DLQ topic and returns once the broker
// acknowledged it.
//
// A dead letter must fit wherever its message fitted. On first use of a DLQ
// topic Write reads the source topic's max.message.bytes (or the broker's
// message.max.bytes) and creates the DLQ topic with twice that plus 64 KiB,
// room for the ringfence- headers and a tenant key as long as the message.
// A record that still does not fit raises the DLQ topic's limit to the
// record's size. Write returns an error wrapping dlq.ErrUnwritable only when
// the record cannot be written as it is: larger than a produce request may
// carry (100 MiB), or larger than the topic accepts while the broker
// refuses to raise its limit. Every other error is transient.
func (s *Sink) Write(ctx context.Context, r *dlq.Record) error {
	if r.Source == "" {
		return errors.New("kafka: dead letter without a source topic")
	}
	topic := s.Topic(r)
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("kafka: dead-letter topic for source %q: %w", r.Source, err)
	}
	msg := kafkago.Message{Key: r.Key, Value: r.Value, Headers: toKafkaHeaders(r.EncodeHeaders()), Time: time.Now()}
	need := batchSize(&msg)
	if need > maxTopicLimit {
		return fmt.Errorf("kafka: dead letter for %s is %d bytes, more than a produce request may carry (%d): %w", topic, need, maxTopicLimit, dlq.ErrUnwritable)
	}
	for attempt := 0; ; attempt++ {
		t, err := s.topic(ctx, topic, r.Source)
		if err != nil {
			return err
		}
		if need > t.limit {
			if t, err = s.raise(ctx, topic, t, need); err != nil {
				return err
			}
		}
		err = produceRecords(ctx, s.client, topic, partitionFor(dlq.TenantToken(r.Bucket()), t.partitions), msg)
		if err == nil {
			return nil
		}
		if !errors.Is(err, kafkago.MessageSizeTooLarge) && !errors.Is(err, kafkago.RecordListTooLarge) {
			return fmt.Errorf("kafka: write dead letter to %s: %w", topic, err)
		}
		// The topic's limit may have been lowered since it was read: read
		// it again, raise it if needed, and try once more.
		s.topics.Forget(topic, nil)
		if attempt > 0 {
			return fmt.Errorf("kafka: write dead letter to %s: the broker refuses a %d-byte record although the topic's max.message.bytes is %d (is the broker's socket.request.max.bytes lower?): %w: %w", topic, need, t.limit, dlq.ErrUnwritable, err)
		}
	}
}

// raise sets topic's max.message.bytes to need.
func (s *Sink) raise(ctx context.Context, topic string, t dlqTopic, need int) (dlqTopic, error) {
	if err := setTopicLimit(ctx, s.client, topic, need); err != nil {
		if refused(err) {
			return t, fmt.Errorf("kafka: dead letter is %d bytes, more than %s accepts (max.message.bytes %d), and the limit may not be raised: %w: %w", need, topic, t.limit, dlq.ErrUnwritable, err)
		}
		return t, err
	}
	t.limit = need
	s.topics.Set(topic, t)
	return t, nil
}

// Close closes the sink's idle connections.
func (s *Sink) Close() error {
	s.tr.CloseIdleConnections()
	return nil
}

// topic returns what the sink knows of topic, creating it on first use.
func (s *Sink) topic(ctx context.Context, topic, source string) (dlqTopic, error) {
	return s.topics.Do(ctx, topic, func(ctx context.Context) (dlqTopic, error) {
		src, err := s.sources.Do(ctx, source, func(ctx context.Context) (int, error) {
			return topicLimit(ctx, s.client, source)
		})
		if err != nil {
			return dlqTopic{}, err
		}
		return s.ensureTopic(ctx, topic, source, dlqLimit(src))
	})
}

// ensureTopic creates topic with max.message.bytes limit, or reads the
// settings of the existing topic, and marks it as a DLQ when it is empty.
func (s *Sink) ensureTopic(ctx context.Context, topic, source string, limit int) (dlqTopic, error) {
	t := dlqTopic{limit: limit, partitions: s.cfg.partitions}
	created, err := createTopicWith(ctx, s.client, topic, s.cfg.partitions, s.cfg.replication,
		kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(limit)})
	if err != nil {
		return t, err
	}
	empty := created
	if !created {
		// An existing topic keeps its settings: read them.
		if t.limit, err = topicLimit(ctx, s.client, topic); err != nil {
			return t, err
		}
		starts, ends, err := bounds(ctx, s.client, topic)
		if err != nil {
			return t, err
		}
		t.partitions, empty = len(ends), true
		for p, end := range ends {
			empty = empty && end == starts[p]
		}
	}
	if empty {
		if err := s.mark(ctx, topic, source, t.partitions); err != nil {
			return t, err
		}
	}
	return t, nil
}

// mark writes a MarkerDLQ record into every partition of a new DLQ topic,
// so that an inspector can tell it is one before it holds a dead letter.
func (s *Sink) mark(ctx context.Context, topic, source string, partitions int) error {
	hs := []kafkago.Header{{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerDLQ)}}
	if s.cfg.shared == "" {
		hs = append(hs, kafkago.Header{Key: dlq.HeaderSource, Value: []byte(source)})
	}
	for p := range partitions {
		if err := produceRecords(ctx, s.client, topic, p, kafkago.Message{Headers: hs, Time: time.Now()}); err != nil {
			return fmt.Errorf("kafka: mark %s as a DLQ: %w", topic, err)
		}
	}
	return nil
}

// createTopic creates topic; a topic that already exists is not an error.
func createTopic(ctx context.Context, cl *kafkago.Client, topic string, partitions, replication int) error {
	_, err := createTopicWith(ctx, cl, topic, partitions, replication)
	return err
}

// createTopicWith creates topic with configs and reports whether it did;
// a topic that already exists is not an error.
func createTopicWith(ctx context.Context, cl *kafkago.Client, topic string, partitions, replication int, configs ...kafkago.ConfigEntry) (bool, error) {
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: replication, ConfigEntries: configs}},
	})
	if err != nil {
		return false, fmt.Errorf("kafka: create topic %s: %w", topic, err)
	}
	switch err := resp.Errors[topic]; {
	case err == nil:
		return true, nil
	case errors.Is(err, kafkago.TopicAlreadyExists):
		return false, nil
	default:
		return false, fmt.Errorf("kafka: create topic %s: %w", topic, err)
	}
}

// produceRecords writes msgs to topic/partition in one request, as one batch, and
// waits for every in-sync replica. Unlike kafka-go's Writer it never splits
// or merges batches, so a batch is exactly as large as batchSize says, and
// it keeps a header value's null apart from an empty one.
func produceRecords(ctx context.Context, cl *kafkago.Client, topic string, partition int, msgs ...kafkago.Message) error {
	recs := make([]kafkago.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = kafkago.Record{Time: m.Time, Key: kafkago.NewBytes(m.Key), Value: kafkago.NewBytes(m.Value), Headers: m.Headers}
	}
	_, err := produceBatch(ctx, cl, topic, partition, recs)
	return err
}

// produceBatch writes recs to topic/partition in one request, as one
// batch, waits for every in-sync replica, and returns the offset of the
// first record.
func produceBatch(ctx context.Context, cl *kafkago.Client, topic string, partition int, recs []kafkago.Record) (int64, error) {
	resp, err := cl.Produce(ctx, &kafkago.ProduceRequest{
		Topic:        topic,
		Partition:    partition,
		RequiredAcks: kafkago.RequireAll,
		Records:      kafkago.NewRecordReader(recs...),
	})
	if err != nil {
		return 0, err
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	for _, err := range resp.RecordErrors {
		return 0, err
	}
	return resp.BaseOffset, nil
}

// partitionFor places a tenant's dead letters on one partition of a
// topic with n, so that they stay in order.
func partitionFor(token string, n int) int {
	if n <= 1 {
		return 0
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(token))
	return int(f.Sum32() % uint32(n))
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
