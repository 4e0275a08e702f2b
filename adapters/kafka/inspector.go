package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
	"github.com/ringfence/ringfence/internal/flight"
)

const (
	// replayChunk is how many dead letters Replay republishes before it
	// marks them moved and advances the cursor: the most a crash mid-replay
	// can duplicate.
	replayChunk = 100
	// markerIDs caps how many IDs one MarkerMoved record lists.
	markerIDs = 5000
	// fetchMaxBytes is what one fetch of a DLQ partition asks for; a
	// larger record still comes back whole (a broker returns at least one
	// batch).
	fetchMaxBytes = 16 << 20
	// fetchStalls is how many fetches in a row may return nothing new before
	// a read gives up on the rest of a partition (a gap, or only control
	// records left).
	fetchStalls = 3
)

// Inspector lists, peeks, replays and purges the dead letters of one
// source topic. "Removing" a record advances a committed cursor (see the
// package documentation). Inspector is safe for concurrent use, but two
// inspectors replaying the same tenant at once may both republish a record.
//
// A topic is read as a DLQ only when every record the Inspector reads in it
// carries ringfence- headers (a dead letter or a marker), including the
// first record of each partition: anything else is refused with an error
// wrapping dlq.ErrNotDLQ before anything is changed.
type Inspector struct {
	source string
	cfg    sinkConfig
	tr     *kafkago.Transport
	client *kafkago.Client
	limits flight.Group[int] // source topic -> max.message.bytes, for replays
}

// NewInspector returns an Inspector for the dead letters of source, reached
// through brokers (host:port). It takes the Sink's options (the shared
// topic, the dialer) and CursorGroup and DeleteDrained.
func NewInspector(brokers []string, source string, opts ...SinkOption) (*Inspector, error) {
	cfg, err := buildSinkConfig(brokers, opts)
	if err != nil {
		return nil, err
	}
	if err := validTopic(source); err != nil {
		return nil, err
	}
	tr := transportFor(cfg.dialer)
	return &Inspector{
		source: source,
		cfg:    cfg,
		tr:     tr,
		client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr},
	}, nil
}

// Close closes the inspector's idle connections.
func (in *Inspector) Close() error {
	in.tr.CloseIdleConnections()
	return nil
}

// Topics returns the source's DLQ topics that exist: the per-tenant topics
// "<source>.dlq.<token>", or the shared topic. None means that nothing was
// ever dead-lettered from this source (or the source is misspelt).
func (in *Inspector) Topics(ctx context.Context) ([]string, error) {
	if in.cfg.shared == "" {
		return in.tenantTopics(ctx)
	}
	_, ends, err := bounds(ctx, in.client, in.cfg.shared)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) || err == nil && len(ends) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []string{in.cfg.shared}, nil
}

// entry is one dead-letter record with where it lives.
type entry struct {
	rec       dlq.Record
	partition int
	offset    int64
	moved     bool // a MarkerMoved lists its dead letter
}

// letter is what identifies a dead letter in a DLQ: its tenant's token and
// its ID, or for a record without an ID its position.
type letter struct {
	token string
	id    string
}

func letterOf(e *entry) letter {
	l := letter{token: dlq.TenantToken(e.rec.Bucket())}
	if id, ok := e.rec.ID(); ok {
		l.id = id.String()
	} else {
		l.id = "@" + strconv.Itoa(e.partition) + "/" + strconv.FormatInt(e.offset, 10)
	}
	return l
}

// view is what lies beyond the cursor in one DLQ topic for one cursor
// group: every dead-letter record kept, moved or not, in time order.
type view struct {
	topic string
	group string
	all   []entry
	ends  map[int]int64 // high watermark per partition at read time
}

// deadLetter is one dead letter: its first copy, with Copies listing all.
type deadLetter struct {
	l   letter
	rec dlq.Record
}

// collapse returns one deadLetter per letter among es that is not moved,
// in order of first copy. It is dlq.Collapse, keyed by letter so that a
// record without an ID is told apart by its partition too.
func collapse(es []entry) []deadLetter {
	at := map[letter]int{}
	var out []deadLetter
	for i := range es {
		e := &es[i]
		if e.moved {
			continue
		}
		l := letterOf(e)
		c := dlq.Copy{Position: e.offset, Time: e.rec.Time}
		if j, ok := at[l]; ok {
			out[j].rec.Copies = append(out[j].rec.Copies, c)
			continue
		}
		at[l] = len(out)
		r := e.rec
		r.Copies = []dlq.Copy{c}
		out = append(out, deadLetter{l: l, rec: r})
	}
	return out
}

