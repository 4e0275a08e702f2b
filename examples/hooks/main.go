package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/internal/examplerun"
	"github.com/ringfence/ringfence/internal/natstest"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() {
	examplerun.Main("hooks", func(ctx context.Context, out io.Writer) error { return run(ctx, out, os.Stderr) })
}

// quota is each tenant's messages per second (burst: one second's worth).
var quota = map[string]int{"acme": 5, "globex": 50}

var errOverQuota = errors.New("tenant over its quota")

const perTenant = 15

func run(ctx context.Context, out, logw io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(logw, nil))

	nc, js, stopNATS, err := natstest.NewJetStream()
	if err != nil {
		return err
	}
	defer stopNATS()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		return err
	}
	// A durable pull consumer: explicit acks are JetStream's default.
	if _, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "ingest"}); err != nil {
		return err
	}
	for i := 1; i <= perTenant; i++ {
		for _, t := range []string{"acme", "globex"} {
			if _, err := js.Publish(ctx, "events."+t, fmt.Appendf(nil, "event-%d", i)); err != nil {
				return err
			}
		}
	}

	template := policy.Default()
	tenants := scope.New(template, scope.Options[string]{
		// Admit knows no tenant, so each tenant's policy gets its own
		// limiter when the tenant is first seen.
		Shape: func(tenant string) policy.Policy {
			p := template
			lim := rate.NewLimiter(rate.Limit(quota[tenant]), quota[tenant])
			p.Admit = func(context.Context) error {
				if !lim.Allow() {
					return errOverQuota
				}
				return nil
			}
			return p
		},
		// Guard events: breaker transitions, retries, refusals.
		OnEvent: func(tenant string, e policy.Event) {
			log.Info("guard", "tenant", tenant, "event", e.Kind, "breaker", e.State)
		},
	})

	q, err := rfnats.NewDLQ(ctx, js)
	if err != nil {
		return err
	}
	finished := map[string]time.Duration{}
	start := time.Now()
	c, err := consumer.New(consumer.Config{
		Scope:  tenants,
		Tenant: rfnats.FromSubjectToken(1),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			return nil // ingest the event
		}),
		DLQ:   q,
		Group: "ingest",
		// Engine events: a lane parked (here: held back by its quota) and
		// resumed, dead letters, paused partitions.
		OnEvent: func(e consumer.Event) {
			log.Info("engine", "tenant", e.Tenant, "event", e.Kind, "wait", e.Delay, "err", e.Err)
		},
	})
	if err != nil {
		return err
	}
	src, err := rfnats.Open(ctx, nc, "EVENTS", "ingest")
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, src) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for len(finished) < len(quota) && ctx.Err() == nil {
		<-tick.C
		for t := range quota {
			if ts, ok := c.Tenant(t); ok && ts.Handled == perTenant {
				if _, seen := finished[t]; !seen {
					finished[t] = time.Since(start)
				}
			}
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, t := range []string{"acme", "globex"} {
		ts, _ := c.Tenant(t)
		fmt.Fprintf(out, "%-7s quota %2d/s  handled %d  dead-lettered %d\n", t, quota[t], ts.Handled, ts.DeadLettered)
	}
	fmt.Fprintf(out, "globex finished before acme: %v\n", finished["globex"] < finished["acme"])
	return nil
}
