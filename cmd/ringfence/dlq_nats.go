package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/ringfence/ringfence/dlq"
)

func openNATSInspector(ctx context.Context, f *dlqFlags) (dlq.Inspector, func(), error) {
	addr, err := natsAddr(f.nats)
	if err != nil {
		return nil, nil, err
	}
	if err := reachable(ctx, addr); err != nil {
		return nil, nil, fmt.Errorf("nats server %s unreachable: %w", f.nats, err)
	}
	return nil, nil, errors.New("the NATS inspector is not wired yet")
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
