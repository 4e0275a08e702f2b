package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/dlq"
)

// replayChunk is how many records Replay republishes before it advances
// the cursor: the most a crash mid-replay can duplicate.
const replayChunk = 100

// Inspector lists, peeks, replays and purges the dead letters of one
// source topic. "Removing" a record advances a committed cursor (see the
// package documentation). Inspector is safe for concurrent use, but two
// inspectors replaying the same tenant at once may both republish a record.
type Inspector struct {
	source  string
	brokers []string
	cfg     sinkConfig
	client  *kafkago.Client
	w       *kafkago.Writer
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
		source:  source,
		brokers: append([]string(nil), brokers...),
		cfg:     cfg,
		client:  &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr},
		w: &kafkago.Writer{
			Addr:         kafkago.TCP(brokers...),
			Balancer:     samePartition{},
			RequiredAcks: kafkago.RequireAll,
			BatchTimeout: cfg.batchTimeout,
			BatchSize:    replayChunk,
			Transport:    tr,
		},
	}, nil
}

// Close closes the replay writer.
func (in *Inspector) Close() error { return in.w.Close() }

// entry is one dead letter with where it lives.
type entry struct {
	rec       dlq.Record
	topic     string
	partition int
	offset    int64
}

// view is what lies beyond the cursor in one DLQ topic for one cursor
// group.
type view struct {
	topic   string
	group   string
	entries []entry
	ends    map[int]int64 // high watermark per partition at read time
}

// Tenants lists every tenant with dead letters past the cursor.
func (in *Inspector) Tenants(ctx context.Context) ([]dlq.TenantSummary, error) {
	var byTenant map[string][]entry
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
		byTenant = map[string][]entry{}
		for _, topic := range topics {
			v, err := in.read(ctx, topic, in.cfg.cursorGroup, nil, 0)
			if err != nil {
				return nil, err
			}
			for _, e := range v.entries {
				b := e.rec.Bucket()
				byTenant[b] = append(byTenant[b], e)
			}
		}
	}
	out := make([]dlq.TenantSummary, 0, len(byTenant))
	for tenant, es := range byTenant {
		if len(es) > 0 {
			out = append(out, summarize(tenant, es))
		}
	}
	slices.SortFunc(out, func(a, b dlq.TenantSummary) int { return cmp.Compare(a.Token, b.Token) })
	return out, nil
}

func summarize(tenant string, es []entry) dlq.TenantSummary {
	s := dlq.TenantSummary{Tenant: tenant, Token: dlq.TenantToken(tenant), Count: len(es)}
	reasons := map[dlq.Reason]int{}
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
		reasons[e.rec.Reason]++
	}
	s.Newest = newest
	best := 0
	for r, n := range reasons {
		if n > best || n == best && r < s.Reason {
			s.Reason, best = r, n
		}
	}
	return s
}

// Peek returns up to n of the tenant's oldest records past the cursor
// (n <= 0: all).
func (in *Inspector) Peek(ctx context.Context, tenant string, n int) ([]dlq.Record, error) {
	es, _, err := in.tenantEntries(ctx, tenant, n)
	if err != nil {
		return nil, err
	}
	out := make([]dlq.Record, len(es))
	for i := range es {
		out[i] = es[i].rec
	}
	return out, nil
}

// Replay republishes the tenant's records to their source topic, on their
// original partition, with the redrive count raised, and advances the
// cursor past each chunk only after the broker acknowledged it.
func (in *Inspector) Replay(ctx context.Context, tenant string, opt dlq.ReplayOptions) ([]dlq.Record, error) {
	es, v, err := in.tenantEntries(ctx, tenant, opt.Limit)
	if err != nil {
		return nil, err
	}
	var moved []dlq.Record
	if opt.DryRun {
		for _, e := range es {
			moved = append(moved, e.rec)
		}
		return moved, nil
	}
	for len(es) > 0 {
		chunk := es[:min(replayChunk, len(es))]
		es = es[len(chunk):]
		msgs := make([]kafkago.Message, len(chunk))
		for i, e := range chunk {
			topic := e.rec.Source
			if topic == "" {
				topic = in.source
			}
			msgs[i] = kafkago.Message{
				Topic:     topic,
				Partition: int(e.rec.Partition),
				Key:       e.rec.Key,
				Value:     e.rec.Value,
				Headers:   toKafkaHeaders(e.rec.ReplayHeaders()),
			}
		}
		if err := in.w.WriteMessages(ctx, msgs...); err != nil {
			return moved, fmt.Errorf("kafka: replay to %s: %w", in.source, err)
		}
		if err := in.advance(ctx, v.group, chunk); err != nil {
			// Republished but still in the DLQ: a later replay duplicates
			// them, nothing is lost.
			return moved, err
		}
		for _, e := range chunk {
			moved = append(moved, e.rec)
		}
	}
	return moved, nil
}

// Purge advances the tenant's cursor past all its records and returns how
// many there were. With DeleteDrained, a drained per-tenant topic is
// deleted.
func (in *Inspector) Purge(ctx context.Context, tenant string) (int, error) {
	es, v, err := in.tenantEntries(ctx, tenant, 0)
	if err != nil {
		return 0, err
	}
	if len(es) > 0 {
		if err := in.advance(ctx, v.group, es); err != nil {
			return 0, err
		}
	}
	if in.cfg.deleteDrain && in.cfg.shared == "" && v.topic != "" {
		if err := in.deleteDrained(ctx, v); err != nil {
			return len(es), err
		}
	}
	return len(es), nil
}