func records(ls []deadLetter) []dlq.Record {
	out := make([]dlq.Record, len(ls))
	for i := range ls {
		out[i] = ls[i].rec
	}
	return out
}

// Tenants lists every tenant with dead letters past the cursor, sorted by
// raw key. Copies of one message count once in Count.
func (in *Inspector) Tenants(ctx context.Context) ([]dlq.TenantSummary, error) {
	byTenant := map[string][]entry{}
	if in.cfg.shared != "" {
		all, err := in.readShared(ctx)
		if err != nil {
			return nil, err
		}
		byTenant = all
	} else {
		topics, err := in.tenantTopics(ctx)
		if err != nil {
			return nil, err
		}
		for _, topic := range topics {
			v, err := in.read(ctx, topic, in.cfg.cursorGroup, nil)
			if err != nil {
				return nil, err
			}
			for _, e := range v.all {
				if !e.moved {
					b := e.rec.Bucket()
					byTenant[b] = append(byTenant[b], e)
				}
			}
		}
	}
	out := make([]dlq.TenantSummary, 0, len(byTenant))
	for tenant, es := range byTenant {
		if len(es) > 0 {
			out = append(out, summarize(tenant, es))
		}
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// summarize describes one tenant's records (copies included, none moved).
func summarize(tenant string, es []entry) dlq.TenantSummary {
	letters := collapse(es)
	s := dlq.TenantSummary{Tenant: tenant, Token: dlq.TenantToken(tenant), Count: len(letters), Records: len(es)}
	var newest time.Time
	for i, e := range es {
		t := e.rec.Time
		if i == 0 || t.Before(s.Oldest) {
			s.Oldest = t
		}
		if i == 0 || !t.Before(newest) {
			newest = t
			s.LastError = e.rec.Error
		}
	}
	s.Newest = newest
	reasons := map[dlq.Reason]int{}
	for _, l := range letters {
		reasons[l.rec.Reason]++
	}
	best := 0
	for r, n := range reasons {
		if n > best || n == best && r < s.Reason {
			s.Reason, best = r, n
		}
	}
	return s
}

// Peek returns up to n of the tenant's oldest dead letters past the cursor
// (n <= 0: all), one record per dead letter with its copies listed.
func (in *Inspector) Peek(ctx context.Context, tenant string, n int) ([]dlq.Record, error) {
	v, err := in.tenantView(ctx, tenant)
	if err != nil {
		return nil, err
	}
	letters := collapse(v.all)
	if n > 0 && len(letters) > n {
		letters = letters[:n]
	}
	return records(letters), nil
}

// Replay republishes the tenant's dead letters to their source topic, on
// their original partition, once each, with the redrive count raised (left
// out for a message that would no longer fit its source topic with it).
// After each chunk is acknowledged it writes a MarkerMoved record listing
// the chunk's dead letters (so their other copies are not shown again) and
// advances the cursor past every record that is done.
func (in *Inspector) Replay(ctx context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	v, err := in.tenantView(ctx, tenant)
	if err != nil {
		return nil, err
	}
	letters := collapse(v.all)
	if opt.Limit > 0 && len(letters) > opt.Limit {
		letters = letters[:opt.Limit]
	}
	if opt.DryRun {
		return records(letters), nil
	}
	token := dlq.TenantToken(tenant)
	done := map[letter]bool{}
	var moved []dlq.Record
	for len(letters) > 0 {
		chunk := letters[:min(replayChunk, len(letters))]
		letters = letters[len(chunk):]
		recs := records(chunk)
		if err := in.republish(ctx, recs); err != nil {
			return moved, err
		}
		ls := make(map[letter]bool, len(chunk))
		for _, l := range chunk {
			ls[l.l] = true
		}
		if err := in.markMoved(ctx, v, token, ls); err != nil {
			return moved, fmt.Errorf("%w (republished, still in the DLQ: a later replay will duplicate them)", err)
		}
		for l := range ls {
			done[l] = true
		}
		if err := in.advance(ctx, v, done); err != nil {
			return moved, err // marked moved: not shown again, nothing duplicated
		}
		moved = append(moved, recs...)
	}
	return moved, nil
}

// republish writes recs to their source topics and partitions and waits
// for the acknowledgements.
func (in *Inspector) republish(ctx context.Context, recs []dlq.Record) error {
	type dest struct {
		topic     string
		partition int
	}
	var order []dest
	byDest := map[dest][]kafkago.Message{}
	limits := map[string]int{}
	now := time.Now()
	for i := range recs {
		r := &recs[i]
		d := dest{topic: r.Source, partition: int(r.Partition)}
		if d.topic == "" {
			d.topic = in.source
		}
		limit, err := in.limits.Do(ctx, d.topic, func(ctx context.Context) (int, error) {
			return topicLimit(ctx, in.client, d.topic)
		})
		if err != nil {
			return err
		}
		limits[d.topic] = limit
		m := kafkago.Message{Key: r.Key, Value: r.Value, Headers: toKafkaHeaders(r.ReplayHeaders()), Time: now}
		if batchSize(&m) > limit {
			// The message was at its topic's limit: replay it as it was,
			// without the redrive count.
			m.Headers = m.Headers[:len(m.Headers)-1]
			if n := batchSize(&m); n > limit {
				return fmt.Errorf("kafka: replay dead letter at %d: %d bytes, more than %s accepts (max.message.bytes %d)", r.Position, n, d.topic, limit)
			}
		}
		if _, ok := byDest[d]; !ok {
			order = append(order, d)
		}
		byDest[d] = append(byDest[d], m)
	}
	for _, d := range order {
		limit := limits[d.topic]
		msgs := byDest[d]
		for len(msgs) > 0 {
			n, size := 0, batchOverhead
			for n < len(msgs) {
				// +2: offset deltas past the first record take up to 2
				// more bytes than recordSize counts.
				s := recordSize(&msgs[n]) + 2
				if n > 0 && size+s > limit {
					break
				}
				size += s
				n++
			}
			if err := produceRecords(ctx, in.client, d.topic, d.partition, msgs[:n]...); err != nil {
				return fmt.Errorf("kafka: replay to %s/%d: %w", d.topic, d.partition, err)
			}
			msgs = msgs[n:]
		}
	}
	return nil
}

// markMoved writes MarkerMoved records listing ls into the partitions of
// v's topic that hold a copy of them.
func (in *Inspector) markMoved(ctx context.Context, v view, token string, ls map[letter]bool) error {
	ids := map[int][]string{}
	seen := map[int]map[letter]bool{}
	for i := range v.all {
		e := &v.all[i]
		l := letterOf(e)
		if !ls[l] || seen[e.partition][l] {
			continue
		}
		if seen[e.partition] == nil {
			seen[e.partition] = map[letter]bool{}
		}
		seen[e.partition][l] = true
		ids[e.partition] = append(ids[e.partition], l.id)
	}
	hs := []kafkago.Header{
		{Key: dlq.HeaderMarker, Value: []byte(dlq.MarkerMoved)},
		{Key: dlq.HeaderTenantToken, Value: []byte(token)},
	}
	for p, list := range ids {
		for len(list) > 0 {
			part := list[:min(markerIDs, len(list))]
			list = list[len(part):]
			m := kafkago.Message{Headers: hs, Value: []byte(strings.Join(part, "\n")), Time: time.Now()}
			if err := produceRecords(ctx, in.client, v.topic, p, m); err != nil {
				return fmt.Errorf("kafka: mark dead letters moved in %s/%d: %w", v.topic, p, err)
			}
		}
	}
	return nil
}

// movedLetters decodes a MarkerMoved record.
func movedLetters(hs []dlq.Header, value []byte) []letter {
	var token string
	for _, h := range hs {
		if strings.EqualFold(h.Key, dlq.HeaderTenantToken) {
			token = string(h.Value)
		}
	}
	var out []letter
	for id := range strings.SplitSeq(string(value), "\n") {
		if id != "" {
			out = append(out, letter{token: token, id: id})
		}
	}
	return out
}

// Purge removes the tenant's dead letters past the cursor, with their
// copies, and returns how many dead letters there were. It writes a
// MarkerMoved record listing them, so that a copy written later (a
// redelivery dead-lettered again) is not shown, and advances the cursor.
// With DeleteDrained, a drained per-tenant topic is deleted instead of
// marked.
func (in *Inspector) Purge(ctx context.Context, tenant string) (int, error) {
	v, err := in.tenantView(ctx, tenant)
	if err != nil {
		return 0, err
	}
	letters := collapse(v.all)
	deleting := in.cfg.deleteDrain && in.cfg.shared == "" && v.topic != ""
	if len(v.all) > 0 {
		done := make(map[letter]bool, len(letters))
		for _, l := range letters {
			done[l.l] = true
		}
		if len(letters) > 0 && !deleting {
			if err := in.markMoved(ctx, v, dlq.TenantToken(tenant), done); err != nil {
				return 0, err
			}
		}
		if err := in.advance(ctx, v, done); err != nil {
			return 0, err
		}
	}
	if deleting {
		if err := in.deleteDrained(ctx, v); err != nil {
			return len(letters), err
		}
	}
	return len(letters), nil
}

// deleteDrained deletes v's topic if nothing arrived since it was read.
// The cursor is first reset to 0 so that a topic of the same name created
// later is read from its start whether or not the broker drops the
// deleted topic's offsets.
func (in *Inspector) deleteDrained(ctx context.Context, v view) error {
	_, ends, err := bounds(ctx, in.client, v.topic)
	if err != nil {
		return err
	}
	for p, end := range ends {
		if end != v.ends[p] {
			return nil // new dead letters arrived: keep the topic
		}
	}
	zero := map[int]int64{}
	for p := range ends {
		zero[p] = 0
	}
	if err := in.commit(ctx, v.group, v.topic, zero); err != nil {
		return err
	}
	resp, err := in.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{v.topic}})
	if err != nil {
		return fmt.Errorf("kafka: delete drained %s: %w", v.topic, err)
	}
	if err := resp.Errors[v.topic]; err != nil {
		return fmt.Errorf("kafka: delete drained %s: %w", v.topic, err)
	}
	return nil
}

