package nats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/dlq"
)

const (
	// hdrDLQNats prefixes an original "Nats-" header in a dead letter, so
	// that the DLQ stream does not act on it (a Nats-Expected-* header
	// would make every write fail; the original's Nats-Msg-Id would collide
	// with the DLQ's own).
	hdrDLQNats = "ringfence-nats-h-"
	// hdrBody names the object ("<bucket>/<name>") that holds a dead
	// letter stored out of line (see body.go).
	hdrBody = "ringfence-nats-body"
	// msgIDPrefix starts the Nats-Msg-Id of a dead letter:
	// "ringfence-dlq:<token>:<ID>", so that the DLQ stream's duplicate
	// window drops a copy of a dead letter written again after a
	// redelivery.
	msgIDPrefix = "ringfence-dlq:"
	// maxHeaderBlock is the largest header block JetStream stores (its
	// length is kept in 16 bits).
	maxHeaderBlock = 65535
	// maxInlineTenant is the longest tenant key kept in the HeaderTenant
	// of a record stored out of line (the full key is in the body).
	maxInlineTenant = 1024
	// scanBatch is how many messages a scan of the DLQ asks for at once.
	scanBatch = 500
	// scanIdle is how many empty fetches in a row end a scan that has not
	// seen its last message.
	scanIdle = 3
	// scanInactive is when the server removes a scan's consumer that was
	// not deleted (the inspector died).
	scanInactive = 30 * time.Second
)

// Stream metadata that marks a ringfence DLQ stream.
const (
	// MetaDLQ is set ("1") on every DLQ stream NewDLQ creates or adopts;
	// OpenDLQ and the CLI refuse a stream without it unless it is an older
	// ringfence DLQ (see OpenDLQ).
	MetaDLQ = "ringfence.dlq"
	// MetaPrefix holds the DLQ's subject prefix.
	MetaPrefix = "ringfence.dlq.prefix"
	// MetaBodies holds the name of the object store bucket with the bodies
	// of dead letters stored out of line.
	MetaBodies = "ringfence.dlq.bodies"
	dlqFormat  = "1"
)

// A DLQ keeps dead letters in a JetStream stream (file storage), one
// subject per tenant, dlq.NATSSubject(prefix, tenant), and lists, peeks,
// replays and purges them: it implements dlq.Sink and dlq.Inspector. It is
// safe for concurrent use.
//
// A record that does not fit one message (the server's max payload, or
// the stream's max message size), or that holds bytes a NATS message cannot
// carry exactly (a message key, a header value with CR, LF or surrounding
// spaces, a header name NATS refuses), is stored out of line: the original
// message in the DLQ's object store bucket (MetaBodies) and, in the stream,
// a record of its ringfence- headers that names the object. Inspectors
// restore it byte for byte; replay and purge remove the object too.
type DLQ struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
	bucket string
	// marked: the stream carries MetaDLQ. An unmarked stream is an older
	// ringfence DLQ, opened read-only by OpenDLQ: every message read from it
	// must be a ringfence record.
	marked bool
	maxMsg int64 // the stream's max message size; <= 0: none

	// bodies holds records stored out of line; its own bucket is created
	// on first need only by NewDLQ (OpenDLQ only reads).
	bodies *bodyStore
}

var (
	_ dlq.Sink      = (*DLQ)(nil)
	_ dlq.Inspector = (*DLQ)(nil)
)

// NewDLQ opens the DLQ stream, creating it (file storage, marked with
// MetaDLQ) if missing. An existing stream without MetaDLQ is adopted and
// marked when it takes "<prefix>.>" and is empty or begins with a ringfence
// record (a DLQ made by an older ringfence); any other stream fails with an
// error wrapping dlq.ErrNotDLQ. When the server has no JetStream it fails
// with an error wrapping ErrCoreNATS.
func NewDLQ(ctx context.Context, js jetstream.JetStream, opts ...DLQOption) (*DLQ, error) {
	o, err := buildDLQOptions(opts)
	if err != nil {
		return nil, err
	}
	st, err := getOrCreateStream(ctx, js, "stream", jetstream.StreamConfig{
		Name:        o.stream,
		Description: "ringfence dead letters",
		Subjects:    []string{o.prefix + ".>"},
		Storage:     jetstream.FileStorage,
		Metadata:    map[string]string{MetaDLQ: dlqFormat, MetaPrefix: o.prefix, MetaBodies: o.bucketFor()},
	})
	if err != nil {
		return nil, err
	}
	q, err := openDLQ(ctx, js, st, o, true)
	if err != nil {
		return nil, err
	}
	q.bodies.create = true
	if !q.marked {
		cfg := st.CachedInfo().Config
		cfg.Metadata = maps.Clone(cfg.Metadata)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[MetaDLQ], cfg.Metadata[MetaPrefix], cfg.Metadata[MetaBodies] = dlqFormat, q.prefix, q.bucket
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("nats: mark stream %s as a ringfence DLQ: %w", o.stream, err)
		}
		q.marked = true
	}
	return q, nil
}

