package dlq

import (
	"context"
	"time"
)

// Header is one message header. Kafka and NATS both allow repeated keys, so
// headers are a list, not a map.
type Header struct {
	Key   string
	Value []byte
}

// Reason says why a message was dead-lettered.
type Reason string

// Reasons.
const (
	// ReasonPermanent: the handler returned an error marked policy.Permanent.
	ReasonPermanent Reason = "permanent"
	// ReasonExhausted: every attempt failed while the tenant's breaker stayed
	// closed, so the failure is the message's own.
	ReasonExhausted Reason = "exhausted"
	// ReasonPoison: the message kept failing as a probe while the tenant's
	// next message succeeded: it alone kept the tenant parked.
	ReasonPoison Reason = "poison"
	// ReasonNoTenant: the tenant key was missing.
	ReasonNoTenant Reason = "no-tenant"
	// ReasonInvalidTenant: the tenant key could not be used (too long for the
	// engine's limit, or refused by the extractor).
	ReasonInvalidTenant Reason = "invalid-tenant"
	// ReasonPanic: the handler panicked on every attempt.
	ReasonPanic Reason = "panic"
)

// Record is one dead letter: the original message, byte for byte, plus what
// ringfence knows about its failure. On the wire the failure data travels as
// headers prefixed "ringfence-" (see EncodeHeaders and DecodeRecord).
type Record struct {
	// Tenant is the raw tenant key (any bytes). Empty with ReasonNoTenant;
	// with ReasonInvalidTenant it holds the refused key, if any. Either way
	// the record goes to the "no tenant" bucket (see Bucket).
	Tenant string

	// Key, Value and Headers are the original message's, unchanged, with any
	// earlier "ringfence-" headers removed.
	Key     []byte
	Value   []byte
	Headers []Header

	// Source is the topic (Kafka) or subject (NATS) the message came from.
	Source string
	// Partition and Offset locate a Kafka message; Offset is -1 otherwise
	// (set it: the zero value 0 is a real Kafka offset).
	Partition int32
	Offset    int64
	// Stream and Sequence locate a JetStream message.
	Stream   string
	Sequence uint64
	// Group is the consumer group (Kafka) or durable consumer (NATS).
	Group string

	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
	// Error is the last error's text, capped at MaxErrorLen bytes.
	Error string
	// ErrorType is the Go type of the last error, e.g. "*net.OpError".
	ErrorType string
	Reason    Reason
	// Redrive counts how many times this message was replayed from a DLQ
	// (RedriveCount reads it from the redelivered message's headers).
	Redrive int

	// Time is when the record was written to the DLQ; set by inspectors,
	// not carried in headers.
	Time time.Time
	// Position is the record's place in its DLQ (offset or stream sequence),
	// set by inspectors.
	Position int64
}

// Sink writes dead-letter records durably: Write returns nil only once the
// broker acknowledged the record (Kafka: all in-sync replicas; NATS: PubAck).
// Until then the original message stays unsettled. Implementations must be
// safe for concurrent use.
type Sink interface {
	Write(ctx context.Context, r *Record) error
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, r *Record) error

// Write calls f.
func (f SinkFunc) Write(ctx context.Context, r *Record) error { return f(ctx, r) }

// TenantSummary describes one tenant's dead letters.
type TenantSummary struct {
	Tenant string // raw key
	Token  string // its encoded token, as used in topic or subject names
	Count  int
	Oldest time.Time
	Newest time.Time
	// Reason is the most common reason among the records.
	Reason Reason
	// LastError is the newest record's error text.
	LastError string
}

// ReplayOptions tunes Inspector.Replay.
type ReplayOptions struct {
	// Limit caps how many records move; 0 means all.
	Limit int
	// DryRun reports what would move and changes nothing.
	DryRun bool
}

// Inspector lists, peeks, replays and purges dead letters per tenant.
// Tenants are raw keys; implementations encode them.
type Inspector interface {
	// Tenants lists every tenant with dead letters.
	Tenants(ctx context.Context) ([]TenantSummary, error)
	// Peek returns up to n of the tenant's oldest records (n <= 0: all).
	Peek(ctx context.Context, tenant string, n int) ([]Record, error)
	// Replay republishes the tenant's records to their source with Redrive
	// raised and removes each from the DLQ only after the republish was
	// acknowledged. It returns the records moved (or, with DryRun, that
	// would move).
	Replay(ctx context.Context, tenant string, opt ReplayOptions) ([]Record, error)
	// Purge removes the tenant's dead letters and returns how many.
	Purge(ctx context.Context, tenant string) (int, error)
}
