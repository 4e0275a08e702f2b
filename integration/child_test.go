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
	"github.com/ringfence/ringfence/fleet"
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
	FaultWindowMs int    // ...for this long after its first attempt, or
	FaultFile     string // ...while this file exists (across processes), if set
	WorkMs        int    // simulated handler work per message
	// MaxParkedPerTenant, if set, is the engine's: a parked tenant spills
	// to its spill log past it.
	MaxParkedPerTenant int
	// StuckAfterMs, if set, is the engine's StuckAfter: a tenant whose
	// oldest message holds its partition's commit that long spills.
	StuckAfterMs int
	// Progress, if set, is a file the child rewrites with its progress
	// (a JSON childProgress) every progressEvery.
	Progress string
	// Events, if set, is a file the child appends the engine's spill,
	// reorder and partition events to, one line each (see eventSink).
	Events string
	// TraceDeliveries, with Events, also records there every message the
	// source delivers (see traceDeliveries).
	TraceDeliveries bool
	// Source picks the source implementation (see sourceKinds); "" is the
	// broker's first.
	Source string
	// Member is the consumer group member the process runs (a NATS
	// partitioned group's members are fixed: a restarted process takes its
	// predecessor's place).
	Member string
	// Fleet runs a fleet.Agent beside the consumer on the source broker
	// (group Group, process Name, heartbeat fleetInterval, TTL fleetTTL),
	// started before the consumer's Run.
	Fleet bool
}

// The fleet agent's heartbeat and TTL in the children: short, so that a
// killed process leaves the status within seconds.
const (
	fleetInterval = 250 * time.Millisecond
	fleetTTL      = 3 * time.Second
)

// sourceKinds lists, per broker, the sources a child can run, the default
// first: Kafka's consumer-group source on kafka-go (kafka.NewSource) or on
// kgo (kafka.NewGroupSource); NATS's source on one durable shared by every
// process (nats.Open), or as a member of a static partitioned consumer
// group (nats.WithConsumerGroup).
var sourceKinds = map[string][]string{
	"kafka": {"group", "kgo"},
	"nats":  {"durable", "pcgroup"},
}

// progressEvery is how often a child writes its Progress file.
const progressEvery = 100 * time.Millisecond

// childProgress is what a child reports of its engine (its own counters:
// a new process starts from zero).
type childProgress struct {
	Proc            string
	Handled         uint64
	Spilled, Refed  uint64
	SpillFailures   uint64
	SpillingTenants int
	// Tenants holds the tenants the engine tracks now, by key.
	Tenants map[string]tenantProgress
}