// OpenDLQ opens an existing DLQ stream to inspect it; it never creates or
// changes a stream. A stream marked with MetaDLQ gives its own subject
// prefix and bucket. An unmarked stream is accepted only as a DLQ of an
// older ringfence: it takes "<prefix>.>" (the prefix from WithDLQPrefix, or
// the stream's only subject "<prefix>.>"), its first message is a ringfence
// record, and so is every message an inspection reads; anything else is
// refused with an error wrapping dlq.ErrNotDLQ. A missing stream is an
// error wrapping jetstream.ErrStreamNotFound.
func OpenDLQ(ctx context.Context, js jetstream.JetStream, opts ...DLQOption) (*DLQ, error) {
	o, err := buildDLQOptions(opts)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, o.stream)
	switch {
	case noJetStream(err):
		return nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
	case err != nil:
		return nil, fmt.Errorf("nats: DLQ stream %s: %w", o.stream, err)
	}
	return openDLQ(ctx, js, st, o, false)
}

// openDLQ checks that st is a ringfence DLQ and fills a DLQ from it.
// adopt: an empty unmarked stream is accepted (NewDLQ will mark it).
func openDLQ(ctx context.Context, js jetstream.JetStream, st jetstream.Stream, o dlqOptions, adopt bool) (*DLQ, error) {
	info := st.CachedInfo()
	cfg := info.Config
	q := &DLQ{js: js, stream: st, name: cfg.Name, prefix: o.prefix, bucket: o.bucketFor(), maxMsg: int64(cfg.MaxMsgSize)}
	if cfg.Metadata[MetaDLQ] != "" {
		q.marked = true
		if p := cfg.Metadata[MetaPrefix]; p != "" {
			if o.prefixSet && o.prefix != p {
				return nil, fmt.Errorf("%w: DLQ stream %s has subject prefix %q, not %q", ErrInvalidOption, q.name, p, o.prefix)
			}
			q.prefix = p
		}
		if b := cfg.Metadata[MetaBodies]; b != "" {
			q.bucket = b
		}
	} else {
		if !o.prefixSet && !adopt {
			if len(cfg.Subjects) != 1 || !strings.HasSuffix(cfg.Subjects[0], ".>") {
				return nil, fmt.Errorf("%w: stream %s has subjects %q and no %s metadata: not a ringfence DLQ, or give its subject prefix", dlq.ErrNotDLQ, q.name, cfg.Subjects, MetaDLQ)
			}
			q.prefix = strings.TrimSuffix(cfg.Subjects[0], ".>")
		}
		if err := q.checkLegacy(ctx, info, adopt); err != nil {
			return nil, err
		}
	}
	if !slices.Contains(cfg.Subjects, q.prefix+".>") {
		return nil, fmt.Errorf("%w: stream %s does not take subjects %s.>", ErrInvalidOption, q.name, q.prefix)
	}
	q.bodies = &bodyStore{
		js:   js,
		own:  q.bucket,
		desc: "ringfence: bodies of dead letters in stream " + q.name,
		meta: map[string]string{MetaDLQ: dlqFormat, "ringfence.dlq.stream": q.name},
	}
	return q, nil
}

