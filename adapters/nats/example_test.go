package nats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
)

// Wiring a durable JetStream consumer to the engine: the tenant is the
// second subject token ("orders.<tenant>.created"), given once, to the
// engine; dead letters go to the default DLQ stream; a tenant that cannot
// make progress spills to the consumer's spill stream, so the others keep
// flowing. (Not run: it needs a NATS server.)
func ExampleOpen() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	src, err := rfnats.Open(ctx, nc, "ORDERS", "billing") // errors.Is(err, rfnats.ErrCoreNATS) without JetStream
	if err != nil {
		log.Fatal(err)
	}
	dead, err := rfnats.NewDLQ(ctx, src.JetStream())
	if err != nil {
		log.Fatal(err)
	}
	spill, err := src.SpillLog(ctx) // RINGFENCE_SPILL_ORDERS_billing
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error { return nil }),
		Tenant:  rfnats.FromSubjectToken(1),
		DLQ:     dead,
		Spill:   spill,
		Group:   "billing",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}

// Scaling out with a static partitioned consumer group: the stream stores
// "orders.<tenant>.created" as "<partition>.orders.<tenant>.created", the
// partition a hash of the tenant token; the group "billing" spreads 8
// partitions over members m1 and m2. Each process runs as one member; a
// second process with the same member name is its hot standby. (Not run:
// it needs a NATS server.)
func ExampleWithConsumerGroup() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// Once, by whoever sets the system up:
	tr, err := rfnats.PartitionTransform("orders.*.*", 8, 1)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*.*"}, SubjectTransform: &tr}); err != nil {
		log.Fatal(err)
	}
	if err := rfnats.CreateConsumerGroup(ctx, js, "ORDERS", "billing", "m1", "m2"); err != nil {
		log.Fatal(err)
	}
	// In each process:
	src, err := rfnats.Open(ctx, nc, "ORDERS", "", rfnats.WithConsumerGroup("billing", "m1"))
	if err != nil {
		log.Fatal(err)
	}
	dead, err := rfnats.NewDLQ(ctx, src.JetStream())
	if err != nil {
		log.Fatal(err)
	}
	spill, err := src.SpillLog(ctx) // the group's: RINGFENCE_SPILL_ORDERS_billing
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Handler: consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) error { return nil }),
		Tenant:  rfnats.FromSubjectToken(1), // Message.Topic has no partition token
		DLQ:     dead,
		Spill:   spill,
		Group:   "billing",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
