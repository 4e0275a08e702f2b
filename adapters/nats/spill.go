package nats

// The spill log: a consumer.SpillLog on a JetStream stream with one subject
// per tenant. The stream, commits and Pending are here; appending is in
// spill_append.go, the record format in spill_record.go, reading back in
// spill_read.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// Stream metadata that marks a ringfence spill stream.
const (
	// MetaSpill is set ("1") on every spill stream NewSpillLog creates or
	// adopts.
	MetaSpill = "ringfence.spill"
	// MetaSpillPrefix holds the spill stream's subject prefix.
	MetaSpillPrefix = "ringfence.spill.prefix"
	// MetaSpillBodies holds the object store bucket with the spilled
	// messages stored out of line.
	MetaSpillBodies = "ringfence.spill.bodies"
	spillFormat     = "1"
)

// ErrNotSpill: a stream named as a spill stream holds something else.
var ErrNotSpill = errors.New("nats: not a ringfence spill stream")

// A SpillLog keeps the messages a tenant could not make progress with, in
// order, on a JetStream stream with file storage: a consumer.SpillLog. Each
// tenant has a subject, "<prefix>.<token>" with the tenant token of
// dlq.TenantToken, so no key reaches another tenant's subject or a
// wildcard. It is safe for concurrent use.
//
// A record is the original message with headers ringfence-spill-subject,
// -stream, -seq (the original's stream sequence), -time, -tenant and -note
// (the engine's, see consumer.Message.SpillNote), and
// the original's "Nats-" headers renamed "ringfence-spill-h-Nats-...". Its
// Nats-Msg-Id ("ringfence-spill:<token>:<stream>/<durable>/0/<sequence>")
// makes the stream drop a second copy of the same original within its
// duplicate window (2 minutes). A message that does not fit one record (the server's
// max payload, the stream's max message size, JetStream's 64 KiB header
// block), or holds bytes a NATS message cannot carry exactly (a message
// key, a header NATS would trim, rename or reorder, a tenant key that is
// hashed in its token and not exact in a header), is stored out of line
// like a dead letter: the original in the object store bucket
// MetaSpillBodies, the record naming it in ringfence-spill-body. Read
// restores it byte for byte; Commit deletes the object after the record.
//
// Append stores a batch atomically (JetStream atomic batch publish, server
// 2.12 and later, AllowAtomicPublish set on the stream) or, where the
// server or stream does not allow that, one record at a time, each after
// the previous one's PubAck: either way the records of a lane that land
// are always a prefix of what was appended, in order. Read uses batched
// direct gets (AllowDirect), confirming an empty answer with the stream
// leader so a lagging replica never ends a re-feed early. Commit purges
// the tenant's subject below a sequence. Pending lists the subjects with
// messages (stream info with a subject filter).
//
// Lanes of the home partition (the Source's, "<stream>/<durable>") use
// "<prefix>.<token>"; lanes of any other partition
// "<prefix>.<topic token>.<id>.<token>".
type SpillLog struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
	home   consumer.Partition
	opt    spillOptions
	log    *slog.Logger
	api    string // JetStream API prefix, e.g. "$JS.API."
	maxMsg int64  // the stream's max message size; <= 0: none
	direct bool   // AllowDirect: batched direct gets
	atomic bool   // AllowAtomicPublish: atomic batch appends
	// atomicMin is the smallest batch appended atomically (see
	// atomicMinMsgs); smaller ones go one record at a time.
	atomicMin int
	bodies    *bodyStore

	mu sync.Mutex
	// refs holds, per subject, the bodies of out-of-line records read and
	// not yet committed, by sequence: Commit deletes them after the purge.
	refs map[string]map[uint64]string

	appended, duplicates, outOfLine, read, batches atomic.Uint64
}

var _ consumer.SpillLog = (*SpillLog)(nil)

// SpillStats are a SpillLog's counters since it was made.
type SpillStats struct {
	// Appended counts records stored; Duplicates the appends the stream's
	// duplicate window dropped (a copy was stored already).
	Appended, Duplicates uint64
	// OutOfLine counts the appended records stored with their body in the
	// bucket.
	OutOfLine uint64
	// Read counts records read back.
	Read uint64
	// Atomic says whether the stream takes atomic batches: appends of at
	// least 64 records are then one atomic batch each; smaller ones, and
	// all on a stream without them, go one record at a time.
	Atomic bool
	// AtomicBatches counts the atomic batches published.
	AtomicBatches uint64
}

