package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	kafkago "github.com/segmentio/kafka-go"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/dlq"
)

// openInspector connects to the broker the flags name. It first checks
// that the broker answers (within handshakeTimeout, whatever --timeout
// says), so an unreachable or silent broker fails fast with one line; then
// that a DLQ exists there for what the flags name.
func openInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	switch {
	case f.kafka != "":
		return openKafkaInspector(ctx, f)
	case f.nats != "":
		return openNATSInspector(ctx, f)
	}
	return nil, nil, errors.New("no broker given")
}

func openKafkaInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	if err := kafkaHandshake(ctx, f.kafka); err != nil {
		return nil, nil, err
	}
	in, err := rfkafka.NewDLQ([]string{f.kafka}, f.topic)
	if err != nil {
		return nil, nil, err
	}
	topics, err := in.Topics(ctx)
	if err != nil {
		in.Close()
		return nil, nil, err
	}
	if len(topics) == 0 {
		in.Close()
		return nil, nil, fmt.Errorf("no DLQ exists for source topic %q on %s (no topic %s.dlq.<tenant>): nothing was dead-lettered from it, or --topic is misspelt", f.topic, f.kafka, f.topic)
	}
	return in, func() { in.Close() }, nil
}

// kafkaHandshake connects to addr and asks for its API versions, within
// handshakeTimeout: a port that accepts but never answers fails here
// instead of taking the whole --timeout.
func kafkaHandshake(ctx context.Context, addr string) error {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	d := kafkago.Dialer{Timeout: handshakeTimeout}
	conn, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("kafka broker %s unreachable: %w", addr, dialCause(err, hctx))
	}
	defer conn.Close()
	if dl, ok := hctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.ApiVersions(); err != nil {
		return fmt.Errorf("kafka broker %s: %w", addr, dialCause(err, hctx))
	}
	return nil
}

// dialCause shortens a dial or handshake error to its cause.
func dialCause(err error, ctx context.Context) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return fmt.Errorf("connected but no answer within %v (is it a Kafka broker?)", handshakeTimeout)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// reachable dials addr once, within handshakeTimeout.
func reachable(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: handshakeTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Err != nil {
			return oe.Err
		}
		return err
	}
	return c.Close()
}
