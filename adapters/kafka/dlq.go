package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/flight"
)

// DLQOption configures a DLQ. Each option checks its own argument.
type DLQOption func(*dlqConfig) error

type dlqConfig struct {
	dialer      *kafkago.Dialer
	shared      string
	partitions  int
	replication int
	cursorGroup string
	deleteDrain bool
}

func defaultDLQConfig() dlqConfig {
	return dlqConfig{
		dialer:      kafkago.DefaultDialer,
		partitions:  1,
		replication: -1,
		cursorGroup: DefaultDLQCursorGroup,
	}
}

// DefaultDLQCursorGroup is the consumer group whose committed offsets mark
// how far each DLQ topic was replayed or purged.
const DefaultDLQCursorGroup = "ringfence-dlq"

// DLQDialer sets the dialer (TLS, SASL, timeouts). Default: kafka-go's
// DefaultDialer.
func DLQDialer(d *kafkago.Dialer) DLQOption {
	return func(c *dlqConfig) error {
		if d == nil {
			return invalid("nil dialer")
		}
		c.dialer = d
		return nil
	}
}

// DLQSharedTopic puts every tenant's dead letters in the one topic name,
// partitioned by tenant (the original key is kept), and keeps one cursor
// group per tenant. Default: a topic per tenant, dlq.KafkaTopic(source,
// tenant).
func DLQSharedTopic(name string) DLQOption {
	return func(c *dlqConfig) error {
		if err := validTopic(name); err != nil {
			return err
		}
		c.shared = name
		return nil
	}
}

// DLQPartitions sets the partition count of the DLQ topics it creates.
// Default: 1 (a tenant's dead letters stay in order).
func DLQPartitions(n int) DLQOption {
	return func(c *dlqConfig) error {
		if n < 1 {
			return invalid("partitions %d is not positive", n)
		}
		c.partitions = n
		return nil
	}
}

// DLQReplication sets the replication factor of the DLQ topics it
// creates. Default: -1, the broker's default.
func DLQReplication(n int) DLQOption {
	return func(c *dlqConfig) error {
		if n < 1 && n != -1 {
			return invalid("replication factor %d is neither positive nor -1", n)
		}
		c.replication = n
		return nil
	}
}

// DLQCursorGroup sets the consumer group the cursors are kept in.
// Default: DefaultDLQCursorGroup.
func DLQCursorGroup(name string) DLQOption {
	return func(c *dlqConfig) error {
		if name == "" {
			return invalid("empty cursor group")
		}
		c.cursorGroup = name
		return nil
	}
}

// DLQDeleteDrained lets Purge delete a per-tenant DLQ topic once it is
// drained. Only use it while no consumer writes to that tenant's DLQ: a
// record written between the purge and the delete would be lost. Default:
// off.
func DLQDeleteDrained() DLQOption {
	return func(c *dlqConfig) error {
		c.deleteDrain = true
		return nil
	}
}

