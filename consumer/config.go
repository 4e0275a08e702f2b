package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/scope"
)

// Handler handles one message. ctx is cancelled when the attempt runs past
// its tenant policy's AttemptTimeout (or what is left of its Deadline), when
// shutdown runs past DrainTimeout, and when Handle returns. Return nil for
// success, an error marked with policy.Permanent for a message that can
// never succeed (it is dead-lettered at once, and its tenant's breaker does
// not count it), and any other error for a transient failure.
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

// Config configures a Consumer. Zero fields mean the defaults written on
// each; New validates it.
//
// # Callbacks and locks
//
// The engine never calls user code or does I/O while it holds a lock of its
// own: Handler, Tenant, OnEvent, the scope's hooks (Shape, OnEvent), the
// policy's hooks (Admit, BeforeAttempt, OnEvent, Backoff.Custom), and every
// Source, SpillLog and DLQ method run with no engine lock held. Any of them
// may therefore call back into the Consumer (Stats, Tenant) without
// deadlock. Events are delivered after the state change they report.
type Config struct {
	// Scope holds one guard per tenant. Nil means
	// scope.New(policy.Default(), scope.Options[string]{}). The engine pins
	// a tenant's guard in the scope while it tracks the tenant, so a tenant
	// in the middle of failing keeps its breaker (up to the scope's
	// HardCeiling).
	Scope *scope.Scope[string]
	// Handler handles messages. Required.
	Handler Handler
	// Tenant extracts the tenant key. Required; it is the one place the
	// tenant key is defined (adapters do not take it).
	Tenant TenantFunc
	// DLQ receives dead letters. Required.
	DLQ dlq.Sink
	// Spill is the durable per-tenant side log (see SpillLog). Nil means no
	// spilling: a tenant that reaches a bound pauses its partition instead,
	// which stops that partition's other tenants too.
	Spill SpillLog
	// Group names the consumer group or durable, recorded in dead letters.
	Group string

	// Concurrency is how many messages are handled at once, across all
	// tenants. Zero means 64. Workers on a partition's quick lanes (tenants
	// whose calls take under 5µs by their guards' estimates) do not wait
	// for a dependency, so once GOMAXPROCS of them run there (one fewer
	// where the source delivers one message at a time) they wake no
	// other for its lanes, and housekeeping wakes one if the partition
	// takes no lane in a tick: the rest of Concurrency is for calls that
	// wait (see PartitionStats.QuickWorkers).
	Concurrency int
	// TenantConcurrency is how many messages of one tenant may be handled
	// at once (its bulkhead), unless its policy's Bulkhead.MaxConcurrent
	// says otherwise. A tenant at its limit waits without holding a worker.
	// Zero means max(1, Concurrency/4).
	TenantConcurrency int
	// MaxParkedPerTenant bounds the messages one parked tenant may hold in
	// memory; a tenant that reaches it spills. Zero means 1000; it is capped
	// at half a partition's bound (see MaxQueuedPerPartition).
	MaxParkedPerTenant int
	// MaxParked bounds parked messages across all tenants; past it the
	// tenant that receives the next message spills. Zero means 100000.
	MaxParked int
	// MaxQueuedPerPartition bounds the messages of one partition held in
	// memory (queued, parked, waiting to be appended to a spill log). Past
	// it the partition is paused until half of them are gone; with a
	// SpillLog that happens only while appends fail or cannot keep up with
	// arrivals (PauseSpillUnavailable, PauseQueueFull). Zero means 10000
	// (lowered below the source's PartitionCapacity, if it has one).
	MaxQueuedPerPartition int
	// ReadAhead bounds the messages of quick tenants (calls under 5µs by
	// their guards' estimates, see Concurrency; a new tenant counts until
	// its first call says otherwise) that one partition holds in memory,
	// not parked and not spilling, or 8 for each lane holding more than one
	// if that is more (a thousand quick tenants on a partition still take turns of
	// several messages). Past it the partition is paused
	// (PauseReadAhead) until half of them are handled: workers get through
	// such messages in microseconds, so holding more buys nothing, while
	// each message held is one more for the garbage collector to mark.
	// Other tenants' messages do not count (MaxQueuedPerTenant and
	// MaxQueuedPerPartition bound them), so a slow tenant never pauses its
	// partition this way. A read-ahead pause that lasted 100ms is lifted
	// at housekeeping's next look (every 100ms), and the bound rests until
	// the count is down to half: quick calls that started to hang must not
	// hold the partition. Zero means 2500; a value at or above a
	// partition's bound (MaxQueuedPerPartition, or the source's capacity)
	// turns it off for that partition.
	ReadAhead int
	// MaxQueuedPerTenant bounds the messages of one tenant from one
	// partition held in memory; a tenant with a bigger backlog (a hot
	// tenant) spills the rest, so its partition-mates never wait behind
	// it. Zero means MaxQueuedPerPartition/8 (at least 1); it is capped at
	// an eighth of a partition's bound.
	MaxQueuedPerTenant int
	// StuckAfter is how long a partition's oldest unsettled message may
	// hold the partition's commit before its tenant spills. While the
	// tenant is in trouble (parked, its breaker open, its DLQ refusing) it
	// counts from the message's first delivery to the group: its
	// Message.Time when that is earlier than its receipt here (a message
	// redelivered after a restart or a rebalance, or re-fed from a spill
	// log, keeps its age); from its receipt otherwise (a healthy tenant's
	// head in a backlog is old, not stuck). Zero means 10s.
	StuckAfter time.Duration
	// RefeedWindow is how many spilled messages of one tenant and
	// partition are read back into memory at a time. Zero means 64.
	RefeedWindow int
	// PoisonProbes is how many probes in a row a tenant's head message may
	// fail before the tenant's next message is tried as a probe instead; if
	// that one succeeds the head is dead-lettered as poison. Zero means 3.
	PoisonProbes int
	// MaxIdleTenants bounds the tenants the engine keeps state for while
	// they have nothing in it (no message queued, parked, in flight, being
	// spilled or set aside, on any partition): past it, the one idle
	// longest is forgotten. A tenant that comes back after that starts
	// with fresh engine state (counters, bulkhead); its guard, and so its
	// breaker, lives in the Scope, which keeps it by its own bounds. Each
	// partition likewise keeps at most MaxIdleTenants lanes (a tenant's
	// queue on it), fewer with many partitions or tenants (its share of
	// about 4*MaxIdleTenants over all partitions, at least 64, at most
	// 16384; Stats.Tracked.MaxLanes): past that, a lane made for one
	// message is dropped as soon as that message is handled, and lanes
	// that hold nothing and had no message since the sweep last looked
	// are dropped, a few as each new lane is made and a bounded number at
	// each housekeeping tick, never by a walk of all of them. A tenant
	// with messages in the engine is never
	// forgotten, nor its lanes dropped. So whatever the stream of
	// keys, the engine tracks at most MaxIdleTenants idle tenants and about
	// MaxLanes lanes a partition, beyond those holding messages. While it
	// tracks more than one and a half times MaxIdleTenants tenants (a
	// stream of keys mostly seen once keeps it at about twice
	// MaxIdleTenants), a tenant's first message that is its lane's only
	// one runs without making the tenant's guard, if the Scope holds none
	// for the key and builds every guard from its template (no Shape, no
	// Admit hook): a success then costs the Scope nothing (that guard
	// would have been evicted soon after, its success with it), and a
	// failure makes the guard, which counts it. Such a tenant, once idle
	// while the engine tracks more than twice MaxIdleTenants tenants, is
	// forgotten at once rather than listed: the idle tenants kept are
	// those that hold a guard, not the newest of a stream of keys. An
	// idle tenant costs about 1.9 KiB of heap, 1.3 KiB of it its guard in
	// the Scope (which its pin keeps there), and a lane about 350 bytes
	// more (TestIdleTenantBytes measures both). Stats.Tracked shows the
	// counts. Zero means the Scope's MaxKeys (1024 by default).
	MaxIdleTenants int
	// MaxTenantLen is the longest tenant key accepted, in bytes; longer keys
	// are dead-lettered with reason invalid-tenant. Zero means 4096.
	MaxTenantLen int
	// DrainTimeout is how long Run waits for in-flight handlers on shutdown
	// before cancelling their ctx. Zero means 30s.
	DrainTimeout time.Duration
	// DLQRetry is the first wait before a dead letter the DLQ refused is
	// written again; while the DLQ keeps refusing, the wait doubles up to
	// DLQProbe. It is also the first wait before a failed spill-log call is
	// made again (doubling up to 30s, spillRetryMax). Zero means 100ms.
	DLQRetry time.Duration
	// DLQProbe is the longest wait between two writes of a dead letter
	// while its tenant's DLQ refuses them. Each such write is a probe of
	// the DLQ: dead letters flow again within DLQProbe of the DLQ's return,
	// at the speed the DLQ takes them. Meanwhile the tenant's messages
	// behind the dead letter wait (and spill after StuckAfter; Stats says
	// TenantStats.DLQUnavailable), and no other tenant waits. Zero means
	// 1s; it is at least DLQRetry.
	DLQProbe time.Duration
	// OnEvent, if set, receives engine events, with no engine lock held. It
	// must be safe for concurrent use; it runs on the engine's goroutines,
	// so a slow hook slows the engine.
	OnEvent func(Event)
	// Tracing configures OpenTelemetry traces: a process span per message
	// (see the package doc's # Tracing). The zero value traces nothing.
	Tracing Tracing
	// Logger receives warnings (DLQ, spill or settle failures). Nil means
	// slog.Default().
	Logger *slog.Logger
}

