package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	rfnats "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/dlq"
)

// openNATSInspector connects to the NATS server and opens an existing DLQ
// stream; it never creates one (a typo in --stream must not make a new,
// empty DLQ).
func openNATSInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	addr, err := natsAddr(f.nats)
	if err != nil {
		return nil, nil, err
	}
	if err := reachable(ctx, addr); err != nil {
		return nil, nil, fmt.Errorf("nats server %s unreachable: %w", f.nats, err)
	}
	nc, err := nats.Connect(f.nats, nats.Timeout(3*time.Second), nats.MaxReconnects(0), nats.Name("ringfence dlq"))
	if err != nil {
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
	st, err := js.Stream(ctx, f.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fail(fmt.Errorf("no DLQ stream %q on %s", f.stream, f.nats))
	}
	if err != nil {
		return fail(fmt.Errorf("DLQ stream %q: %w", f.stream, err))
	}
	prefix := f.prefix
	if prefix == "" {
		subjects := st.CachedInfo().Config.Subjects
		if len(subjects) != 1 || !strings.HasSuffix(subjects[0], ".>") {
			return fail(fmt.Errorf("DLQ stream %q has subjects %q; give --subject-prefix", f.stream, subjects))
		}
		prefix = strings.TrimSuffix(subjects[0], ".>")
	}
	q, err := rfnats.NewDLQ(ctx, js, rfnats.WithDLQStream(f.stream), rfnats.WithDLQPrefix(prefix))
	if err != nil {
		return fail(err)
	}
	return q, nc.Close, nil
}

// natsAddr returns host:port of the first server in a NATS URL list.
func natsAddr(s string) (string, error) {
	first := strings.TrimSpace(strings.Split(s, ",")[0])
	if !strings.Contains(first, "://") {
		first = "nats://" + first
	}
	u, err := url.Parse(first)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("bad --nats URL %q", s)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "4222"), nil
	}
	return u.Host, nil
}
