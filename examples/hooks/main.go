package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "hooks:", err)
		os.Exit(1)
	}
}

// quota is each tenant's messages per second (burst: one second's worth).
var quota = map[string]int{"acme": 5, "globex": 50}

var errOverQuota = errors.New("tenant over its quota")

const perTenant = 15

func run(ctx context.Context, out, logw io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(logw, nil))

	dir, err := os.MkdirTemp("", "hooks-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return err
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(5 * time.Second) {
		return errors.New("nats server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "ingest", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1000,
	}); err != nil {
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