// ErrInvalidConfig: New was given an unusable Config.
var ErrInvalidConfig = errors.New("consumer: invalid config")

// resolve validates cfg and fills in the defaults.
func (cfg Config) resolve() (Config, error) {
	switch {
	case cfg.Handler == nil || isNilValue(cfg.Handler):
		return cfg, fmt.Errorf("%w: Handler is required", ErrInvalidConfig)
	case cfg.Tenant == nil:
		return cfg, fmt.Errorf("%w: Tenant is required", ErrInvalidConfig)
	case cfg.DLQ == nil || isNilValue(cfg.DLQ):
		return cfg, fmt.Errorf("%w: DLQ is required (got a nil %T)", ErrInvalidConfig, cfg.DLQ)
	case cfg.Spill != nil && isNilValue(cfg.Spill):
		return cfg, fmt.Errorf("%w: Spill is a nil %T; leave it nil to disable spilling", ErrInvalidConfig, cfg.Spill)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Concurrency", int64(cfg.Concurrency)},
		{"TenantConcurrency", int64(cfg.TenantConcurrency)},
		{"MaxParkedPerTenant", int64(cfg.MaxParkedPerTenant)},
		{"MaxParked", int64(cfg.MaxParked)},
		{"MaxQueuedPerPartition", int64(cfg.MaxQueuedPerPartition)},
		{"MaxQueuedPerTenant", int64(cfg.MaxQueuedPerTenant)},
		{"ReadAhead", int64(cfg.ReadAhead)},
		{"StuckAfter", int64(cfg.StuckAfter)},
		{"RefeedWindow", int64(cfg.RefeedWindow)},
		{"PoisonProbes", int64(cfg.PoisonProbes)},
		{"MaxTenantLen", int64(cfg.MaxTenantLen)},
		{"MaxIdleTenants", int64(cfg.MaxIdleTenants)},
		{"DrainTimeout", int64(cfg.DrainTimeout)},
		{"DLQRetry", int64(cfg.DLQRetry)},
		{"DLQProbe", int64(cfg.DLQProbe)},
	} {
		if f.v < 0 {
			return cfg, fmt.Errorf("%w: %s must not be negative, got %d", ErrInvalidConfig, f.name, f.v)
		}
	}
	cfg.Concurrency = orInt(cfg.Concurrency, 64)
	cfg.TenantConcurrency = orInt(cfg.TenantConcurrency, max(1, cfg.Concurrency/4))
	cfg.TenantConcurrency = min(cfg.TenantConcurrency, cfg.Concurrency)
	cfg.MaxParkedPerTenant = orInt(cfg.MaxParkedPerTenant, 1000)
	cfg.MaxParked = orInt(cfg.MaxParked, 100000)
	cfg.MaxQueuedPerPartition = orInt(cfg.MaxQueuedPerPartition, 10000)
	cfg.MaxQueuedPerTenant = orInt(cfg.MaxQueuedPerTenant, max(1, cfg.MaxQueuedPerPartition/8))
	cfg.ReadAhead = orInt(cfg.ReadAhead, 2500)
	if cfg.StuckAfter == 0 {
		cfg.StuckAfter = 10 * time.Second
	}
	cfg.RefeedWindow = orInt(cfg.RefeedWindow, 64)
	cfg.PoisonProbes = orInt(cfg.PoisonProbes, 3)
	cfg.MaxTenantLen = orInt(cfg.MaxTenantLen, 4096)
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.DLQRetry == 0 {
		cfg.DLQRetry = 100 * time.Millisecond
	}
	if cfg.DLQProbe == 0 {
		cfg.DLQProbe = time.Second
	}
	cfg.DLQProbe = max(cfg.DLQProbe, cfg.DLQRetry)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

// isNilValue reports whether v is an interface holding a nil pointer, map,
// slice, func or channel: a typed nil that passes a == nil check and panics
// at first use.
func isNilValue(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

func orInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}