// tenantView reads the tenant's records past its cursor.
func (in *Inspector) tenantView(ctx context.Context, tenant string) (view, error) {
	keep := func(r *dlq.Record) bool { return r.Bucket() == tenant }
	if in.cfg.shared != "" {
		group := in.cfg.cursorGroup + "." + dlq.TenantToken(tenant)
		v, err := in.read(ctx, in.cfg.shared, group, keep)
		if errors.Is(err, kafkago.UnknownTopicOrPartition) {
			return view{}, nil
		}
		return v, err
	}
	topic := dlq.KafkaTopic(in.source, tenant)
	if err := validTopic(topic); err != nil {
		return view{}, err
	}
	// A hashed token is shared in theory only; keep the tenant's own.
	v, err := in.read(ctx, topic, in.cfg.cursorGroup, keep)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return view{}, nil
	}
	return v, err
}

// readShared groups the shared topic's records by tenant, each from its
// own cursor.
func (in *Inspector) readShared(ctx context.Context) (map[string][]entry, error) {
	v, err := in.read(ctx, in.cfg.shared, "", nil)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return map[string][]entry{}, nil
	}
	if err != nil {
		return nil, err
	}
	cursors := map[string]map[int]int64{}
	out := map[string][]entry{}
	for _, e := range v.all {
		if e.moved {
			continue
		}
		tenant := e.rec.Bucket()
		cur, ok := cursors[tenant]
		if !ok {
			group := in.cfg.cursorGroup + "." + dlq.TenantToken(tenant)
			if cur, err = in.cursor(ctx, group, v.topic, v.ends); err != nil {
				return nil, err
			}
			cursors[tenant] = cur
		}
		if e.offset >= cur[e.partition] {
			out[tenant] = append(out[tenant], e)
		}
	}
	return out, nil
}