// A DLQ writes the dead letters of one source topic and lists, peeks,
// replays and purges them: it implements dlq.Sink and dlq.Inspector. Each
// tenant has a topic of its own, dlq.KafkaTopic(source, tenant) =
// "<source>.dlq.<token>", or all share one (DLQSharedTopic). Write returns
// only after every in-sync replica acknowledged the record.
//
// Each DLQ topic is created on its first dead letter, sized from its
// source topic (see Write), and marked: a record with the header
// ringfence-marker: dlq in each partition, so that it is known as a DLQ
// before it holds a dead letter (Kafka topics take no custom
// configuration, so the mark is a record). Creating one tenant's topic
// never holds up another tenant's dead letters: the DLQ keeps no lock
// across a network call, and concurrent first writes to one topic share a
// single creation.
//
// kafka-go has no DeleteRecords call, so removing a dead letter advances a
// committed cursor instead: the offsets of the consumer group
// DefaultDLQCursorGroup on the DLQ topic (one group per tenant,
// "<group>.<token>", on a shared topic, so that replaying or purging one
// tenant never hides another's records). Counts and peeks start at the
// cursor. Replay republishes a dead letter to its source topic and
// advances the cursor only after the republish was acknowledged, so a
// crash mid-replay may duplicate a message, never lose one. Copies of one
// dead letter (same source topic, partition and offset) are shown, counted
// and replayed once: the cursor can only pass a prefix of the log, so
// after Replay or Purge a record with ringfence-marker: moved lists the
// dead letters moved, and their copies further on (and copies written
// later) stay hidden while it is past the cursor.
//
// A topic is read as a DLQ only when every record read in it carries
// ringfence- headers (a dead letter or a marker), including the first
// record of each partition (which accepts a DLQ topic with no marker but
// only dead letters): anything else, such as a topic of live data named
// "<source>.dlq.<token>", is refused with an error wrapping dlq.ErrNotDLQ
// before anything is changed.
//
// DLQ is safe for concurrent use, but two DLQs replaying the same tenant
// at once may both republish a record.
type DLQ struct {
	source  string
	cfg     dlqConfig
	tr      *renewingTransport
	client  *kafkago.Client
	records *wire.Client // reads the DLQ topics

	limits flight.Group[int]      // source topic -> its max.message.bytes
	topics flight.Group[dlqTopic] // DLQ topic -> what the DLQ knows of it
}

// dlqTopic is what a DLQ knows of one of its DLQ topics.
type dlqTopic struct {
	limit      int // max.message.bytes
	partitions int
}

var (
	_ dlq.Sink      = (*DLQ)(nil)
	_ dlq.Inspector = (*DLQ)(nil)
)

// NewDLQ returns the DLQ of source, reached through brokers (host:port).
// It validates its arguments and options; nothing connects until the
// first call.
func NewDLQ(brokers []string, source string, opts ...DLQOption) (*DLQ, error) {
	cfg := defaultDLQConfig()
	if err := validBrokers(brokers); err != nil {
		return nil, err
	}
	if err := validTopic(source); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	tr := newRenewingTransport(cfg.dialer)
	return &DLQ{
		source:  source,
		cfg:     cfg,
		tr:      tr,
		client:  &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr},
		records: wire.NewClient(cfg.dialer, brokers),
	}, nil
}

// Close closes the DLQ's idle connections.
func (q *DLQ) Close() error {
	q.tr.cur.Load().CloseIdleConnections()
	q.records.Close()
	return nil
}

// Source returns the source topic.
func (q *DLQ) Source() string { return q.source }

// Topic returns the DLQ topic of tenant.
func (q *DLQ) Topic(tenant string) string {
	if q.cfg.shared != "" {
		return q.cfg.shared
	}
	return dlq.KafkaTopic(q.source, tenant)
}

// topicOf returns the DLQ topic that r goes to: its own source topic's.
func (q *DLQ) topicOf(r *dlq.Record) string {
	if q.cfg.shared != "" {
		return q.cfg.shared
	}
	return dlq.KafkaTopic(r.Source, r.Bucket())
}

