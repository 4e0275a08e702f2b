package dlq

import (
	"context"
	"errors"
	"time"
)

// Errors that sinks and inspectors wrap. Match them with errors.Is.
var (
	// ErrUnwritable: the record can never be written as it is, e.g. it is
	// larger than the DLQ accepts even after its body was stored out of
	// line or the DLQ topic's size limit was raised. Retrying will not
	// help; a DLQ that is down is not ErrUnwritable but a plain error.
	ErrUnwritable = errors.New("dlq: dead letter cannot be written")
	// ErrNotDLQ: a stream or topic is not a ringfence dead-letter queue (not
	// marked as one at creation, and not an older ringfence DLQ either), so
	// an inspector refuses to read, replay or purge it.
	ErrNotDLQ = errors.New("dlq: not a ringfence dead-letter queue")
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
	// TraceParent is the W3C traceparent of the message's process span
	// (empty when the consumer traced nothing): a replay carries it, and
	// the replayed message's process span links to it.
	TraceParent string

	// Time is when the record was written to the DLQ; set by inspectors,
	// not carried in headers.
	Time time.Time
	// Position is the record's place in its DLQ (offset or stream sequence),
	// set by inspectors.
	Position int64
	// Copies lists every stored copy of this dead letter, oldest first,
	// the record itself (Position, Time) included: a message dead-lettered
	// again after a redelivery is stored again under the same ID. Set by
	// inspectors, which return one record per dead letter; nil elsewhere.
	Copies []Copy
}

// Copy is one stored copy of a dead letter.
type Copy struct {
	Position int64     // offset or stream sequence in the DLQ
	Time     time.Time // when it was written
}

// Sink writes dead-letter records durably: Write returns nil only once the
// broker acknowledged the record (Kafka: all in-sync replicas; NATS: PubAck).
// Until then the original message stays unsettled. Implementations must be
// safe for concurrent use.
//
// Write's error says whether to try again. An error wrapping ErrUnwritable
// means the record can never be written as it is (e.g. larger than the DLQ
// accepts even after splitting it or storing its body out of line):
// retrying will not help, so the caller should set the message aside, say
// why once, and keep everything else flowing. Any other error is transient
// (the DLQ is down, a timeout, a rebalance): the caller keeps the message
// unsettled and writes it again later. Writing the same dead letter (same
// ID) again is safe: inspectors show copies of one message as one.
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
	// Count is how many dead letters the tenant has: copies of one message
	// (same ID) count once.
	Count int
	// Records is how many records are stored, copies included (>= Count).
	Records int
	Oldest  time.Time
	Newest  time.Time
	// Reason is the most common reason among the records.
	Reason Reason
	// LastError is the newest record's error text.
	LastError string
}

// ReplayOptions tunes Inspector.Replay.
type ReplayOptions struct {
	// Limit caps how many dead letters move (copies of one count once); 0
	// means all.
	Limit int
	// DryRun reports what would move and changes nothing.
	DryRun bool
}

// Inspector lists, peeks, replays and purges dead letters per tenant.
// Tenants are raw keys; implementations encode them.
//
// A dead letter is identified by its ID (Record.ID): every view treats the
// copies of one message as one dead letter: counted once, returned once
// (with Record.Copies listing them), replayed once, and removed with all
// its copies. An inspector refuses, with an error wrapping ErrNotDLQ, a
// stream or topic that is not a ringfence DLQ.
type Inspector interface {
	// Tenants lists every tenant with dead letters, sorted by raw key.
	Tenants(ctx context.Context) ([]TenantSummary, error)
	// Peek returns up to n of the tenant's oldest dead letters (n <= 0:
	// all), one record per dead letter.
	Peek(ctx context.Context, tenant string, n int) ([]Record, error)
	// Replay republishes the tenant's dead letters to their source, once
	// each, with Redrive raised, and removes each (with all its copies) from
	// the DLQ only after the republish was acknowledged. It returns the dead
	// letters moved (or, with DryRun, that would move).
	Replay(ctx context.Context, tenant string, opt ReplayOptions) ([]Record, error)
	// Purge removes the tenant's dead letters, with all their copies, and
	// returns how many dead letters there were (copies count once).
	Purge(ctx context.Context, tenant string) (int, error)
}
