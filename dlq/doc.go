// Package dlq defines ringfence's dead-letter record, its "ringfence-" header
// format, the tenant token used to name per-tenant DLQ topics and subjects,
// and the Sink and Inspector interfaces that each broker adapter implements.
//
// # Tenant tokens
//
// A tenant key is any bytes. TenantToken encodes it as a token that is legal
// both inside a Kafka topic name ([a-zA-Z0-9._-]) and as one NATS subject
// token (no '.', '*', '>' or whitespace): the token uses only [A-Za-z0-9_-].
//
//   - Bytes in [A-Za-z0-9-] stand for themselves, so common ids stay
//     readable: "acme-corp" is "acme-corp", "tenant42" is "tenant42".
//   - Every other byte, '_' included, is '_' and two lowercase hex digits:
//     "acme.corp" is "acme_2ecorp", "acme_2ecorp" is "acme_5f2ecorp", "*" is
//     "_2a", invalid UTF-8 "\xff" is "_ff". The encoding is injective and
//     ParseTenantToken reverses it; it accepts only canonical tokens (no
//     uppercase hex, no escaped letter), so no two tokens name one tenant.
//   - The empty key is NoTenantToken, "_none": the "no tenant" bucket where
//     the engine sends messages whose key is missing, empty or refused
//     (Record.Bucket). No other key encodes to it: "_n" is not an escape.
//   - A key whose encoding is longer than MaxTokenLen (180) is hashed: the
//     longest prefix of its encoding of at most 146 characters, cut between
//     escapes, then "_h", then the first 32 hex digits (128 bits) of the
//     SHA-256 of the key. 'h' is not a hex digit, so "_h" never occurs in a
//     plain token: no key can forge a hashed token, nor a hashed token a
//     plain one. A hashed token cannot be reversed; the full key travels in
//     HeaderTenant of every record.
//
// Names: KafkaTopic gives "<source>.dlq.<token>", at most 249 characters
// (Kafka's limit) for sources of up to MaxKafkaSourceLen (64) characters;
// NATSSubject gives "<prefix>.<token>". SplitKafkaTopic and SplitNATSSubject
// take them apart for inspectors.
//
// # Record headers
//
// A Record travels as the original key and value, byte for byte, and the
// original headers without any earlier "ringfence-" header, followed by the
// ringfence- headers below (Record.EncodeHeaders, DecodeRecord). Numbers are
// decimal; times are RFC 3339 in UTC with nine fractional digits
// (TimeLayout). Headers marked "if set" are left out for the field's zero
// value.
//
//	header                   field         written
//	ringfence-tenant         Tenant        always; raw key bytes, may be empty or non-UTF-8
//	ringfence-tenant-token   (Bucket)      always; the token naming the record's DLQ
//	ringfence-source         Source        if set; source topic or subject
//	ringfence-partition      Partition     if Offset != -1 or Partition != 0
//	ringfence-offset         Offset        if Offset != -1 (Kafka)
//	ringfence-stream         Stream        if set (JetStream)
//	ringfence-sequence       Sequence      if set (JetStream)
//	ringfence-group          Group         if set; consumer group or durable
//	ringfence-attempts       Attempts      if set
//	ringfence-first-failure  FirstFailure  if set and within years 0 to 9999
//	ringfence-last-failure   LastFailure   if set and within years 0 to 9999
//	ringfence-error          Error         if set; capped at MaxErrorLen (1024) bytes on a UTF-8 boundary
//	ringfence-error-type     ErrorType     if set; Go type, e.g. "*net.OpError"
//	ringfence-reason         Reason        if set; "permanent", "exhausted", "poison", ...
//	ringfence-redrive        Redrive       if set; times replayed from a DLQ
//	ringfence-traceparent    TraceParent   if set; W3C traceparent of the message's process span
//
// Adapters add headers of their own under the same prefix (the NATS DLQ's
// "ringfence-nats-body", naming a body stored out of line); DecodeRecord
// drops ringfence- headers it does not know.
//
// When a replayed message fails again, the engine passes its headers as they
// came: EncodeHeaders drops the stale ringfence- ones (matched ignoring ASCII
// case), so each appears once, and RedriveCount reads the count that
// Record.ReplayHeaders raised. A replay keeps ringfence-traceparent too, so
// that the replayed message's process span links to the original's; the
// producer's own traceparent, among the original headers, is kept as it
// was.
//
// A record whose headers include HeaderMarker is a marker, not a dead
// letter: MarkerDLQ marks a Kafka DLQ topic at creation, MarkerMoved lists
// the IDs of dead letters replayed or purged from a Kafka DLQ. DecodeRecord
// returns ErrMarker for it.
//
// # Filling a record
//
// The engine builds a Record from the failed message: Key, Value, Headers,
// Source, Partition and Offset (Kafka) or Stream and Sequence with Offset -1
// (NATS), Group, Tenant (the raw key), Attempts, the first and last failure
// times, Error and ErrorType from CapError(lastErr), Reason, and Redrive from
// RedriveCount(message headers). It then calls Sink.Write and settles the
// message only once Write returned nil.
//
// # Writing errors
//
// Sink.Write's error says whether to try again. An error wrapping
// ErrUnwritable means the record can never be written as it is (larger than
// the DLQ accepts even after the adapter stored its body out of line or
// raised the DLQ topic's limit): the engine sets the message aside, says
// why once, counts it, and keeps the other tenants and the partition's
// other messages flowing. Any other error is transient (the DLQ is down): the
// message stays unsettled and is written again later. A message at its
// broker's own size limit is always writable: the Kafka sink sizes its DLQ
// topics from the source topic, the NATS DLQ stores what does not fit one
// message in an object store.
//
// # Dead-letter identity
//
// A message can be dead-lettered more than once: a redelivery after a
// crash, a rebalance or an expired ack wait fails again and is written
// again. Each copy carries the same ID (Record.ID): the source topic,
// partition and offset on Kafka, the stream and sequence on JetStream.
// Inspectors treat the copies of one ID, within one tenant, as one dead
// letter: Tenants counts it once (TenantSummary.Count; Records counts the
// copies), Peek returns it once with Record.Copies listing every copy,
// Replay republishes it once and removes every copy, Purge removes every
// copy. Collapse does this grouping for a list of records. The NATS DLQ
// also gives each record a Nats-Msg-Id made of its tenant token and ID, so
// the stream's duplicate window stores a copy written within it only once.
//
// # Refusing what is not a DLQ
//
// Inspectors only touch streams and topics that are ringfence DLQs: marked
// at creation (NATS stream metadata; a Kafka MarkerDLQ record), or made by
// an older ringfence and holding only records with ringfence- headers. Any
// other is refused with an error wrapping ErrNotDLQ before anything changes,
// so an inspector pointed at live data cannot replay or purge it.
package dlq
