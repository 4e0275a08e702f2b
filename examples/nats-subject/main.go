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
	order := map[string][]handled{}
	ahead := map[uint64]bool{} // stream sequences handled ahead of a suspect head
	giveUp := time.Now().Add(5 * time.Second)
	handler := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
		tenant, _ := rfnats.FromSubjectToken(1)(m)
		if tenant == "globex" && othersDone.Load() < 2*perTenant && time.Now().Before(giveUp) {
			return errors.New("globex's warehouse API is down")
		}
		mu.Lock()
		defer mu.Unlock()
		order[tenant] = append(order[tenant], handled{seq: uint64(m.Offset), value: string(m.Value)})
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
		// The one reordering the engine makes: when a tenant's head keeps
		// failing, it tries the message behind it, as evidence against the
		// head; if the dependency comes back just then, that message is
		// handled first. The engine says so.
		OnEvent: func(e consumer.Event) {
			if e.Kind == consumer.EventReordered {
				mu.Lock()
				ahead[uint64(e.Offset)] = true
				mu.Unlock()
			}
		},
	})
	if err != nil {
		return err
	}
	if err := examplerun.UntilSettled(ctx, c, src, len(tenants)*perTenant); err != nil {
		return err
	}

	for _, t := range tenants {
		ts, _ := c.Tenant(t)
		mu.Lock()
		inOrder := inProduceOrder(order[t], ahead)
		mu.Unlock()
		fmt.Fprintf(out, "%-8s handled %2d in order: %-5v dead-lettered %d\n", t, ts.Handled, inOrder, ts.DeadLettered)
	}
	fmt.Fprintf(out, "acme and initech finished while globex's API was down: %v\n", othersFirst.Load())
	return nil
}

// handled is a message as the handler saw it: its stream sequence and its
// body ("order-N", N in produce order).
type handled struct {
	seq   uint64
	value string
}

// inProduceOrder reports whether the messages were handled in produce
// order, leaving out those the engine reported handled ahead of their
// tenant's head (EventReordered), and each once.
func inProduceOrder(hs []handled, ahead map[uint64]bool) bool {
	last, seen := 0, map[string]bool{}
	for _, h := range hs {
		if seen[h.value] {
			return false
		}
		seen[h.value] = true
		var n int
		if _, err := fmt.Sscanf(h.value, "order-%d", &n); err != nil {
			return false
		}
		if ahead[h.seq] {
			continue
		}
		if n <= last {
			return false
		}
		last = n
	}
	return len(seen) == perTenant
}
