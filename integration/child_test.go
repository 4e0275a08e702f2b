package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	kafkaad "github.com/ringfence/ringfence/adapters/kafka"
	natsad "github.com/ringfence/ringfence/adapters/nats"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

// childEnv carries a JSON childConfig to a consumer child process.
const childEnv = "RINGFENCE_IT_CHILD"

// childLifetime bounds a child that nobody stops.
const childLifetime = 5 * time.Minute

// childConfig configures one consumer process.
type childConfig struct {
	Name    string // process label in the handled file
	Broker  string // "kafka" or "nats"
	Addr    string // source broker host:port
	DLQAddr string // DLQ broker host:port
	Topic   string // Kafka topic or NATS stream
	Group   string // Kafka group or NATS durable
	Handled string // file the idempotent sink appends to

	FaultTenant   string // this tenant's dependency is down...
	FaultWindowMs int    // ...for this long after its first attempt
	WorkMs        int    // simulated handler work per message
	// NATSTenantLimit, if set, is the engine's MaxParkedPerTenant for the
	// NATS source (a parked tenant spills to the spill stream past it).
	NATSTenantLimit int
}

// testPolicy trips fast and probes fast, so scenarios finish in seconds.
func testPolicy() policy.Policy {
	p := policy.Default()
	p.Breaker = &policy.Breaker{ConsecutiveFailures: 3, OpenTimeout: 200 * time.Millisecond, MaxOpenTimeout: time.Second}
	p.Retry = policy.Retry{MaxAttempts: 3, Backoff: policy.Backoff{Kind: policy.Exponential, Base: 10 * time.Millisecond, Max: 100 * time.Millisecond}}
	return p
}

// payload is the value of every scenario message.
func payload(id string, poison bool) []byte {
	if poison {
		return []byte("id=" + id + ";poison")
	}
	return []byte("id=" + id)
}

// parsePayload returns the id in a scenario message value.
func parsePayload(v []byte) (id string, poison bool, ok bool) {
	s, found := strings.CutPrefix(string(v), "id=")
	if !found {
		return "", false, false
	}
	id, rest, _ := strings.Cut(s, ";")
	return id, rest == "poison", id != ""
}

// handledSink appends "id tenant unixnano process" lines to a file. Each
// line is one write on an O_APPEND file, so a SIGKILL leaves whole lines and
// several processes may share the file.
type handledSink struct {
	mu   sync.Mutex
	f    *os.File
	name string
}

func (s *handledSink) record(id, tenant string) error {
	line := fmt.Sprintf("%s %s %d %s\n", id, tenant, time.Now().UnixNano(), s.name)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.f.WriteString(line)
	return err
}

var errDependencyDown = errors.New("integration: tenant dependency down")

// scenarioHandler fails poison messages for good, fails the fault tenant
// transiently during its window, and otherwise works WorkMs and records the
// message as handled.
func scenarioHandler(cfg childConfig, sink *handledSink) consumer.HandlerFunc {
	var faultStart sync.Once
	var faultUntil time.Time
	return func(ctx context.Context, m *consumer.Message) error {
		id, poison, ok := parsePayload(m.Value)
		if !ok {
			return policy.Permanent(fmt.Errorf("integration: not a scenario message: %q", m.Value))
		}
		if poison {
			return policy.Permanent(errors.New("integration: poison message"))
		}
		tenant := tenantOf(cfg.Broker, m)
		if cfg.FaultTenant != "" && tenant == cfg.FaultTenant {
			faultStart.Do(func() { faultUntil = time.Now().Add(time.Duration(cfg.FaultWindowMs) * time.Millisecond) })
			if time.Now().Before(faultUntil) {
				return errDependencyDown
			}
		}
		if cfg.WorkMs > 0 {
			t := time.NewTimer(time.Duration(cfg.WorkMs) * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		return sink.record(id, tenant)
	}
}

func tenantOf(broker string, m *consumer.Message) string {
	if broker == "kafka" {
		return string(m.Key)
	}
	i := strings.LastIndexByte(m.Topic, '.')
	return m.Topic[i+1:]
}

// childMain runs one consumer until SIGTERM/SIGINT (a drain) or SIGKILL.
func childMain(raw string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("proc", cfg.Name)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, childLifetime)
	defer cancel()
	if err := runChild(ctx, cfg, log); err != nil {
		log.Error("child consumer failed", "err", err)
		return 1
	}
	log.Info("child consumer stopped")
	return 0
}

func runChild(ctx context.Context, cfg childConfig, log *slog.Logger) error {
	f, err := os.OpenFile(cfg.Handled, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	sink := &handledSink{f: f, name: cfg.Name}
	ccfg := consumer.Config{
		Scope:       scope.New(testPolicy(), scope.Options[string]{}),
		Handler:     scenarioHandler(cfg, sink),
		Group:       cfg.Group,
		Concurrency: 16,
		Logger:      log,
	}
	var src consumer.Source
	switch cfg.Broker {
	case "kafka":
		s, err := kafkaad.NewSource([]string{cfg.Addr}, cfg.Topic, cfg.Group,
			kafkaad.WithHeartbeatInterval(200*time.Millisecond),
			kafkaad.WithSessionTimeout(3*time.Second),
			kafkaad.WithRebalanceTimeout(5*time.Second),
			kafkaad.WithJoinBackoff(200*time.Millisecond),
			kafkaad.WithMaxWait(100*time.Millisecond),
			kafkaad.WithCommitInterval(100*time.Millisecond),
			kafkaad.WithLogger(log))
		if err != nil {
			return err
		}
		dlqSink, err := kafkaad.NewSink([]string{cfg.DLQAddr})
		if err != nil {
			return err
		}
		defer dlqSink.Close()
		src, ccfg.Tenant, ccfg.DLQ = s, consumer.FromKey(), dlqSink
	case "nats":
		nc, err := nats.Connect(cfg.Addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			return err
		}
		defer nc.Close()
		dnc := nc
		if cfg.DLQAddr != cfg.Addr {
			if dnc, err = nats.Connect(cfg.DLQAddr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
				return err
			}
			defer dnc.Close()
		}
		djs, err := jetstream.New(dnc)
		if err != nil {
			return err
		}
		q, err := natsad.NewDLQ(ctx, djs)
		if err != nil {
			return err
		}
		ccfg.Tenant = natsad.FromSubjectToken(-1)
		if cfg.NATSTenantLimit > 0 {
			ccfg.MaxParkedPerTenant = cfg.NATSTenantLimit
		}
		s, err := natsad.Open(ctx, nc, cfg.Topic, cfg.Group, natsad.WithLogger(log))
		if err != nil {
			return err
		}
		spill, err := s.SpillLog(ctx)
		if err != nil {
			return err
		}
		src, ccfg.DLQ, ccfg.Spill = s, q, spill
	default:
		return fmt.Errorf("unknown broker %q", cfg.Broker)
	}
	c, err := consumer.New(ccfg)
	if err != nil {
		return err
	}
	log.Info("child consumer running", "broker", cfg.Broker, "topic", cfg.Topic, "group", cfg.Group)
	if err := c.Run(ctx, src); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st := c.Stats()
	log.Info("child consumer stats", "handled", st.Handled, "failed", st.Failed, "deadlettered", st.DeadLettered, "parked", st.Parked)
	return nil
}