// Stats returns the SpillLog's counters.
func (s *SpillLog) Stats() SpillStats {
	return SpillStats{
		Appended: s.appended.Load(), Duplicates: s.duplicates.Load(), OutOfLine: s.outOfLine.Load(),
		Read: s.read.Load(), Atomic: s.atomic, AtomicBatches: s.batches.Load(),
	}
}

// Stream is the spill stream's name.
func (s *SpillLog) Stream() string { return s.name }

// Prefix is the spill stream's subject prefix.
func (s *SpillLog) Prefix() string { return s.prefix }

// Bucket is the object store bucket of records stored out of line.
func (s *SpillLog) Bucket() string { return s.bodies.own }

// homePartition is the engine partition of a Source on stream/durable.
func homePartition(stream, durable string) consumer.Partition {
	return consumer.Partition{Topic: stream + "/" + durable}
}

// NewSpillLog opens the spill stream of the durable consumer durable on
// stream (which need not exist yet), creating it if missing (file storage,
// AllowDirect, AllowAtomicPublish, marked with MetaSpill). An existing
// stream without MetaSpill is adopted and marked when it takes
// "<prefix>.>" and is empty or begins with a spill record; any other
// stream fails with an error wrapping ErrNotSpill. When the server has no
// JetStream it fails with an error wrapping ErrCoreNATS.
func NewSpillLog(ctx context.Context, js jetstream.JetStream, stream, durable string, opts ...SpillOption) (*SpillLog, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidOption)
	}
	if err := validStreamName(stream); err != nil {
		return nil, err
	}
	if err := validStreamName(durable); err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	o := spillOptions{
		stream:  "RINGFENCE_SPILL_" + stream + "_" + durable,
		prefix:  "ringfence.spill." + stream + "." + durable,
		timeout: 10 * time.Second,
		logger:  slog.Default(),
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil spill option", ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	st, err := ensureSpillStream(ctx, js, &o)
	if err != nil {
		return nil, err
	}
	cfg := st.CachedInfo().Config
	s := &SpillLog{
		js: js, stream: st, name: cfg.Name, prefix: o.prefix, home: homePartition(stream, durable),
		opt: o, log: o.logger.With("spill_stream", cfg.Name), api: apiPrefix(js), maxMsg: int64(cfg.MaxMsgSize),
		direct: cfg.AllowDirect, atomic: cfg.AllowAtomicPublish, atomicMin: atomicMinMsgs,
		refs: make(map[string]map[uint64]string),
	}
	s.bodies = &bodyStore{
		js: js, own: o.bucket, create: true,
		desc: "ringfence: bodies of spilled messages in stream " + s.name,
		meta: map[string]string{MetaSpill: spillFormat, "ringfence.spill.stream": s.name},
	}
	return s, nil
}

// apiPrefix is the JetStream API prefix js sends requests to.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		if strings.HasSuffix(o.APIPrefix, ".") {
			return o.APIPrefix
		}
		return o.APIPrefix + "."
	}
	return jetstream.DefaultAPIPrefix
}

