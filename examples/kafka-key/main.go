package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/examplerun"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() { examplerun.Main("kafka-key", run) }

var errProviderDown = errors.New("payment provider unavailable")

func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// An in-process Kafka with a 3-partition topic.
	brokers, stopKafka, err := kafkatest.New(
		kfake.SeedTopics(3, "orders"),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	)
	if err != nil {
		return err
	}
	defer stopKafka()

	// Ten orders per tenant, keyed by tenant: Kafka keeps each tenant on
	// one partition, in order.
	tenants := []string{"acme", "globex", "initech"}
	var msgs []kafkago.Message
	for i := 1; i <= 10; i++ {
		for _, t := range tenants {
			v := fmt.Sprintf("order-%d", i)
			if t == "initech" && i == 4 {
				v = "malformed"
			}
			msgs = append(msgs, kafkago.Message{Key: []byte(t), Value: []byte(v)})
		}
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: "orders", Balancer: &kafkago.Hash{}, BatchTimeout: time.Millisecond}
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return err
	}

	// globex's payment provider is down for the first second.
	start := time.Now()
	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		switch {
		case string(m.Value) == "malformed":
			return policy.Permanent(errors.New("cannot parse order"))
		case string(m.Key) == "globex" && time.Since(start) < time.Second:
			return errProviderDown
		}
		return nil // charge the order
	})

	// Every tenant gets its own breaker: 3 failures in a row open it for
	// 200ms; each message gets 2 attempts.
	template := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: 200 * time.Millisecond, MaxOpenTimeout: 400 * time.Millisecond},
		Retry:   policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 10 * time.Millisecond}},
	}
	var parked atomic.Int64
	src, err := kafka.NewSource(brokers, "orders", "billing",
		kafka.WithMaxWait(100*time.Millisecond), kafka.WithHeartbeatInterval(200*time.Millisecond))
	if err != nil {
		return err
	}
	q, err := kafka.NewDLQ(brokers, "orders") // orders.dlq.<tenant>, created on first use
	if err != nil {
		return err
	}
	defer q.Close()
	c, err := consumer.New(consumer.Config{
		Scope:   scope.New(template, scope.Options[string]{}),
		Handler: handler,
		Tenant:  consumer.FromKey(),
		DLQ:     q,
		Group:   src.Group(),
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventParked {
				parked.Add(1)
			}
		},
	})
	if err != nil {
		return err
	}

	if err := examplerun.UntilSettled(ctx, c, src, len(msgs)); err != nil {
		return err
	}

	for _, t := range tenants {
		ts, _ := c.Tenant(t)
		fmt.Fprintf(out, "%-8s handled %2d  dead-lettered %d\n", t, ts.Handled, ts.DeadLettered)
	}
	fmt.Fprintf(out, "globex parked while its provider was down: %v\n", parked.Load() > 0)

	// Read the dead letters back from Kafka.
	sums, err := q.Tenants(ctx)
	if err != nil {
		return err
	}
	slices.SortFunc(sums, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	for _, s := range sums {
		fmt.Fprintf(out, "DLQ %s: %d record(s), reason %s: %s\n", dlq.KafkaTopic("orders", s.Tenant), s.Count, s.Reason, s.LastError)
	}
	return nil
}
