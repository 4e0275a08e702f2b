package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
)

func init() { factories["kafka"] = newKafkaBroker }

// kafkaBroker is a kfake cluster in a child process, or a real Kafka.
type kafkaBroker struct {
	addrs []string
	where string
	child *child // nil for a real Kafka
	log   *slog.Logger
}

func newKafkaBroker(ctx context.Context, addr string, log *slog.Logger) (Broker, error) {
	b := &kafkaBroker{log: log, where: "external"}
	if addr == "" {
		a, c, err := startChild(ctx, "kafka")
		if err != nil {
			return nil, err
		}
		addr, b.child, b.where = a, c, "child process"
	}
	for _, a := range strings.Split(addr, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			if b.child != nil {
				b.child.Close()
			}
			return nil, fmt.Errorf("%w: --kafka %q is not HOST:PORT", errUsage, a)
		}
		b.addrs = append(b.addrs, a)
	}
	return b, nil
}

// startKfake starts the demo's kfake cluster (in the broker child).
func startKfake() (string, func(), error) {
	addrs, stop, err := kafkatest.New(
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	)
	if err != nil {
		return "", nil, err
	}
	return strings.Join(addrs, ","), stop, nil
}

func (b *kafkaBroker) Name() string  { return "kafka" }
func (b *kafkaBroker) Where() string { return b.where }

func (b *kafkaBroker) Close() error {
	if b.child != nil {
		return b.child.Close()
	}
	return nil
}

func (b *kafkaBroker) Open(ctx context.Context, run string, partitions int) (Topic, error) {
	cl := &kafkago.Client{Addr: kafkago.TCP(b.addrs...), Timeout: 10 * time.Second}
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: run, NumPartitions: partitions, ReplicationFactor: -1,
	}}})
	if err != nil {
		return nil, fmt.Errorf("create topic: %w", err)
	}
	if err := resp.Errors[run]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		return nil, fmt.Errorf("create topic: %w", err)
	}
	q, err := kafka.NewDLQ(b.addrs, run)
	if err != nil {
		return nil, err
	}
	return &kafkaTopic{
		b: b, name: run, dlq: q, parts: partitions,
		admin: cl,
		w: &kafkago.Writer{
			Addr:         kafkago.TCP(b.addrs...),
			Topic:        run,
			Balancer:     &kafkago.Hash{}, // tenant-keyed partitioning; see hashPartition
			RequiredAcks: kafkago.RequireAll,
			BatchTimeout: time.Millisecond,
			BatchSize:    1000,
		},
	}, nil
}

type kafkaTopic struct {
	b     *kafkaBroker
	name  string
	parts int
	w     *kafkago.Writer
	admin *kafkago.Client
	dlq   *kafka.DLQ
}

// PartitionOf is where the Writer's Hash balancer puts tenant's messages.
func (b *kafkaBroker) PartitionOf(tenant string, n int) (int, bool) {
	return hashPartition(tenant, n), true
}

// Lag reads the log end offsets and the group's committed offsets from the
// broker. A partition the group has not committed yet lags by its whole
// log (the source starts from the first offset).
func (t *kafkaTopic) Lag(ctx context.Context, group string) ([]int64, error) {
	reqs := make([]kafkago.OffsetRequest, t.parts)
	ids := make([]int, t.parts)
	for p := range t.parts {
		reqs[p], ids[p] = kafkago.LastOffsetOf(p), p
	}
	ends, err := t.admin.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{t.name: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	com, err := t.admin.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{t.name: ids}})
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	if com.Error != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", com.Error)
	}
	out := make([]int64, t.parts)
	for _, po := range ends.Topics[t.name] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of partition %d: %w", po.Partition, po.Error)
		}
		if po.Partition >= 0 && po.Partition < t.parts {
			out[po.Partition] = po.LastOffset
		}
	}
	for _, c := range com.Topics[t.name] {
		if c.Error != nil {
			return nil, fmt.Errorf("committed offset of partition %d: %w", c.Partition, c.Error)
		}
		if c.Partition >= 0 && c.Partition < t.parts && c.CommittedOffset > 0 {
			out[c.Partition] = max(out[c.Partition]-c.CommittedOffset, 0)
		}
	}
	return out, nil
}

func (t *kafkaTopic) Produce(ctx context.Context, msgs []Msg) error {
	km := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafkago.Message{Key: []byte(m.Tenant), Value: m.Value}
	}
	return t.w.WriteMessages(ctx, km...)
}

func (t *kafkaTopic) Source(group string, _ consumer.TenantFunc, _ bool) (consumer.Source, error) {
	return kafka.NewSource(t.b.addrs, t.name, group,
		kafka.WithLogger(t.b.log),
		kafka.WithHeartbeatInterval(250*time.Millisecond),
		kafka.WithSessionTimeout(kafkaSessionTimeout),
		kafka.WithRebalanceTimeout(5*time.Second),
		kafka.WithJoinBackoff(100*time.Millisecond),
		kafka.WithMaxWait(50*time.Millisecond),
		kafka.WithCommitInterval(250*time.Millisecond),
	)
}

// SpillLog is the group's spill log: a topic per tenant that spills.
func (t *kafkaTopic) SpillLog(group string) (consumer.SpillLog, error) {
	return kafka.NewSpillLog(t.b.addrs, t.name, group, kafka.SpillLogger(t.b.log))
}

// kafkaSessionTimeout is the demo consumer's group session timeout.
const kafkaSessionTimeout = 5 * time.Second

// RedeliveryAfter: a member that did not leave the group cleanly keeps its
// partitions for the session timeout.
func (t *kafkaTopic) RedeliveryAfter() time.Duration { return kafkaSessionTimeout }

func (t *kafkaTopic) Tenant() consumer.TenantFunc { return consumer.FromKey() }
func (t *kafkaTopic) Sink() dlq.Sink              { return t.dlq }

func (t *kafkaTopic) DeadLetters(ctx context.Context, tenants []string) ([]dlq.Record, error) {
	sums, err := t.dlq.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	want := make(map[string]bool, len(tenants))
	for _, k := range tenants {
		want[k] = true
	}
	var out []dlq.Record
	for _, s := range sums {
		if !want[s.Tenant] {
			continue
		}
		recs, err := t.dlq.Peek(ctx, s.Tenant, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	return out, nil
}

func (t *kafkaTopic) Close() error {
	return errors.Join(t.w.Close(), t.dlq.Close())
}