// Write writes r to its tenant's DLQ topic and returns once the broker
// acknowledged it. The topic is that of r's own source topic (r.Source):
// the DLQ's source when the engine reading it writes r.
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
func (q *DLQ) Write(ctx context.Context, r *dlq.Record) error {
	if r.Source == "" {
		return errors.New("kafka: dead letter without a source topic")
	}
	topic := q.topicOf(r)
	if err := validTopic(topic); err != nil {
		return fmt.Errorf("kafka: dead-letter topic for source %q: %w", r.Source, err)
	}
	msg := kafkago.Message{Key: r.Key, Value: r.Value, Headers: toKafkaHeaders(r.EncodeHeaders()), Time: time.Now()}
	need := batchSize(&msg)
	if need > maxTopicLimit {
		return fmt.Errorf("kafka: dead letter for %s is %d bytes, more than a produce request may carry (%d): %w", topic, need, maxTopicLimit, dlq.ErrUnwritable)
	}
	for attempt := 0; ; attempt++ {
		t, err := q.topic(ctx, topic, r.Source)
		if err != nil {
			return err
		}
		if need > t.limit {
			if t, err = q.raise(ctx, topic, t, need); err != nil {
				return err
			}
		}
		err = produceRecords(ctx, q.client, topic, partitionFor(dlq.TenantToken(r.Bucket()), t.partitions), msg)
		if err == nil {
			return nil
		}
		if !errors.Is(err, kafkago.MessageSizeTooLarge) && !errors.Is(err, kafkago.RecordListTooLarge) {
			return fmt.Errorf("kafka: write dead letter to %s: %w", topic, err)
		}
		// The topic's limit may have been lowered since it was read: read
		// it again, raise it if needed, and try once more.
		q.topics.Forget(topic, nil)
		if attempt > 0 {
			return fmt.Errorf("kafka: write dead letter to %s: the broker refuses a %d-byte record although the topic's max.message.bytes is %d (is the broker's socket.request.max.bytes lower?): %w: %w", topic, need, t.limit, dlq.ErrUnwritable, err)
		}
	}
}

// raise sets topic's max.message.bytes to need.
func (q *DLQ) raise(ctx context.Context, topic string, t dlqTopic, need int) (dlqTopic, error) {
	if err := setTopicLimit(ctx, q.client, topic, need); err != nil {
		if refused(err) {
			return t, fmt.Errorf("kafka: dead letter is %d bytes, more than %s accepts (max.message.bytes %d), and the limit may not be raised: %w: %w", need, topic, t.limit, dlq.ErrUnwritable, err)
		}
		return t, err
	}
	t.limit = need
	q.topics.Set(topic, t)
	return t, nil
}

// topic returns what the DLQ knows of topic, creating it on first use.
func (q *DLQ) topic(ctx context.Context, topic, source string) (dlqTopic, error) {
	return q.topics.Do(ctx, topic, func(ctx context.Context) (dlqTopic, error) {
		src, err := q.limits.Do(ctx, source, func(ctx context.Context) (int, error) {
			return topicLimit(ctx, q.client, source)
		})
		if err != nil {
			return dlqTopic{}, err
		}
		return q.ensureTopic(ctx, topic, source, dlqLimit(src))
	})
}

// ensureTopic creates topic with max.message.bytes limit, or reads the
// settings of the existing topic, and marks it as a DLQ when it is empty.
func (q *DLQ) ensureTopic(ctx context.Context, topic, source string, limit int) (dlqTopic, error) {
	t := dlqTopic{limit: limit, partitions: q.cfg.partitions}
	created, err := createTopicWith(ctx, q.client, topic, q.cfg.partitions, q.cfg.replication,
		kafkago.ConfigEntry{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(limit)})
	if err != nil {
		return t, err
	}
	empty := created
	if !created {
		// An existing topic keeps its settings: read them.
		if t.limit, err = topicLimit(ctx, q.client, topic); err != nil {
			return t, err
		}
		starts, ends, err := bounds(ctx, q.client, topic)
		if err != nil {
			return t, err
		}
		t.partitions, empty = len(ends), true
		for p, end := range ends {
			empty = empty && end == starts[p]
		}
	}
	if empty {
		if err := q.mark(ctx, topic, source, t.partitions); err != nil {
			return t, err
		}
	}
	return t, nil
}

// mark writes a MarkerDLQ record into every partition of a new DLQ topic,
// so that an inspector can tell it is one before it holds a dead letter.
func (q *DLQ) mark(ctx context.Context, topic, source string, partitions int) error {
	hs := []kafkago.Header{{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerDLQ)}}
	if q.cfg.shared == "" {
		hs = append(hs, kafkago.Header{Key: dlq.HeaderSource, Value: []byte(source)})
	}
	for p := range partitions {
		if err := produceRecords(ctx, q.client, topic, p, kafkago.Message{Headers: hs, Time: time.Now()}); err != nil {
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