// deleteDrained deletes v's topic if nothing arrived since it was read.
// The cursor is first reset to 0 so that a topic of the same name created
// later is read from its start whether or not the broker drops the
// deleted topic's offsets.
func (in *Inspector) deleteDrained(ctx context.Context, v view) error {
	_, ends, err := in.bounds(ctx, v.topic)
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

// tenantEntries reads up to limit (<= 0: all) of tenant's entries past its
// cursor.
func (in *Inspector) tenantEntries(ctx context.Context, tenant string, limit int) ([]entry, view, error) {
	if in.cfg.shared != "" {
		group := in.cfg.cursorGroup + "." + dlq.TenantToken(tenant)
		v, err := in.read(ctx, in.cfg.shared, group, func(r *dlq.Record) bool { return r.Bucket() == tenant }, limit)
		return v.entries, v, err
	}
	topic := dlq.KafkaTopic(in.source, tenant)
	if err := validTopic(topic); err != nil {
		return nil, view{}, err
	}
	v, err := in.read(ctx, topic, in.cfg.cursorGroup, nil, limit)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return nil, view{}, nil
	}
	// A hashed token is shared in theory only; keep the tenant's own.
	var own []entry
	for _, e := range v.entries {
		if e.rec.Bucket() == tenant {
			own = append(own, e)
		}
	}
	v.entries = own
	return own, v, err
}

// readShared groups the shared topic's records by tenant, each from its
// own cursor.
func (in *Inspector) readShared(ctx context.Context) (map[string][]entry, error) {
	v, err := in.read(ctx, in.cfg.shared, "", nil, 0)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cursors := map[string]map[int]int64{}
	out := map[string][]entry{}
	for _, e := range v.entries {
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

// read returns topic's records past group's cursor (all records when group
// is empty) that keep returns true for, up to limit (<= 0: all).
func (in *Inspector) read(ctx context.Context, topic, group string, keep func(*dlq.Record) bool, limit int) (view, error) {
	v := view{topic: topic, group: group}
	starts, ends, err := in.bounds(ctx, topic)
	if err != nil {
		return v, err
	}
	v.ends = ends
	if group != "" {
		cur, err := in.cursor(ctx, group, topic, ends)
		if err != nil {
			return v, err
		}
		for p, c := range cur {
			starts[p] = max(starts[p], c)
		}
	}
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	for _, p := range parts {
		err := in.readPartition(ctx, topic, p, starts[p], ends[p], func(m *kafkago.Message) bool {
			rec, err := dlq.DecodeRecord(m.Key, m.Value, fromKafkaHeaders(m.Headers))
			if err != nil {
				return true // not a dead letter (or from a broken writer): skip
			}
			rec.Time, rec.Position = m.Time, m.Offset
			if keep != nil && !keep(&rec) {
				return true
			}
			v.entries = append(v.entries, entry{rec: rec, topic: topic, partition: p, offset: m.Offset})
			return limit <= 0 || len(v.entries) < limit
		})
		if err != nil {
			return v, err
		}
		if limit > 0 && len(v.entries) >= limit {
			break
		}
	}
	if len(parts) > 1 {
		slices.SortStableFunc(v.entries, func(a, b entry) int { return a.rec.Time.Compare(b.rec.Time) })
	}
	return v, nil
}

// bounds returns each partition's first and next offset.
func (in *Inspector) bounds(ctx context.Context, topic string) (starts, ends map[int]int64, err error) {
	md, err := in.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
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
	resp, err := in.client.ListOffsets(ctx, req)
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

// advance moves group's cursor past every entry in es.
func (in *Inspector) advance(ctx context.Context, group string, es []entry) error {
	next := map[int]int64{}
	topic := es[0].topic
	for _, e := range es {
		next[e.partition] = max(next[e.partition], e.offset+1)
	}
	return in.commit(ctx, group, topic, next)
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

// readPartition calls fn for each message of topic/partition in [from, to)
// until fn returns false.
func (in *Inspector) readPartition(ctx context.Context, topic string, partition int, from, to int64, fn func(*kafkago.Message) bool) error {
	if from >= to {
		return nil
	}
	var conn *kafkago.Conn
	var errs []error
	for _, b := range in.brokers {
		c, err := in.cfg.dialer.DialLeader(ctx, "tcp", b, topic, partition)
		if err == nil {
			conn = c
			break
		}
		errs = append(errs, err)
	}
	if conn == nil {
		return fmt.Errorf("kafka: read %s/%d: %w", topic, partition, errors.Join(errs...))
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	offset := from
	for stalls := 0; offset < to && stalls < 3; {
		if _, err := conn.Seek(offset, kafkago.SeekAbsolute|kafkago.SeekDontCheck); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		batch := conn.ReadBatchWith(kafkago.ReadBatchConfig{MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond})
		before := offset
		var err error
		for offset < to {
			var m kafkago.Message
			if m, err = batch.ReadMessage(); err != nil {
				break
			}
			if m.Offset < offset {
				continue
			}
			offset = m.Offset + 1
			if !fn(&m) {
				_ = batch.Close()
				return nil
			}
		}
		cerr := batch.Close()
		if err == nil || errors.Is(err, io.EOF) {
			err = cerr
		}
		if err != nil && !errors.Is(err, io.EOF) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kafka: read %s/%d at %d: %w", topic, partition, offset, err)
		}
		if offset == before {
			stalls++ // only control records or a gap left: give up on the rest
		} else {
			stalls = 0
		}
	}
	return nil
}

// samePartition sends a replayed message back to the partition it came
// from when that still exists, keeping a tenant's messages together.
type samePartition struct{}

func (samePartition) Balance(m kafkago.Message, partitions ...int) int {
	for _, p := range partitions {
		if p == m.Partition {
			return p
		}
	}
	return (&kafkago.Hash{}).Balance(m, partitions...)
}

var (
	_ dlq.Sink      = (*Sink)(nil)
	_ dlq.Inspector = (*Inspector)(nil)
)