// tenantProgress is one tenant's part of childProgress.
type tenantProgress struct {
	Handled, Spilled, Refed uint64
	SpillLag                int64
	Spilling, Parked        int
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

// handledSink appends "id tenant unixnano process partition offset" lines
// to a file, the partition and offset being the message's place in its
// source (also for a message re-fed from a spill log). Each line is one
// write on an O_APPEND file, so a SIGKILL leaves whole lines and several
// processes may share the file.
type handledSink struct {
	mu   sync.Mutex
	f    *os.File
	name string
}

func (s *handledSink) record(id, tenant string, m *consumer.Message) error {
	line := fmt.Sprintf("%s %s %d %s %d %d\n", id, tenant, time.Now().UnixNano(), s.name, m.Partition.ID, m.Offset)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.f.WriteString(line)
	return err
}

var errDependencyDown = errors.New("integration: tenant dependency down")

// scenarioHandler fails poison messages for good (recording each call in
// events, if set, as a poison-called event), fails the fault tenant
// transiently during its window (or while FaultFile exists), and otherwise
// works WorkMs and records the message as handled.
func scenarioHandler(cfg childConfig, sink *handledSink, events *eventSink) consumer.HandlerFunc {
	var faultStart sync.Once
	var faultUntil time.Time
	down := func() bool {
		if cfg.FaultFile != "" {
			_, err := os.Stat(cfg.FaultFile)
			return err == nil
		}
		faultStart.Do(func() { faultUntil = time.Now().Add(time.Duration(cfg.FaultWindowMs) * time.Millisecond) })
		return time.Now().Before(faultUntil)
	}
	return func(ctx context.Context, m *consumer.Message) error {
		id, poison, ok := parsePayload(m.Value)
		if !ok {
			return policy.Permanent(fmt.Errorf("integration: not a scenario message: %q", m.Value))
		}
		tenant := tenantOf(cfg.Broker, m)
		if poison {
			if events != nil {
				events.write("poison-called", tenant, m.Partition.ID, m.Offset)
			}
			return policy.Permanent(errors.New("integration: poison message"))
		}
		if cfg.FaultTenant != "" && tenant == cfg.FaultTenant && down() {
			return errDependencyDown
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
		return sink.record(id, tenant, m)
	}
}

// eventSink appends "kind tenant partition offset process unixnano" lines
// for the events a scenario checks against (the engine's spilling,
// spill-drained, reordered, partition-assigned and partition-revoked, and
// delivered and redelivered: see redeliveries and traceDeliveries), one
// write each, like handledSink; an event of no tenant has tenant "-".
type eventSink struct {
	mu   sync.Mutex
	f    *os.File
	name string
}

func (s *eventSink) onEvent(e consumer.Event) {
	switch e.Kind {
	case consumer.EventReordered, consumer.EventSpilling, consumer.EventSpillDrained,
		consumer.EventAssigned, consumer.EventRevoked:
		s.write(e.Kind.String(), e.Tenant, e.Partition.ID, e.Offset)
	}
}

func (s *eventSink) write(kind, tenant string, partition int32, offset int64) {
	if tenant == "" {
		tenant = "-"
	}
	line := fmt.Sprintf("%s %s %d %d %s %d\n", kind, tenant, partition, offset, s.name, time.Now().UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.f.WriteString(line)
}

// redeliveries wraps a NATS tenant func to record the messages of tenant
// that the server delivered more than once: those a killed process held
// unacknowledged come back after AckWait, behind later messages, so across
// a crash a tenant's order on NATS is as loose as JetStream's (see the
// adapter's doc), and the order check leaves them out.
func redeliveries(tf consumer.TenantFunc, tenant string, s *eventSink) consumer.TenantFunc {
	return func(m *consumer.Message) (string, error) {
		key, err := tf(m)
		if err == nil && key == tenant {
			if jm, ok := m.Handle.(jetstream.Msg); ok {
				if md, merr := jm.Metadata(); merr == nil && md.NumDelivered > 1 {
					s.write("redelivered", key, m.Partition.ID, m.Offset)
				}
			}
		}
		return key, err
	}
}

// traceDeliveries wraps a tenant func (called once per message the source
// delivers, never for a re-fed spill copy) to record every delivery, and on
// NATS every message the server delivered more than once, of every tenant:
// the scale-out scenario explains an order inversion by a redelivery only
// when the late message was delivered before.
func traceDeliveries(tf consumer.TenantFunc, s *eventSink) consumer.TenantFunc {
	return func(m *consumer.Message) (string, error) {
		key, err := tf(m)
		if err != nil {
			return key, err
		}
		s.write("delivered", key, m.Partition.ID, m.Offset)
		if jm, ok := m.Handle.(jetstream.Msg); ok {
			if md, merr := jm.Metadata(); merr == nil && md.NumDelivered > 1 {
				s.write("redelivered", key, m.Partition.ID, m.Offset)
			}
		}
		return key, err
	}
}

// writeProgress replaces path with c's progress (write, then rename, so a
// reader never sees half of it).
func writeProgress(path, name string, c *consumer.Consumer) error {
	st := c.Stats()
	p := childProgress{Proc: name, Handled: st.Handled, Spilled: st.Spilled, Refed: st.Refed,
		SpillFailures: st.SpillFailures, SpillingTenants: st.SpillingTenants, Tenants: map[string]tenantProgress{}}
	for _, t := range st.Tenants {
		p.Tenants[t.Tenant] = tenantProgress{Handled: t.Handled, Spilled: t.Spilled, Refed: t.Refed,
			SpillLag: t.SpillLag, Spilling: t.Spilling, Parked: t.Parked}
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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
	var events *eventSink
	if cfg.Events != "" {
		ef, err := os.OpenFile(cfg.Events, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer ef.Close()
		events = &eventSink{f: ef, name: cfg.Name}
	}
	ccfg := consumer.Config{
		Scope:              scope.New(testPolicy(), scope.Options[string]{}),
		Handler:            scenarioHandler(cfg, sink, events),
		Group:              cfg.Group,
		Concurrency:        16,
		MaxParkedPerTenant: cfg.MaxParkedPerTenant,
		StuckAfter:         time.Duration(cfg.StuckAfterMs) * time.Millisecond,
		Logger:             log,
	}
	if events != nil {
		ccfg.OnEvent = events.onEvent
	}
	if cfg.Source == "" && len(sourceKinds[cfg.Broker]) > 0 {
		cfg.Source = sourceKinds[cfg.Broker][0]
	}
	var src consumer.Source
	var fleetStore fleet.Store
	switch cfg.Broker + "/" + cfg.Source {
	case "kafka/group", "kafka/kgo":
		newSource := func(brokers []string, topic, group string, opts ...kafkaad.SourceOption) (consumer.Source, error) {
			return kafkaad.NewSource(brokers, topic, group, opts...)
		}
		if cfg.Source == "kgo" {
			newSource = func(brokers []string, topic, group string, opts ...kafkaad.SourceOption) (consumer.Source, error) {
				return kafkaad.NewGroupSource(brokers, topic, group, opts...)
			}
		}
		s, err := newSource([]string{cfg.Addr}, cfg.Topic, cfg.Group,
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
		dlqSink, err := kafkaad.NewDLQ([]string{cfg.DLQAddr}, cfg.Topic)
		if err != nil {
			return err
		}
		defer dlqSink.Close()
		spill, err := kafkaad.NewSpillLog([]string{cfg.Addr}, cfg.Topic, cfg.Group, kafkaad.SpillLogger(log))
		if err != nil {
			return err
		}
		defer spill.Close()
		src, ccfg.Tenant, ccfg.DLQ, ccfg.Spill = s, consumer.FromKey(), dlqSink, spill
		if cfg.Fleet {
			if fleetStore, err = fleet.NewKafkaStore(ctx, []string{cfg.Addr}, cfg.Group, fleet.KafkaOptions{Create: true}); err != nil {
				return err
			}
			defer fleetStore.Close()
		}
	case "nats/durable", "nats/pcgroup":
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
		if events != nil && cfg.FaultTenant != "" {
			ccfg.Tenant = redeliveries(ccfg.Tenant, cfg.FaultTenant, events)
		}
		durable, opts := cfg.Group, []natsad.SourceOption{natsad.WithLogger(log)}
		if cfg.Source == "pcgroup" {
			durable, opts = "", append(opts, natsad.WithConsumerGroup(cfg.Group, cfg.Member))
		}
		s, err := natsad.Open(ctx, nc, cfg.Topic, durable, opts...)
		if err != nil {
			return err
		}
		spill, err := s.SpillLog(ctx)
		if err != nil {
			return err
		}
		src, ccfg.DLQ, ccfg.Spill = s, q, spill
		if cfg.Fleet {
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			if fleetStore, err = fleet.NewNATSStore(ctx, js, cfg.Group, fleet.NATSOptions{Create: true, TTL: fleetTTL}); err != nil {
				return err
			}
			defer fleetStore.Close()
		}
	default:
		return fmt.Errorf("unknown broker %q or source %q", cfg.Broker, cfg.Source)
	}
	if events != nil && cfg.TraceDeliveries {
		ccfg.Tenant = traceDeliveries(ccfg.Tenant, events)
	}
	c, err := consumer.New(ccfg)
	if err != nil {
		return err
	}
	if fleetStore != nil {
		a, err := fleet.NewAgent(fleet.AgentConfig{Consumer: c, Store: fleetStore, Group: cfg.Group, Source: cfg.Broker + "/" + cfg.Source,
			Process: cfg.Name, Interval: fleetInterval, TTL: fleetTTL, Logger: log})
		if err != nil {
			return err
		}
		if err := a.Start(ctx); err != nil {
			return err
		}
		defer a.Close() // a drained process says goodbye; a killed one ages out
	}
	log.Info("child consumer running", "broker", cfg.Broker, "topic", cfg.Topic, "group", cfg.Group)
	if cfg.Progress != "" {
		pctx, pcancel := context.WithCancel(ctx)
		defer pcancel()
		go func() {
			tick := time.NewTicker(progressEvery)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
					if err := writeProgress(cfg.Progress, cfg.Name, c); err != nil {
						log.Warn("child progress", "err", err)
					}
				}
			}
		}()
	}
	if err := c.Run(ctx, src); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st := c.Stats()
	log.Info("child consumer stats", "handled", st.Handled, "failed", st.Failed, "deadlettered", st.DeadLettered, "parked", st.Parked,
		"spilled", st.Spilled, "refed", st.Refed, "spill_failures", st.SpillFailures, "duplicates", st.Duplicates)
	return nil
}
