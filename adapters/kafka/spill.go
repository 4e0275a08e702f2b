package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/flight"
)

// Spill topic naming.
const (
	// SpillSuffix makes the spill topic of a source: "<source>.spill".
	SpillSuffix = ".spill"
	// SpillCursorSuffix makes the cursor topic of a source:
	// "<source>.spill-cursors".
	SpillCursorSuffix = ".spill-cursors"
	// SpillInfix separates the source topic from the tenant token in the
	// name of a per-tenant spill topic of earlier versions,
	// "<source>.spill.<token>", which a SpillLog still drains (see
	// SpillLog).
	SpillInfix = ".spill."
	// MaxSpillSourceLen is the longest source topic a SpillLog accepts:
	// its cursor topic's name must fit Kafka's 249 characters.
	MaxSpillSourceLen = 249 - len(SpillCursorSuffix)
	// DefaultSpillGroupSuffix makes the cursor group of a SpillLog from
	// its consumer group: "<group>.ringfence-spill".
	DefaultSpillGroupSuffix = ".ringfence-spill"
	// DefaultSpillFetchBytes is what one Read asks the broker for.
	DefaultSpillFetchBytes = 1 << 20
)

// ErrNotSpill is wrapped by the error of a SpillLog that finds a topic by
// its spill topic's name that is not one (compacted, or holding records
// that are not spill records); it refuses to write to it.
var ErrNotSpill = errors.New("kafka: not a ringfence spill topic")

// SpillTopic names the spill topic of source: "<source>.spill". Every
// tenant's spilled messages of source partition p go to its partition p.
func SpillTopic(source string) string { return source + SpillSuffix }

// SpillCursorTopic names the compacted topic that keeps the lanes' cursors
// of source: "<source>.spill-cursors".
func SpillCursorTopic(source string) string { return source + SpillCursorSuffix }

// legacySpillTopic names the per-tenant spill topic earlier versions made:
// "<source>.spill.<token>".
func legacySpillTopic(source, tenant string) string {
	return source + SpillInfix + dlq.TenantToken(tenant)
}

// SpillOption configures a SpillLog. Each option checks its own argument.
type SpillOption func(*spillConfig) error

type spillConfig struct {
	dialer      *kafkago.Dialer
	cursorGroup string        // "" means group + DefaultSpillGroupSuffix
	replication int           // 0: the source topic's
	retention   time.Duration // 0: the source topic's; < 0: none
	fetchBytes  int
	readAhead   int
	logger      *slog.Logger
}

// SpillDialer sets the dialer (TLS, SASL, timeouts). Default: kafka-go's
// DefaultDialer.
func SpillDialer(d *kafkago.Dialer) SpillOption {
	return func(c *spillConfig) error {
		if d == nil {
			return invalid("nil dialer")
		}
		c.dialer = d
		return nil
	}
}

// SpillCursorGroup sets the consumer group whose committed offsets on the
// spill topic are the partitions' floors (every record of the group below
// is settled), and on old per-tenant spill topics their lanes' cursors. No
// member ever joins it.
// Default: "<group>" + DefaultSpillGroupSuffix.
func SpillCursorGroup(name string) SpillOption {
	return func(c *spillConfig) error {
		if name == "" {
			return invalid("empty spill cursor group")
		}
		c.cursorGroup = name
		return nil
	}
}

// SpillReplication sets the replication factor of the spill topics the
// log creates. Default: the source topic's.
func SpillReplication(n int) SpillOption {
	return func(c *spillConfig) error {
		if n < 1 {
			return invalid("spill replication factor %d is not positive", n)
		}
		c.replication = n
		return nil
	}
}

// SpillRetention sets retention.ms of the spill topics the log creates; d
// < 0 means no time limit (-1). A spilled message not re-fed within it is
// deleted by the broker: lost. Default: the source topic's retention.ms,
// so a spilled message lives at least as long as the source would have
// kept it unconsumed (its clock restarts at the spill); the broker's
// default when the source's may not be read.
func SpillRetention(d time.Duration) SpillOption {
	return func(c *spillConfig) error {
		switch {
		case d == 0:
			return invalid("spill retention 0; use a negative value for no limit")
		case d > 0 && d < time.Millisecond:
			return invalid("spill retention %v is below Kafka's unit (1ms)", d)
		}
		c.retention = d
		return nil
	}
}

