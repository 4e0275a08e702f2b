package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	rfkafka "github.com/ringfence/ringfence/adapters/kafka"
	"github.com/ringfence/ringfence/dlq"
)

// openInspector connects to the broker the flags name. It checks that the
// broker answers first, so an unreachable broker fails fast with one line.
func openInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	switch {
	case f.kafka != "":
		if err := reachable(ctx, f.kafka); err != nil {
			return nil, nil, fmt.Errorf("kafka broker %s unreachable: %w", f.kafka, err)
		}
		in, err := rfkafka.NewInspector([]string{f.kafka}, f.topic)
		if err != nil {
			return nil, nil, err
		}
		return in, func() { in.Close() }, nil
	case f.nats != "":
		return openNATSInspector(ctx, f)
	}
	return nil, nil, errors.New("no broker given")
}

// reachable dials addr once, bounded by ctx and 3s.
func reachable(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: 3 * time.Second}
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
