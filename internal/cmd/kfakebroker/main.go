package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if err := run(); err != nil {
		slog.Error("kfakebroker", "err", err)
		os.Exit(1)
	}
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run() error {
	listen := env("KFAKE_LISTEN", "0.0.0.0:9092")
	advertise := env("KFAKE_ADVERTISE", "127.0.0.1:9092")
	dataDir := env("KFAKE_DATA_DIR", "/data")
	parts, err := strconv.Atoi(env("KFAKE_PARTITIONS", "3"))
	if err != nil || parts < 1 {
		return fmt.Errorf("KFAKE_PARTITIONS: want a positive integer, got %q", os.Getenv("KFAKE_PARTITIONS"))
	}
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return fmt.Errorf("KFAKE_ADVERTISE: %w", err)
	}
	level, err := parseLevel(env("KFAKE_LOG", "warn"))
	if err != nil {
		return err
	}

	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.DataDir(dataDir),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(parts),
		// Test-friendly group settings: short sessions allowed, and no
		// initial rebalance delay, so a killed or joining consumer is
		// noticed in seconds.
		kfake.GroupMinSessionTimeout(500*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
		kfake.WithLogger(kfake.BasicLogger(os.Stderr, level)),
		// kfake asks for 127.0.0.1:<port>; we bind where the container's
		// port mapping reaches, and report the advertised address as ours.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			ln, err := net.Listen(network, listen)
			if err != nil {
				return nil, err
			}
			return advertised{Listener: ln, addr: adv}, nil
		}),
	)
	if err != nil {
		return err
	}
	slog.Info("kfakebroker ready", "listen", listen, "advertise", advertise, "data", dataDir)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	slog.Info("kfakebroker stopping", "signal", s.String())
	c.Close() // persists state to dataDir before returning
	slog.Info("kfakebroker stopped")
	return nil
}

// advertised is a listener whose Addr reports the address clients must dial.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

func parseLevel(s string) (kfake.LogLevel, error) {
	switch strings.ToLower(s) {
	case "none":
		return kfake.LogLevelNone, nil
	case "error":
		return kfake.LogLevelError, nil
	case "warn":
		return kfake.LogLevelWarn, nil
	case "info":
		return kfake.LogLevelInfo, nil
	case "debug":
		return kfake.LogLevelDebug, nil
	}
	return 0, fmt.Errorf("KFAKE_LOG: unknown level %q", s)
}