// SpillFetchBytes sets how many bytes one Read asks the broker for (a
// larger record batch still comes back whole). Default:
// DefaultSpillFetchBytes (1 MiB).
func SpillFetchBytes(n int) SpillOption {
	return func(c *spillConfig) error {
		if n < 1 {
			return invalid("spill fetch bytes %d is not positive", n)
		}
		c.fetchBytes = n
		return nil
	}
}

// SpillReadAhead bounds, in bytes across lanes, the spill records a log
// keeps decoded between Reads: a fetch returns whole record batches (an
// Append's, up to 256 records), while the engine reads a lane a window at
// a time, so what one Read fetched beyond its limit is kept for the next
// Read of that lane (the least recently read lane's records are dropped
// first). 0 keeps nothing: every Read fetches. Default:
// DefaultSpillReadAhead (8 MiB).
func SpillReadAhead(n int) SpillOption {
	return func(c *spillConfig) error {
		if n < 0 {
			return invalid("spill read-ahead %d is negative", n)
		}
		c.readAhead = n
		return nil
	}
}

// SpillLogger sets the logger for entries lost to retention and skipped
// foreign records. Default: slog.Default().
func SpillLogger(l *slog.Logger) SpillOption {
	return func(c *spillConfig) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	}
}

// A SpillLog keeps the messages a tenant could not make progress with, in
// order, in a spill topic shared by the source's tenants: a
// consumer.SpillLog. When a tenant's breaker stays open past its parked
// bound, a message of it holds its partition's commit for StuckAfter, or
// its backlog passes its share of the partition, the engine appends its
// messages and settles the originals only once every in-sync replica
// acknowledged them, so the source partition's commit moves on; once the
// tenant recovers the engine reads them back, oldest first, before the
// tenant's live messages, and commits the lane's cursor past what it
// settled.
//
// # Layout
//
// A source S has one spill topic, SpillTopic(S) = "S.spill", with the
// source's partition count: the lane of tenant T in source partition p is
// appended to partition p, so whoever owns source partition p owns its
// lanes, and a lane's records are in order. Each record carries its lane
// (the full tenant key in SpillHeaderTenant, the source partition in
// SpillHeaderPartition) and its consumer group. The topic is created on the
// first spill with the source's replication factor, max.message.bytes
// twice the source's plus 64 KiB (the message plus the ringfence-spill-
// headers, which hold the tenant key), cleanup.policy=delete and the
// source's retention.ms (SpillRetention); an existing one keeps its
// settings, grows with the source, and is refused (ErrNotSpill) when it is
// compacted or its last record is not a spill record.
//
// Cursors. A lane's cursor is a record keyed by the lane in the compacted
// topic SpillCursorTopic(S) = "S.spill-cursors" (same partition count,
// partition p for the lanes of p). Below every lane's cursor lies the
// floor of partition p: the committed offset, on the spill topic, of the
// group "<group>.ringfence-spill" (SpillCursorGroup), which no member ever
// joins. Every record of the group below the floor is settled, so the
// cursor records at or below it are dropped (tombstones, on Pending).
//
// Footprint. Two topics per source topic, each with the source's partition
// count, whatever the number of tenants; one record per lane with progress
// past the floor in the cursor topic.
//
// Reads. Per partition the log keeps an index in memory: the offsets of the
// group's unsettled records, by lane. Pending builds it with one pass from
// the floor to the end (the records of the oldest unsettled lane of the
// partition on, other lanes' and groups' included), and Append keeps it up
// to date; a Read of a lane fetches only from its own records' offsets, so
// the records of a shared partition are fetched about once per lane whose
// records share their record batch. Memory: 8 bytes per unsettled record
// plus one entry per lane (SpillStats.Indexed, SpillStats.Lanes).
//
// Appends. Concurrent Appends of different lanes of one partition are sent
// together, in order, in as few produce requests as the topic's limit
// allows (acks=all); each Append's records stay contiguous and in order.
// A spill record is the original's key, value and headers byte for byte
// followed by the SpillHeader* headers; its Kafka timestamp is the time of
// the spill, so retention counts from then.
//
// Earlier versions kept a topic per tenant, "S.spill.<token>". Pending still
// finds the lanes with entries past their cursor there, and until the
// partition is next assigned such a lane keeps using its old topic (Append,
// Read, Commit) so its order holds; once drained, it moves to the shared
// topic on the next assignment. Such old topics may be deleted once
// Backlog reports them drained (Total 0) while no consumer of the source
// runs. A process of an earlier version does not read the shared topic:
// during a rolling upgrade, what this version spilled for a partition that
// moves back to an old process waits there, out of its tenant's order,
// until a process of this version owns the partition again.
//
// What it costs. A Commit removes nothing: a spilled record stays on the
// broker's disk until retention deletes its segment, re-fed or not (the
// records below the floor are garbage; the topic is shared by the consumer
// groups of the source, so the log does not delete records itself). A
// message that is not re-fed within retention is gone: set SpillRetention
// to outlast your longest outage; Read logs at Error level, and
// SpillStats.Lost counts, positions found below the log start.
//
// SpillLog is safe for concurrent use. It holds no lock across a network
// call.
type SpillLog struct {
	source  string
	group   string
	cursor  string // the cursor group
	brokers []string
	cfg     spillConfig
	log     *slog.Logger
	tr      *kafkago.Transport
	client  *kafkago.Client
	records *wire.Client // reads the spill topics

	shared    string // the spill topic
	cursorLog string // the cursor topic

	sources flight.Group[spillSource] // the source topic -> its shape and settings
	topics  flight.Group[spillTopic]  // spill topic -> what the log knows of it
	tenants flight.Group[string]      // old spill topic with a hashed token -> tenant key
	builds  flight.Group[struct{}]    // partition -> its index being built

	partsMu sync.Mutex
	parts   map[int]*sharedPart // by spill partition

	legacyMu sync.Mutex
	legacy   map[consumer.SpillLane]bool // lanes draining an old per-tenant topic

	ahead readAhead
	// recordBytes is the running average size of a fetched spill record,
	// for sizing fetches (see fetchSize).
	recordBytes atomic.Int64
	skipBudget  time.Duration // see Read; a field so that tests can shorten it
	stats       spillCounters
}

