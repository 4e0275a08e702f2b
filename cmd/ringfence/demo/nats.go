package demo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/natstest"
)

func init() { factories["nats"] = newNATSBroker }

// natsMaxAckPending is the demo consumer's MaxAckPending; the Source's
// per-tenant limit defaults to a 16th of it.
const natsMaxAckPending = 4096

// natsAckWait is the demo consumer's AckWait: a message a stopped consumer
// held is redelivered after it.
const natsAckWait = 30 * time.Second

// natsDurable is the demo consumer's durable name (one per run's stream).
const natsDurable = "demo"

// natsBroker is a nats-server with JetStream in a child process (file
// store in a temporary directory), or a real server at a URL.
type natsBroker struct {
	child *child // nil for a real server
	where string
	nc    *natsgo.Conn
	js    jetstream.JetStream
	// pnc and pjs are the producers' connection: the demo's traffic stands
	// for other services, whose publishes do not queue on the consumer's
	// connection behind its acks, spill appends and spill reads (the
	// server reads one connection's messages in order).
	pnc *natsgo.Conn
	pjs jetstream.JetStream
	log *slog.Logger
}

func newNATSBroker(ctx context.Context, url string, log *slog.Logger) (Broker, error) {
	b := &natsBroker{log: log, where: "external"}
	if url == "" {
		u, c, err := startChild(ctx, "nats")
		if err != nil {
			return nil, err
		}
		url, b.child, b.where = u, c, "child process"
	} else if !strings.Contains(url, "://") && !strings.Contains(url, ":") {
		return nil, fmt.Errorf("%w: --nats %q is not a URL", errUsage, url)
	}
	nc, err := natsgo.Connect(url, natsgo.Name("ringfence-demo"), natsgo.Timeout(5*time.Second))
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	b.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.js = js
	pnc, err := natsgo.Connect(url, natsgo.Name("ringfence-demo-producers"), natsgo.Timeout(5*time.Second))
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	b.pnc = pnc
	if b.pjs, err = jetstream.New(pnc); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// startNATSServer starts the demo's nats-server (in the broker child), with
// JetStream on a file store in a temporary directory that its stop removes.
func startNATSServer() (string, func(), error) { return natstest.New() }

func (b *natsBroker) Name() string { return "nats" }

func (b *natsBroker) Where() string { return b.where }

func (b *natsBroker) Close() error {
	if b.nc != nil {
		b.nc.Close()
	}
	if b.pnc != nil {
		b.pnc.Close()
	}
	if b.child != nil {
		return b.child.Close()
	}
	return nil
}

// Open creates a stream taking "<run>.orders.<tenant>" (one engine
// partition: JetStream has none), a durable pull consumer and a DLQ stream
// of the run's own.
func (b *natsBroker) Open(ctx context.Context, run string, _ int) (Topic, error) {
	stream := strings.ToUpper(strings.ReplaceAll(run, "-", "_"))
	subj := strings.ReplaceAll(run, "-", "_")
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subj + ".orders.>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		return nil, fmt.Errorf("create stream %s: %w", stream, err)
	}
	if _, err := b.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       natsDurable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       natsAckWait,
		MaxAckPending: natsMaxAckPending,
		MaxDeliver:    -1,
	}); err != nil {
		return nil, fmt.Errorf("create consumer on %s: %w", stream, err)
	}
	q, err := rfnats.NewDLQ(ctx, b.js, rfnats.WithDLQStream(stream+"_DLQ"), rfnats.WithDLQPrefix(subj+".dlq"))
	if err != nil {
		return nil, err
	}
	return &natsTopic{b: b, stream: stream, subj: subj, q: q}, nil
}

type natsTopic struct {
	b      *natsBroker
	stream string
	subj   string
	q      *rfnats.DLQ
}

// PartitionOf: JetStream has no partitions; every tenant shares the one
// stream and consumer.
func (b *natsBroker) PartitionOf(string, int) (int, bool) { return 0, false }

// Lag is the durable consumer's NumPending (not yet delivered) plus
// NumAckPending (delivered, not acknowledged), from ConsumerInfo: what a
// restart would still have to handle, as the Kafka figure is.
func (t *natsTopic) Lag(ctx context.Context, _ string) ([]int64, error) {
	c, err := t.b.js.Consumer(ctx, t.stream, natsDurable)
	if err != nil {
		return nil, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	return []int64{int64(info.NumPending) + int64(info.NumAckPending)}, nil
}

func (t *natsTopic) Produce(ctx context.Context, msgs []Msg) error {
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		// Tenant ids of the demo are valid subject tokens.
		f, err := t.b.pjs.PublishAsync(t.subj+".orders."+m.Tenant, m.Value)
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (t *natsTopic) Source(_ string, _ consumer.TenantFunc, _ bool) (consumer.Source, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rfnats.Open(ctx, t.b.nc, t.stream, natsDurable, rfnats.WithLogger(t.b.log))
}

// SpillLog opens the spill stream of the run's durable, where the engine
// spills a tenant that cannot make progress.
func (t *natsTopic) SpillLog(_ string) (consumer.SpillLog, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rfnats.NewSpillLog(ctx, t.b.js, t.stream, natsDurable, rfnats.WithSpillLogger(t.b.log))
}

// RedeliveryAfter is the AckWait.
func (t *natsTopic) RedeliveryAfter() time.Duration { return natsAckWait }

// Tenant takes the tenant from the last subject token.
func (t *natsTopic) Tenant() consumer.TenantFunc { return rfnats.FromSubjectToken(-1) }
func (t *natsTopic) Sink() dlq.Sink              { return t.q }

func (t *natsTopic) DeadLetters(ctx context.Context, tenants []string) ([]dlq.Record, error) {
	var out []dlq.Record
	for _, k := range tenants {
		recs, err := t.q.Peek(ctx, k, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	return out, nil
}

// Close keeps the streams: the child server's store is removed with it, and on a real server they can be inspected with `ringfence dlq`.
func (t *natsTopic) Close() error { return nil }
