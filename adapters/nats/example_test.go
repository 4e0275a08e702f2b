package nats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
)

// Wiring a durable JetStream consumer to the engine: the tenant is the
// second subject token ("orders.<tenant>.created"), dead letters go to the
// default DLQ stream. (Not run: it needs a NATS server.)
func ExampleOpen() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	tenant := rfnats.FromSubjectToken(1)
	src, err := rfnats.Open(ctx, nc, "ORDERS", "billing", tenant) // errors.Is(err, rfnats.ErrCoreNATS) without JetStream
	if err != nil {
		log.Fatal(err)
	}
	dead, err := rfnats.NewDLQ(ctx, src.JetStream())
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error { return nil }),
		Tenant:  tenant,
		DLQ:     dead,
		Group:   "billing",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
