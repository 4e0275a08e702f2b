package fleet_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/fleet"
)

// An agent beside a consumer: Start loads the group's controls into the
// engine before Run handles anything, then keeps them current and
// publishes the process's status every second.
func ExampleNewAgent() {
	var (
		ctx context.Context     // the service's
		js  jetstream.JetStream // connected
		c   *consumer.Consumer  // from consumer.New
		src consumer.Source     // from the NATS or Kafka adapter
	)
	st, err := fleet.NewNATSStore(ctx, js, "orders", fleet.NATSOptions{Create: true})
	if err != nil {
		log.Fatal(err)
	}
	a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: st, Group: "orders", Source: "nats"})
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Start(ctx); err != nil { // blocks until the control table is applied
		log.Fatal(err)
	}
	defer a.Close() // removes this process's status at once
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