// ensureSpillStream returns the spill stream, made or adopted (see
// NewSpillLog), and fills o.bucket from its metadata.
func ensureSpillStream(ctx context.Context, js jetstream.JetStream, o *spillOptions) (jetstream.Stream, error) {
	if o.bucket == "" {
		o.bucket = bucketName(o.stream, "RINGFENCE_SPILL_BODIES_")
	}
	meta := map[string]string{MetaSpill: spillFormat, MetaSpillPrefix: o.prefix, MetaSpillBodies: o.bucket}
	st, err := getOrCreateStream(ctx, js, "spill stream", jetstream.StreamConfig{
		Name:               o.stream,
		Description:        "ringfence spill log",
		Subjects:           []string{o.prefix + ".>"},
		Storage:            jetstream.FileStorage,
		AllowDirect:        true,
		AllowAtomicPublish: true,
		Metadata:           meta,
	})
	if err != nil {
		return nil, err
	}
	info := st.CachedInfo()
	cfg := info.Config
	if !slices.Contains(cfg.Subjects, o.prefix+".>") {
		return nil, fmt.Errorf("%w: stream %s does not take subjects %s.>", ErrInvalidOption, o.stream, o.prefix)
	}
	marked := cfg.Metadata[MetaSpill] != ""
	if marked {
		if p := cfg.Metadata[MetaSpillPrefix]; p != "" && p != o.prefix {
			return nil, fmt.Errorf("%w: spill stream %s has subject prefix %q, not %q", ErrInvalidOption, o.stream, p, o.prefix)
		}
		if b := cfg.Metadata[MetaSpillBodies]; b != "" {
			o.bucket = b
			meta[MetaSpillBodies] = b
		}
	} else if info.State.Msgs > 0 {
		first, err := st.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(">"))
		if err != nil {
			return nil, fmt.Errorf("nats: spill stream %s: %w", o.stream, err)
		}
		if !hasSpillHeaders(first.Header) {
			return nil, fmt.Errorf("%w: stream %s is not marked as one (no %s metadata) and its first message (sequence %d, subject %s) is no spill record; refusing to touch it", ErrNotSpill, o.stream, MetaSpill, first.Sequence, first.Subject)
		}
	}
	if marked && cfg.AllowDirect && cfg.AllowAtomicPublish {
		return st, nil
	}
	// Mark an adopted stream, and turn on direct gets and atomic batches
	// (a server too old for them keeps them off: Read and Append then take
	// the slower path).
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	maps.Copy(cfg.Metadata, meta)
	cfg.AllowDirect, cfg.AllowAtomicPublish = true, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		if !marked {
			return nil, fmt.Errorf("nats: mark stream %s as a ringfence spill stream: %w", o.stream, err)
		}
	}
	if st, err = js.Stream(ctx, o.stream); err != nil {
		return nil, fmt.Errorf("nats: spill stream %s: %w", o.stream, err)
	}
	return st, nil
}

// hasSpillHeaders reports whether h is a spill record's.
func hasSpillHeaders(h nats.Header) bool {
	for k := range h {
		if hasPrefixFold(k, hdrSpillPrefix) {
			return true
		}
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// subject is lane's subject.
func (s *SpillLog) subject(lane consumer.SpillLane) string {
	if lane.Partition == s.home {
		return dlq.NATSSubject(s.prefix, lane.Tenant)
	}
	return s.partitionPrefix(lane.Partition) + "." + dlq.TenantToken(lane.Tenant)
}

// partitionPrefix is the subject prefix of a partition other than home.
func (s *SpillLog) partitionPrefix(p consumer.Partition) string {
	return s.prefix + "." + dlq.TenantToken(p.Topic) + "." + strconv.FormatInt(int64(p.ID), 10)
}

// limit is the largest message the spill stream takes.
func (s *SpillLog) limit() int64 {
	n := s.js.Conn().MaxPayload()
	if s.maxMsg > 0 && s.maxMsg < n {
		n = s.maxMsg
	}
	return n
}

// Commit implements consumer.SpillLog: it purges lane's subject below next
// and then deletes the bodies of the purged records stored out of line.
func (s *SpillLog) Commit(ctx context.Context, lane consumer.SpillLane, next int64) error {
	if next <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.timeout)
	defer cancel()
	subj := s.subject(lane)
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(uint64(next))); err != nil {
		return fmt.Errorf("nats: spill commit %s: %w", subj, err)
	}
	var drop []string
	s.mu.Lock()
	for seq, ref := range s.refs[subj] {
		if seq < uint64(next) {
			drop = append(drop, ref)
			delete(s.refs[subj], seq)
		}
	}
	if len(s.refs[subj]) == 0 {
		delete(s.refs, subj)
	}
	s.mu.Unlock()
	for _, ref := range drop {
		s.bodies.drop(ctx, ref)
	}
	return nil
}

