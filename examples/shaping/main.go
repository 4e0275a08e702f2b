package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shaping:", err)
		os.Exit(1)
	}
}

// premium is the tenants that pay for long-running work.
var premium = map[string]bool{"acme": true}

func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(1, "jobs"),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	)
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

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
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, src) }()
	err = waitSettled(ctx, c, len(msgs))
	stop()
	if rerr := <-done; err == nil {
		err = rerr
	}
	if err != nil {
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

// waitSettled polls until n messages were handled or dead-lettered.
func waitSettled(ctx context.Context, c *consumer.Consumer, n int) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		st := c.Stats()
		if int(st.Handled+st.DeadLettered) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages settled: %w", st.Handled+st.DeadLettered, n, ctx.Err())
		case <-t.C:
		}
	}
}
