package kafka_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/consumer"
)

// Wiring a Kafka consumer group through the engine, with a DLQ topic and a
// spill topic per tenant. (Compiled, not run: it needs a broker.)
func Example() {
	brokers := []string{"127.0.0.1:9092"}
	src, err := kafka.NewSource(brokers, "orders", "billing")
	if err != nil {
		log.Fatal(err)
	}
	dead, err := kafka.NewDLQ(brokers, "orders") // orders.dlq.<tenant>, created on first use
	if err != nil {
		log.Fatal(err)
	}
	defer dead.Close()
	// orders.spill.<tenant>, created on first use; cursors in the group
	// billing.ringfence-spill.
	spill, err := kafka.NewSpillLog(brokers, "orders", "billing")
	if err != nil {
		log.Fatal(err)
	}
	defer spill.Close()
	c, err := consumer.New(consumer.Config{
		Tenant: consumer.FromHeader("tenant"),
		DLQ:    dead,
		Spill:  spill,
		Group:  src.Group(),
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error {
			return nil // handle the order
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
