package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/consumer/consumertest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// Example runs the engine on the in-memory broker: tenant "acme" handles
// its orders, tenant "globex" sends one order that can never succeed, which
// lands in globex's own dead-letter queue.
func ExampleNew() {
	h := consumertest.NewMemHarness(1)
	h.Produce(nil,
		consumertest.Msg{Tenant: "acme", Value: []byte("order-1")},
		consumertest.Msg{Tenant: "globex", Value: []byte("order-2")},
		consumertest.Msg{Tenant: "acme", Value: []byte("order-3")},
	)

	p := policy.Default()
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 3}
	c, err := consumer.New(consumer.Config{
		Scope:  scope.New(p, scope.Options[string]{MaxKeys: 1024}),
		Tenant: consumer.FromHeader(consumertest.TenantHeader),
		DLQ:    h.S,
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "order-2" {
				return policy.Permanent(errors.New("unknown currency"))
			}
			return nil
		}),
		Concurrency: 1,
	})
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx, h.NewSource(nil)) }()
	for c.Stats().Handled+c.Stats().DeadLettered < 3 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done

	s := c.Stats()
	fmt.Println("handled:", s.Handled, "dead-lettered:", s.DeadLettered)
	for _, r := range h.S.Records("globex", false) {
		fmt.Printf("globex DLQ: %s (%s: %s)\n", r.Value, r.Reason, r.Error)
	}
	fmt.Println("committed:", h.B.Committed(h.Group, 0))
	// Output:
	// handled: 2 dead-lettered: 1
	// globex DLQ: order-2 (permanent: unknown currency)
	// committed: 3
}