// Pending implements consumer.SpillLog: the lanes of p with records left.
func (s *SpillLog) Pending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opt.timeout)
	defer cancel()
	prefix := s.prefix
	if p != s.home {
		prefix = s.partitionPrefix(p)
	}
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+".*"))
	if err != nil {
		return nil, fmt.Errorf("nats: spill pending %s: %w", prefix, err)
	}
	var out []consumer.SpillLane
	for subj, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		tok, ok := dlq.SplitNATSSubject(prefix, subj)
		if !ok {
			continue
		}
		tenant, exact, err := dlq.ParseTenantToken(tok)
		if err != nil {
			s.log.Warn("ringfence nats: subject in the spill stream is not a tenant's; ignored", "subject", subj, "err", err)
			continue
		}
		if !exact {
			// A hashed token: the first record holds the key.
			if tenant, err = s.fullTenant(ctx, subj); err != nil {
				return nil, err
			}
		}
		out = append(out, consumer.SpillLane{Tenant: tenant, Partition: p})
	}
	return out, nil
}

// fullTenant reads the tenant key of a hashed token's subject from its
// first record.
func (s *SpillLog) fullTenant(ctx context.Context, subj string) (string, error) {
	recs, err := s.leaderRead(ctx, subj, 0, 1)
	if err != nil {
		return "", fmt.Errorf("nats: spill pending %s: %w", subj, err)
	}
	if len(recs) == 0 {
		return "", fmt.Errorf("nats: spill pending %s: the subject emptied while it was listed", subj)
	}
	h := recs[0].hdr
	if v, ok := h[hdrSpillTenant]; ok && len(v) > 0 {
		return v[0], nil
	}
	if ref := h.Get(hdrSpillBody); ref != "" {
		b, err := s.bodies.get(ctx, ref)
		if err != nil {
			return "", err
		}
		tenant, _, _, _, err := decodeBody(b)
		return tenant, err
	}
	return "", fmt.Errorf("nats: spill pending %s: first record (sequence %d) names no tenant", subj, recs[0].seq)
}

// SpillBacklog is one tenant's spill subject and what it holds: one per
// partition the tenant spilled from.
type SpillBacklog struct {
	Tenant  string
	Subject string
	// Partition is the source partition the records came from: the
	// Source's own (ID 0, or the durable's), or a consumer group's
	// partition (see WithConsumerGroup).
	Partition consumer.Partition
	// Records counts the records left: not yet re-fed and committed. They
	// may include copies (a re-appended batch), so it is an upper bound.
	Records uint64
}

// Backlog lists the tenants with records in the spill stream, of every
// partition (a consumer group member's lanes included), sorted by subject,
// for operators (`ringfence spill ls`).
func (s *SpillLog) Backlog(ctx context.Context) ([]SpillBacklog, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opt.timeout)
	defer cancel()
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(s.prefix+".>"))
	if err != nil {
		return nil, fmt.Errorf("nats: spill backlog %s: %w", s.prefix, err)
	}
	var out []SpillBacklog
	for subj, n := range info.State.Subjects {
		tok, part, ok := s.splitLaneSubject(subj)
		if !ok || n == 0 {
			continue
		}
		tenant, exact, err := dlq.ParseTenantToken(tok)
		if err != nil {
			continue
		}
		if !exact {
			if tenant, err = s.fullTenant(ctx, subj); err != nil {
				return nil, err
			}
		}
		out = append(out, SpillBacklog{Tenant: tenant, Subject: subj, Partition: part, Records: n})
	}
	slices.SortFunc(out, func(a, b SpillBacklog) int { return strings.Compare(a.Subject, b.Subject) })
	return out, nil
}

// splitLaneSubject parses a lane's subject (see subject): "<prefix>.<tenant
// token>" for the home partition, "<prefix>.<partition topic token>.<id>.<tenant
// token>" for another. It returns the tenant token and the partition.
func (s *SpillLog) splitLaneSubject(subj string) (tok string, p consumer.Partition, ok bool) {
	if tok, ok := dlq.SplitNATSSubject(s.prefix, subj); ok {
		return tok, s.home, true
	}
	rest, found := strings.CutPrefix(subj, s.prefix+".")
	if !found {
		return "", p, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", p, false
	}
	topic, exact, err := dlq.ParseTenantToken(parts[0])
	if err != nil {
		return "", p, false
	}
	if !exact {
		topic = parts[0] // a hashed token: the name itself is not in it
	}
	id, err := strconv.ParseInt(parts[1], 10, 32)
	if err != nil || id < 0 {
		return "", p, false
	}
	return parts[2], consumer.Partition{Topic: topic, ID: int32(id)}, true
}