// spillSource is what a SpillLog knows of its source topic.
type spillSource struct {
	partitions  int
	replication int
	limit       int    // max.message.bytes
	retention   string // retention.ms, "" when unknown
}

// spillTopic is what a SpillLog knows of one of its spill topics.
type spillTopic struct {
	partitions int
	limit      int // max.message.bytes
}

// SpillStats counts what a SpillLog did since it was made.
type SpillStats struct {
	Appended      uint64 // records acknowledged by the broker (re-appended copies included)
	AppendedBytes uint64 // their size in record batches
	Produces      uint64 // produce requests that succeeded
	Read          uint64 // spill records returned by Read
	Coalesced     uint64 // Appends sent in a produce request with another lane's
	Skipped       uint64 // records Read or an index build passed over: another group's, or not spill records
	Commits       uint64 // cursor commits
	Created       uint64 // topics created (spill and cursor topics)
	Lost          uint64 // times Read found its cursor below the log start (entries removed by retention)
	AheadHits     uint64 // Reads served from records an earlier Read fetched
	AheadBytes    int    // bytes of records kept for the next Reads now (bound: SpillReadAhead)
	Indexed       int    // unsettled records indexed in memory now (8 bytes each; see SpillLog)
	Lanes         int    // lanes indexed in memory now
	Legacy        int    // lanes draining an old per-tenant spill topic now
}

type spillCounters struct {
	appended, appendedBytes, produces, coalesced, read, skipped, commits, created, lost, aheadHits atomic.Uint64
}

// NewSpillLog returns a SpillLog for the spilled messages of sourceTopic
// read by consumer group group, through brokers (host:port). It validates
// its arguments; nothing connects until the first call.
func NewSpillLog(brokers []string, sourceTopic, group string, opts ...SpillOption) (*SpillLog, error) {
	if err := validBrokers(brokers); err != nil {
		return nil, err
	}
	if err := validTopic(sourceTopic); err != nil {
		return nil, err
	}
	if len(sourceTopic) > MaxSpillSourceLen {
		return nil, invalid("source topic %q is longer than %d characters: its spill cursor topic would pass Kafka's 249", sourceTopic, MaxSpillSourceLen)
	}
	if group == "" {
		return nil, invalid("empty consumer group")
	}
	cfg := spillConfig{dialer: kafkago.DefaultDialer, fetchBytes: DefaultSpillFetchBytes, readAhead: DefaultSpillReadAhead, logger: slog.Default()}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	s := &SpillLog{
		source:  sourceTopic,
		group:   group,
		cursor:  cfg.cursorGroup,
		brokers: append([]string(nil), brokers...),
		cfg:     cfg,
		log:     cfg.logger.With("source", sourceTopic, "group", group),
		tr:      transportFor(cfg.dialer),
		ahead:   readAhead{max: cfg.readAhead},

		shared:     SpillTopic(sourceTopic),
		cursorLog:  SpillCursorTopic(sourceTopic),
		skipBudget: skipBudget,
	}
	if s.cursor == "" {
		s.cursor = group + DefaultSpillGroupSuffix
	}
	s.client = &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: s.tr}
	s.records = wire.NewClient(cfg.dialer, brokers)
	return s, nil
}

