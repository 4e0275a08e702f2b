package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/kafkatest"
)

func init() { factories["kafka"] = newKafkaBroker }

// kafkaBroker is an in-process kfake cluster, or a real Kafka at addr.
type kafkaBroker struct {
	addrs []string
	stop  func()
	log   *slog.Logger
}

func newKafkaBroker(ctx context.Context, addr string, log *slog.Logger) (Broker, error) {
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%w: --kafka %q is not HOST:PORT", errUsage, addr)
		}
		return &kafkaBroker{addrs: []string{addr}, stop: func() {}, log: log}, nil
	}
	addrs, stop, err := kafkatest.New(
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	)
	if err != nil {
		return nil, err
	}
	return &kafkaBroker{addrs: addrs, stop: stop, log: log}, nil
}

func (b *kafkaBroker) Name() string { return "kafka" }

func (b *kafkaBroker) Close() error {
	b.stop()
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
	sink, err := kafka.NewSink(b.addrs)
	if err != nil {
		return nil, err
	}
	insp, err := kafka.NewInspector(b.addrs, run)
	if err != nil {
		sink.Close()
		return nil, err
	}
	return &kafkaTopic{
		b: b, name: run, sink: sink, insp: insp,
		w: &kafkago.Writer{
			Addr:         kafkago.TCP(b.addrs...),
			Topic:        run,
			Balancer:     &kafkago.Hash{}, // tenant-keyed partitioning
			RequiredAcks: kafkago.RequireAll,
			BatchTimeout: time.Millisecond,
			BatchSize:    1000,
		},
	}, nil
}

type kafkaTopic struct {
	b    *kafkaBroker
	name string
	w    *kafkago.Writer
	sink *kafka.Sink
	insp *kafka.Inspector
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
		kafka.WithSessionTimeout(5*time.Second),
		kafka.WithRebalanceTimeout(5*time.Second),
		kafka.WithJoinBackoff(100*time.Millisecond),
		kafka.WithMaxWait(50*time.Millisecond),
		kafka.WithCommitInterval(250*time.Millisecond),
	)
}

func (t *kafkaTopic) Tenant() consumer.TenantFunc { return consumer.FromKey() }
func (t *kafkaTopic) Sink() dlq.Sink              { return t.sink }

func (t *kafkaTopic) DeadLetters(ctx context.Context, tenants []string) ([]dlq.Record, error) {
	sums, err := t.insp.Tenants(ctx)
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
		recs, err := t.insp.Peek(ctx, s.Tenant, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	return out, nil
}

func (t *kafkaTopic) Close() error {
	return errors.Join(t.w.Close(), t.sink.Close(), t.insp.Close())
}