// tenantTopics lists the source's per-tenant DLQ topics.
func (in *Inspector) tenantTopics(ctx context.Context) ([]string, error) {
	resp, err := in.client.Metadata(ctx, &kafkago.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("kafka: list topics: %w", err)
	}
	var out []string
	for _, t := range resp.Topics {
		src, tok, ok := dlq.SplitKafkaTopic(t.Name)
		if !ok || src != in.source {
			continue
		}
		if _, _, err := dlq.ParseTenantToken(tok); err != nil {
			continue // not a topic the sink names
		}
		out = append(out, t.Name)
	}
	slices.Sort(out)
	return out, nil
}

// read returns topic's dead-letter records past group's cursor (all
// records when group is empty) that keep returns true for, each marked
// moved when a MarkerMoved record of the topic lists it. It fails with
// dlq.ErrNotDLQ when a record it reads, or the first record of a
// partition, carries no ringfence- header.
func (in *Inspector) read(ctx context.Context, topic, group string, keep func(*dlq.Record) bool) (view, error) {
	v := view{topic: topic, group: group}
	starts, ends, err := bounds(ctx, in.client, topic)
	if err != nil {
		return v, err
	}
	v.ends = ends
	cur := map[int]int64{}
	if group != "" {
		if cur, err = in.cursor(ctx, group, topic, ends); err != nil {
			return v, err
		}
	}
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	moved := map[letter]bool{}
	for _, p := range parts {
		from := max(starts[p], cur[p])
		if from > starts[p] && starts[p] < ends[p] {
			// The cursor skips the partition's first record: check it too.
			err := in.readPartition(ctx, topic, p, starts[p], starts[p]+1, func(m *fetched) error {
				return checkRingfence(topic, p, m)
			})
			if err != nil {
				return v, err
			}
		}
		err := in.readPartition(ctx, topic, p, from, ends[p], func(m *fetched) error {
			if err := checkRingfence(topic, p, m); err != nil {
				return err
			}
			if kind, ok := dlq.MarkerKind(m.headers); ok {
				if kind == dlq.MarkerMoved {
					for _, l := range movedLetters(m.headers, m.value) {
						moved[l] = true
					}
				}
				return nil
			}
			rec, err := dlq.DecodeRecord(m.key, m.value, m.headers)
			if err != nil {
				return nil // a malformed record from a broken writer: skip
			}
			rec.Time, rec.Position = m.time, m.offset
			if keep != nil && !keep(&rec) {
				return nil
			}
			v.all = append(v.all, entry{rec: rec, partition: p, offset: m.offset})
			return nil
		})
		if err != nil {
			return v, err
		}
	}
	for i := range v.all {
		v.all[i].moved = moved[letterOf(&v.all[i])]
	}
	if len(parts) > 1 {
		slices.SortStableFunc(v.all, func(a, b entry) int { return a.rec.Time.Compare(b.rec.Time) })
	}
	return v, nil
}