// Source returns the source topic.
func (s *SpillLog) Source() string { return s.source }

// CursorGroup returns the consumer group holding the spill cursors.
func (s *SpillLog) CursorGroup() string { return s.cursor }

// Stats returns what the log did so far.
func (s *SpillLog) Stats() SpillStats {
	c := &s.stats
	st := SpillStats{
		Appended: c.appended.Load(), AppendedBytes: c.appendedBytes.Load(), Produces: c.produces.Load(),
		Coalesced: c.coalesced.Load(), Read: c.read.Load(), Skipped: c.skipped.Load(), Commits: c.commits.Load(),
		Created: c.created.Load(), Lost: c.lost.Load(),
		AheadHits: c.aheadHits.Load(), AheadBytes: s.ahead.kept(),
	}
	s.partsMu.Lock()
	parts := make([]*sharedPart, 0, len(s.parts))
	for _, sp := range s.parts {
		parts = append(parts, sp)
	}
	s.partsMu.Unlock()
	for _, sp := range parts {
		sp.mu.Lock()
		if x := sp.idx; x != nil {
			st.Indexed += x.records
			st.Lanes += len(x.lanes)
		}
		sp.mu.Unlock()
	}
	s.legacyMu.Lock()
	st.Legacy = len(s.legacy)
	s.legacyMu.Unlock()
	return st
}

// Close closes the log's idle connections.
func (s *SpillLog) Close() error {
	s.tr.CloseIdleConnections()
	s.records.Close()
	return nil
}

// checkLane refuses a lane of another source.
func (s *SpillLog) checkLane(lane consumer.SpillLane) error {
	if lane.Partition.Topic != s.source {
		return fmt.Errorf("kafka: spill lane of topic %q given to the spill log of %q", lane.Partition.Topic, s.source)
	}
	if lane.Partition.ID < 0 {
		return fmt.Errorf("kafka: spill lane of partition %d", lane.Partition.ID)
	}
	return nil
}

// legacyTopic returns the old per-tenant topic of lane when the lane is
// draining it (see SpillLog), else "".
func (s *SpillLog) legacyTopic(lane consumer.SpillLane) string {
	s.legacyMu.Lock()
	defer s.legacyMu.Unlock()
	if s.legacy[lane] {
		return legacySpillTopic(s.source, lane.Tenant)
	}
	return ""
}

// hashedTenant returns the tenant key to write in SpillHeaderTenant: the key
// when its token is hashed (the topic name does not say it), else "".
func hashedTenant(tenant string) string {
	if _, ok, err := dlq.ParseTenantToken(dlq.TenantToken(tenant)); err == nil && !ok {
		return tenant
	}
	return ""
}

// Append writes msgs to partition p of the spill topic (created on first
// use), in order, and returns once every in-sync replica acknowledged each
// of them. Appends of other lanes of p that wait at the same time go out in
// the same produce requests (see SpillLog). On an error none of msgs counts
// as appended (a prefix of them may have been: the engine drops such copies
// when it reads them back).
func (s *SpillLog) Append(ctx context.Context, lane consumer.SpillLane, msgs []*consumer.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := s.checkLane(lane); err != nil {
		return err
	}
	if topic := s.legacyTopic(lane); topic != "" {
		return s.appendLegacy(ctx, topic, lane, msgs)
	}
	return s.appendShared(ctx, lane, msgs)
}

