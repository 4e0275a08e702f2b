package main

import (
	"context"
	"fmt"
	"io"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/examplerun"
	"github.com/ringfence/ringfence/internal/kafkatest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() { examplerun.Main("shaping", run) }

// premium is the tenants that pay for long-running work.
var premium = map[string]bool{"acme": true}

func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	brokers, stopKafka, err := kafkatest.New(
		kfake.SeedTopics(1, "jobs"),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	)
	if err != nil {
		return err
	}
	defer stopKafka()

	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: "jobs", BatchTimeout: time.Millisecond}
	defer w.Close()
	var msgs []kafkago.Message
	for _, t := range []string{"acme", "globex"} {
		msgs = append(msgs,
			kafkago.Message{Key: []byte(t), Value: []byte("monthly-report")},
			kafkago.Message{Key: []byte(t), Value: []byte("ping")})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return err
	}

	// Everyone: 100ms per attempt, 2 attempts. Premium: 1s.
	template := policy.Default()
	template.Deadline = 100 * time.Millisecond
	template.Retry = policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 10 * time.Millisecond}}
	tenants := scope.New(template, scope.Options[string]{
		// Shape runs once per tenant, when it is first seen; its result is
		// cached in the tenant's guard.
		Shape: func(tenant string) policy.Policy {
			p := template
			if premium[tenant] {
				p.Deadline = time.Second
			}
			return p
		},
	})

	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		if string(m.Value) != "monthly-report" {
			return nil
		}
		select { // building the report takes 300ms
		case <-time.After(300 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})

	src, err := kafka.NewSource(brokers, "jobs", "reports", kafka.WithMaxWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	q, err := kafka.NewDLQ(brokers, "jobs")
	if err != nil {
		return err
	}
	defer q.Close()
	c, err := consumer.New(consumer.Config{Scope: tenants, Handler: handler, Tenant: consumer.FromKey(), DLQ: q, Group: src.Group()})
	if err != nil {
		return err
	}
	if err := examplerun.UntilSettled(ctx, c, src, len(msgs)); err != nil {
		return err
	}

	for _, t := range []string{"acme", "globex"} {
		ts, _ := c.Tenant(t)
		class := "standard"
		if premium[t] {
			class = "premium"
		}
		fmt.Fprintf(out, "%-7s %-8s deadline %-6v handled %d  dead-lettered %d\n",
			t, class, tenants.For(t).Policy().Deadline, ts.Handled, ts.DeadLettered)
		recs, err := q.Peek(ctx, t, 0)
		if err != nil {
			return err
		}
		for _, r := range recs {
			fmt.Fprintf(out, "        DLQ: %s (%s: %s)\n", r.Value, r.Reason, r.Error)
		}
	}
	return nil
}