// checkRingfence refuses a record without ringfence- headers.
func checkRingfence(topic string, p int, m *fetched) error {
	for _, h := range m.headers {
		if dlq.IsRingfenceHeader(h.Key) {
			return nil
		}
	}
	return fmt.Errorf("kafka: %s holds a record without ringfence- headers (partition %d, offset %d): %w; refusing to touch it", topic, p, m.offset, dlq.ErrNotDLQ)
}

// bounds returns each partition's first and next offset.
func bounds(ctx context.Context, cl *kafkago.Client, topic string) (starts, ends map[int]int64, err error) {
	md, err := cl.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: metadata of %s: %w", topic, err)
	}
	if len(md.Topics) != 1 {
		return nil, nil, fmt.Errorf("kafka: metadata of %s: %w", topic, kafkago.UnknownTopicOrPartition)
	}
	if err := md.Topics[0].Error; err != nil {
		return nil, nil, fmt.Errorf("kafka: metadata of %s: %w", topic, err)
	}
	req := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	for _, p := range md.Topics[0].Partitions {
		req.Topics[topic] = append(req.Topics[topic], kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: offsets of %s: %w", topic, err)
	}
	starts, ends = map[int]int64{}, map[int]int64{}
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		starts[po.Partition], ends[po.Partition] = po.FirstOffset, po.LastOffset
	}
	return starts, ends, nil
}

