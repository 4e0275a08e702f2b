package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/examplerun"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() { examplerun.Main("nats-subject", run) }

const perTenant = 20

func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// An in-process NATS server with JetStream.
	nc, js, stopNATS, err := natstest.NewJetStream()
	if err != nil {
		return err
	}
	defer stopNATS()

	// A stream of orders and a durable pull consumer with explicit acks.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*.created"}}); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1000,
	}); err != nil {
		return err
	}
	tenants := []string{"acme", "globex", "initech"}
	for i := 1; i <= perTenant; i++ {
		for _, t := range tenants {
			if _, err := js.Publish(ctx, "orders."+t+".created", fmt.Appendf(nil, "order-%d", i)); err != nil {
				return err
			}
		}
	}

	// globex's dependency is down until the others are done (at most 5s).
	var othersDone atomic.Int64
	var othersFirst atomic.Bool // others were all done when globex's API came back
	var mu sync.Mutex
	order := map[string][]string{}
	giveUp := time.Now().Add(5 * time.Second)
	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		tenant, _ := rfnats.FromSubjectToken(1)(m)
		if tenant == "globex" && othersDone.Load() < 2*perTenant && time.Now().Before(giveUp) {
			return errors.New("globex's warehouse API is down")
		}
		mu.Lock()
		defer mu.Unlock()
		order[tenant] = append(order[tenant], string(m.Value))
		if tenant != "globex" {
			othersDone.Add(1)
		} else if len(order[tenant]) == 1 {
			othersFirst.Store(othersDone.Load() == 2*perTenant)
		}
		return nil
	})

	// The tenant is token 1 of the subject: orders.<tenant>.created.
	tenantOf := rfnats.FromSubjectToken(1)
	src, err := rfnats.Open(ctx, nc, "ORDERS", "billing")
	if err != nil {
		return err
	}
	q, err := rfnats.NewDLQ(ctx, js) // stream RINGFENCE_DLQ, subjects ringfence.dlq.<tenant>
	if err != nil {
		return err
	}
	// A tenant that cannot make progress for long spills to its subject in
	// stream RINGFENCE_SPILL_ORDERS_billing, so the others keep flowing.
	spill, err := src.SpillLog(ctx)
	if err != nil {
		return err
	}
	template := policy.Policy{
		Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: 100 * time.Millisecond, MaxOpenTimeout: 200 * time.Millisecond},
		Retry:   policy.Retry{MaxAttempts: 2, Backoff: policy.Backoff{Kind: policy.Constant, Base: 5 * time.Millisecond}},
	}
	c, err := consumer.New(consumer.Config{
		Scope:   scope.New(template, scope.Options[string]{}),
		Handler: handler,
		Tenant:  tenantOf,
		DLQ:     q,
		Spill:   spill,
		Group:   "billing",
	})
	if err != nil {
		return err
	}
	if err := examplerun.UntilSettled(ctx, c, src, len(tenants)*perTenant); err != nil {
		return err
	}

	for _, t := range tenants {
		ts, _ := c.Tenant(t)
		inOrder := true
		for i, v := range order[t] {
			inOrder = inOrder && v == fmt.Sprintf("order-%d", i+1)
		}
		fmt.Fprintf(out, "%-8s handled %2d in order: %-5v dead-lettered %d\n", t, ts.Handled, inOrder, ts.DeadLettered)
	}
	fmt.Fprintf(out, "acme and initech finished while globex's API was down: %v\n", othersFirst.Load())
	return nil
}