// checkLegacy accepts an unmarked stream whose first message is a
// ringfence record (with adopt, an empty stream too).
func (q *DLQ) checkLegacy(ctx context.Context, info *jetstream.StreamInfo, adopt bool) error {
	if info.State.Msgs == 0 {
		if adopt {
			return nil
		}
		return fmt.Errorf("%w: stream %s is empty and not marked as one (no %s metadata)", dlq.ErrNotDLQ, q.name, MetaDLQ)
	}
	first, err := q.stream.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(">"))
	if err != nil {
		return fmt.Errorf("nats: DLQ stream %s: %w", q.name, err)
	}
	if !hasRingfence(first.Header) {
		return fmt.Errorf("%w: stream %s is not marked as one (no %s metadata) and its first message (sequence %d, subject %s) has no ringfence- headers; refusing to touch it", dlq.ErrNotDLQ, q.name, MetaDLQ, first.Sequence, first.Subject)
	}
	return nil
}

func hasRingfence(h nats.Header) bool {
	for k := range h {
		if dlq.IsRingfenceHeader(k) {
			return true
		}
	}
	return false
}

// Subject is the DLQ subject of a tenant ("" is the no-tenant bucket).
func (q *DLQ) Subject(tenant string) string { return dlq.NATSSubject(q.prefix, tenant) }

// Stream is the DLQ stream's name.
func (q *DLQ) Stream() string { return q.name }

// Prefix is the DLQ's subject prefix.
func (q *DLQ) Prefix() string { return q.prefix }

// Bucket is the object store bucket that holds the bodies of dead letters
// stored out of line.
func (q *DLQ) Bucket() string { return q.bucket }

// Write stores r under its tenant's subject (r.Bucket()) and returns once
// the server acknowledged it. A record with an ID is published with a
// Nats-Msg-Id made of its tenant token and ID, so the stream's duplicate
// window (2 minutes by default) drops a copy written again after a
// redelivery. A record too large for one message, or with bytes a message
// cannot carry, is stored out of line (see DLQ); Write fails with an error
// wrapping dlq.ErrUnwritable only when even the record that points to its
// body does not fit.
func (q *DLQ) Write(ctx context.Context, r *dlq.Record) error {
	limit := q.limit()
	id := msgID(r)
	h := natsHeader(r.EncodeHeaders(), id)
	data := r.Value
	var body string
	if !carriable(r) || msgSize(h, data) > limit || msgSize(h, nil) > maxHeaderBlock {
		var err error
		if body, err = q.putBody(ctx, r); err != nil {
			return err
		}
		ptr := *r
		ptr.Headers = nil
		hs := ptr.EncodeHeaders()
		if len(r.Tenant) > maxInlineTenant || !exactValue(r.Tenant) {
			hs = slices.DeleteFunc(hs, func(x dlq.Header) bool { return x.Key == dlq.HeaderTenant })
		}
		hs = append(hs, dlq.Header{Key: hdrBody, Value: []byte(body)})
		h, data = natsHeader(hs, id), nil
		if n := msgSize(h, nil); n > min(limit, maxHeaderBlock) {
			q.dropBody(ctx, body)
			return fmt.Errorf("nats: dlq write: even the record pointing to the stored body is %d bytes, more than the %d the server or stream %s accepts: %w", n, min(limit, maxHeaderBlock), q.name, dlq.ErrUnwritable)
		}
	}
	ack, err := q.js.PublishMsg(ctx, &nats.Msg{Subject: q.Subject(r.Bucket()), Header: h, Data: data})
	if err != nil {
		if body != "" && refused(err) {
			// Not stored: the body has no record. (After a timeout the
			// record may have landed, so its body stays: an orphan at
			// worst, never a record without its body.)
			q.dropBody(context.WithoutCancel(ctx), body)
		}
		if tooLarge(err) {
			return fmt.Errorf("nats: dlq write: %w: %w", dlq.ErrUnwritable, err)
		}
		return fmt.Errorf("nats: dlq write: %w", err)
	}
	if ack.Duplicate && body != "" {
		q.dropBody(ctx, body) // the copy already stored has its own
	}
	return nil
}

// jsHeaderTooLarge is JetStream's error code for a header block over 64 KiB
// (nats.go names no constant for it).
const jsHeaderTooLarge jetstream.ErrorCode = 10097

// tooLarge reports whether a publish failed for a size the record will
// always have: retrying cannot help.
func tooLarge(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum || api.ErrorCode == jsHeaderTooLarge) {
		return true
	}
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// msgID is the Nats-Msg-Id of r, "" when r has no ID.
func msgID(r *dlq.Record) string {
	id, ok := r.ID()
	if !ok {
		return ""
	}
	return msgIDPrefix + dlq.TenantToken(r.Bucket()) + ":" + id.String()
}