// cursor returns group's committed offset per partition of topic (absent
// or -1 read as 0). A cursor past the partition's end is stale (the topic
// was deleted and made again) and reads as 0.
func (in *Inspector) cursor(ctx context.Context, group, topic string, ends map[int]int64) (map[int]int64, error) {
	req := &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}}
	for p := range ends {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	resp, err := in.client.OffsetFetch(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafka: cursor of %s on %s: %w", group, topic, err)
	}
	if errors.Is(resp.Error, kafkago.GroupIdNotFound) {
		return map[int]int64{}, nil // nothing replayed or purged yet
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("kafka: cursor of %s on %s: %w", group, topic, resp.Error)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: cursor of %s on %s/%d: %w", group, topic, p.Partition, p.Error)
		}
		if c := p.CommittedOffset; c > 0 && c <= ends[p.Partition] {
			out[p.Partition] = c
		}
	}
	return out, nil
}

// advance moves v's cursor, on each partition, up to the first record
// whose dead letter is neither done nor moved (past every record read when
// there is none).
func (in *Inspector) advance(ctx context.Context, v view, done map[letter]bool) error {
	next := map[int]int64{}
	for p, end := range v.ends {
		next[p] = end
	}
	for i := range v.all {
		e := &v.all[i]
		if !e.moved && !done[letterOf(e)] {
			next[e.partition] = min(next[e.partition], e.offset)
		}
	}
	return in.commit(ctx, v.group, v.topic, next)
}

func (in *Inspector) commit(ctx context.Context, group, topic string, offsets map[int]int64) error {
	req := &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafkago.OffsetCommit{}}
	for p, off := range offsets {
		req.Topics[topic] = append(req.Topics[topic], kafkago.OffsetCommit{Partition: p, Offset: off})
	}
	resp, err := in.client.OffsetCommit(ctx, req)
	if err != nil {
		return fmt.Errorf("kafka: advance cursor %s on %s: %w", group, topic, err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return fmt.Errorf("kafka: advance cursor %s on %s/%d: %w", group, topic, p.Partition, p.Error)
		}
	}
	return nil
}

// fetched is one record read from a partition.
type fetched struct {
	offset  int64
	time    time.Time
	key     []byte
	value   []byte
	headers []dlq.Header
}

// readPartition calls fn for each record of topic/partition in [from, to)
// until fn returns an error. It reads with kafka-go's Client.Fetch, whose
// decoder keeps a header value's null (nil) apart from an empty one.
func (in *Inspector) readPartition(ctx context.Context, topic string, partition int, from, to int64, fn func(*fetched) error) error {
	offset := from
	for stalls := 0; offset < to && stalls < fetchStalls; {
		resp, err := in.client.Fetch(ctx, &kafkago.FetchRequest{
			Topic: topic, Partition: partition, Offset: offset,
			MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: 100 * time.Millisecond,
		})
		if err == nil {
			err = resp.Error
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kafka: read %s/%d at %d: %w", topic, partition, offset, err)
		}
		before := offset
		err = eachRecord(resp.Records, func(r *kafkago.Record) error {
			if r.Offset < offset || r.Offset >= to {
				return nil
			}
			m, err := readRecord(r)
			if err != nil {
				return err
			}
			offset = r.Offset + 1
			return fn(m)
		})
		if err != nil {
			return err
		}
		if offset == before {
			stalls++ // only control records or a gap left: give up on the rest
		} else {
			stalls = 0
		}
	}
	return nil
}

// eachRecord calls fn for each record of rr and closes it.
func eachRecord(rr kafkago.RecordReader, fn func(*kafkago.Record) error) error {
	if c, ok := rr.(io.Closer); ok {
		defer c.Close()
	}
	for {
		r, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kafka: decode records: %w", err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
}

func readRecord(r *kafkago.Record) (*fetched, error) {
	m := &fetched{offset: r.Offset, time: r.Time}
	var err error
	if m.key, err = readBytes(r.Key); err != nil {
		return nil, err
	}
	if m.value, err = readBytes(r.Value); err != nil {
		return nil, err
	}
	if len(r.Headers) > 0 {
		m.headers = make([]dlq.Header, len(r.Headers))
		for i, h := range r.Headers {
			m.headers[i] = dlq.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m, nil
}

// readBytes reads a record's key or value, keeping nil (null) apart from
// empty.
func readBytes(b kafkago.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	out := make([]byte, b.Len())
	if _, err := io.ReadFull(b, out); err != nil {
		return nil, fmt.Errorf("kafka: read record: %w", err)
	}
	return out, nil
}

var (
	_ dlq.Sink      = (*Sink)(nil)
	_ dlq.Inspector = (*Inspector)(nil)
)
