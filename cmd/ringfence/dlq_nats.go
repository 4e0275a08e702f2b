package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/dlq"
)

// openNATSInspector connects to the NATS server and opens an existing DLQ
// stream with rfnats.OpenDLQ: it never creates or changes one (a typo in
// --stream must not make a new, empty DLQ), and it refuses a stream that is
// not a ringfence DLQ.
func openNATSInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	addr, err := natsAddr(f.nats)
	if err != nil {
		return nil, nil, err
	}
	if err := reachable(ctx, addr); err != nil {
		return nil, nil, fmt.Errorf("nats server %s unreachable: %w", f.nats, err)
	}
	// nats.Timeout bounds the dial and the INFO/CONNECT handshake.
	nc, err := nats.Connect(f.nats, nats.Timeout(handshakeTimeout), nats.MaxReconnects(0), nats.Name("ringfence dlq"))
	if err != nil {
		var ne net.Error
		if errors.Is(err, nats.ErrTimeout) || errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("connected but no answer within %v (is it a NATS server?)", handshakeTimeout)
		}
		return nil, nil, fmt.Errorf("nats server %s: %w", f.nats, err)
	}
	fail := func(err error) (dlq.Inspector, func(), error) {
		nc.Close()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	opts := []rfnats.DLQOption{rfnats.WithDLQStream(f.stream)}
	if f.prefix != "" {
		opts = append(opts, rfnats.WithDLQPrefix(f.prefix))
	}
	q, err := rfnats.OpenDLQ(ctx, js, opts...)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fail(fmt.Errorf("no DLQ stream %q on %s", f.stream, f.nats))
	case err != nil:
		return fail(err)
	}
	return q, nc.Close, nil
}

// natsAddr returns host:port of the first server in a NATS URL list; a URL
// that does not parse is a usage error.
func natsAddr(s string) (string, error) {
	first := strings.TrimSpace(strings.Split(s, ",")[0])
	if !strings.Contains(first, "://") {
		first = "nats://" + first
	}
	u, err := url.Parse(first)
	if err != nil || u.Hostname() == "" {
		return "", usagef("--nats %q: not a NATS URL (nats://HOST:PORT)", s)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "4222"), nil
	}
	return u.Host, nil
}