// natsHeader turns record headers into a NATS header: an original "Nats-"
// header is renamed so the stream does not act on it.
func natsHeader(hs []dlq.Header, id string) nats.Header {
	h := make(nats.Header, len(hs)+1)
	for _, x := range hs {
		k := x.Key
		if strings.HasPrefix(k, "Nats-") {
			k = hdrDLQNats + k
		}
		h[k] = append(h[k], string(x.Value))
	}
	if id != "" {
		h[jetstream.MsgIDHeader] = []string{id}
	}
	return h
}

// limit is the largest message the DLQ stream takes.
func (q *DLQ) limit() int64 {
	n := q.js.Conn().MaxPayload()
	if q.maxMsg > 0 && q.maxMsg < n {
		n = q.maxMsg
	}
	return n
}

// msgSize is the size a message counts against max payload: its header
// block as nats.go writes it, plus the data (with nil data: the header
// block alone, which JetStream caps at maxHeaderBlock).
func msgSize(h nats.Header, data []byte) int64 {
	n := int64(len(data))
	if len(h) == 0 {
		return n
	}
	n += int64(len("NATS/1.0\r\n") + len("\r\n"))
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(textproto.TrimString(v)) + len(": \r\n"))
		}
	}
	return n
}

// carriable reports whether a NATS message carries r's original message
// and tenant exactly: no key, header names NATS accepts, and values NATS
// does not trim or rewrite.
func carriable(r *dlq.Record) bool {
	if r.Key != nil || !exactValue(r.Tenant) {
		return false
	}
	for _, h := range r.Headers {
		if dlq.IsRingfenceHeader(h.Key) {
			continue // replaced by the record's own
		}
		if !validHeaderKey(h.Key) || !exactValue(string(h.Value)) {
			return false
		}
	}
	return true
}

// exactValue reports whether a NATS header carries v unchanged: nats.go
// trims surrounding white space and turns CR and LF into spaces.
func exactValue(v string) bool {
	return !strings.ContainsAny(v, "\r\n") && textproto.TrimString(v) == v
}

// validHeaderKey is nats.go's rule: printable ASCII without
// "\"()/,:;<=>?@[\\]{}".
func validHeaderKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 33 || c > 126 || strings.IndexByte("\"()/,:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// putBody stores r's original message in the DLQ's bucket and returns
// "<bucket>/<object>".
func (q *DLQ) putBody(ctx context.Context, r *dlq.Record) (string, error) {
	var headers []dlq.Header
	for _, h := range r.Headers {
		if !dlq.IsRingfenceHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	return q.bodies.put(ctx, dlq.TenantToken(r.Bucket()), encodeBody(r.Tenant, r.Key, r.Value, headers))
}

// dropBody deletes a stored body, best effort: one that outlives its record
// only takes space.
func (q *DLQ) dropBody(ctx context.Context, ref string) { q.bodies.drop(ctx, ref) }

// getBody reads a stored body.
func (q *DLQ) getBody(ctx context.Context, ref string) (tenant string, key, value []byte, headers []dlq.Header, err error) {
	b, err := q.bodies.get(ctx, ref)
	if err != nil {
		return "", nil, nil, nil, err
	}
	return decodeBody(b)
}

// defaultBucket names the object store bucket of a DLQ stream: the stream's
// name with "_BODIES" when that is a legal bucket name, else a hash of it.
func defaultBucket(stream string) string { return bucketName(stream, "RINGFENCE_DLQ_BODIES_") }

// getOrCreateStream returns the stream cfg.Name, creating it with cfg if it
// does not exist (another process creating it first is fine). what names it
// in errors; a server without JetStream is ErrCoreNATS.
func getOrCreateStream(ctx context.Context, js jetstream.JetStream, what string, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // lost a creation race
			st, err = js.Stream(ctx, cfg.Name)
		}
	}
	switch {
	case noJetStream(err):
		return nil, fmt.Errorf("%w (%v)", ErrCoreNATS, err)
	case err != nil:
		return nil, fmt.Errorf("nats: %s %s: %w", what, cfg.Name, err)
	}
	return st, nil
}