// appendLegacy is Append to a lane's old per-tenant topic.
func (s *SpillLog) appendLegacy(ctx context.Context, topic string, lane consumer.SpillLane, msgs []*consumer.Message) error {
	tenant := hashedTenant(lane.Tenant)
	recs := make([]spillRec, len(msgs))
	for i, m := range msgs {
		recs[i] = encodeSpill(m, s.group, tenant, tenant != "")
	}
	p := int(lane.Partition.ID)
	now := time.Now()
	retried := false
	for start := 0; start < len(recs); {
		tctx, cancel := context.WithTimeout(ctx, opTimeout)
		t, err := s.topic(tctx, topic, p)
		cancel()
		if err != nil {
			return err
		}
		end, size := chunk(recs, start, t.limit)
		if end == start {
			// One record alone does not fit: raise the topic's limit.
			need := batchOverhead + recordSizeAt(recs[start].body, 0)
			if need > maxTopicLimit {
				return fmt.Errorf("kafka: spill record for %s is %d bytes, more than a produce request may carry (%d): %w", topic, need, maxTopicLimit, dlq.ErrUnwritable)
			}
			rctx, cancel := context.WithTimeout(ctx, opTimeout)
			err := s.raise(rctx, topic, t, need)
			cancel()
			if err != nil {
				return err
			}
			continue
		}
		batch := make([]kafkago.Record, end-start)
		for i, r := range recs[start:end] {
			batch[i] = kafkago.Record{Time: now, Key: kafkago.NewBytes(r.key), Value: kafkago.NewBytes(r.value), Headers: r.headers}
		}
		pctx, cancel := context.WithTimeout(ctx, produceTimeout)
		_, err = produceBatch(pctx, s.client, topic, p, batch)
		cancel()
		if err != nil {
			if tooLarge(err) && !retried {
				// The topic's limit may have been lowered since it was
				// read: read it again and size the rest anew.
				retried = true
				s.topics.Forget(topic, nil)
				continue
			}
			if cacheMiss(err) || errors.Is(err, kafkago.UnknownTopicOrPartition) {
				// Made by another process and unknown to our metadata
				// cache yet, or deleted: look again (and create it
				// again) on the next call.
				s.topics.Forget(topic, nil)
			}
			return fmt.Errorf("kafka: spill to %s/%d: %w", topic, p, err)
		}
		s.stats.produces.Add(1)
		s.stats.appended.Add(uint64(end - start))
		s.stats.appendedBytes.Add(uint64(size))
		start = end
	}
	return nil
}

// produceTimeout bounds one produce request of Append, acknowledgement by
// every in-sync replica included.
const produceTimeout = 60 * time.Second

// chunk returns the end of the longest run of recs from start that fits a
// record batch of at most limit bytes, and the batch's size; end == start
// when recs[start] alone does not fit.
func chunk(recs []spillRec, start, limit int) (end, size int) {
	size = batchOverhead
	end = start
	for i := start; i < len(recs); i++ {
		n := recordSizeAt(recs[i].body, i-start)
		if size+n > limit {
			break
		}
		size += n
		end = i + 1
	}
	return end, size
}

func tooLarge(err error) bool {
	return errors.Is(err, kafkago.MessageSizeTooLarge) || errors.Is(err, kafkago.RecordListTooLarge)
}

// raise sets topic's max.message.bytes to need.
func (s *SpillLog) raise(ctx context.Context, topic string, t spillTopic, need int) error {
	if err := setTopicLimit(ctx, s.client, topic, need); err != nil {
		if refused(err) {
			return fmt.Errorf("kafka: spill record is %d bytes, more than %s accepts (max.message.bytes %d), and the limit may not be raised: %w: %w", need, topic, t.limit, dlq.ErrUnwritable, err)
		}
		return err
	}
	t.limit = need
	s.topics.Set(topic, t)
	return nil
}

// Commit moves the cursor of lane to next: entries below it are settled.
// It writes the lane's record in the cursor topic, and moves the floor of
// the partition when the lane held its oldest unsettled record; the
// entries stay in the topic until retention removes them.
func (s *SpillLog) Commit(ctx context.Context, lane consumer.SpillLane, next int64) error {
	if err := s.checkLane(lane); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if topic := s.legacyTopic(lane); topic != "" {
		if err := commitOffsets(ctx, s.client, s.cursor, topic, map[int]int64{int(lane.Partition.ID): next}); err != nil {
			return err
		}
		s.stats.commits.Add(1)
		return nil
	}
	return s.commitShared(ctx, lane, next)
}

var _ consumer.SpillLog = (*SpillLog)(nil)
