package kafka

// Reading a DLQ topic: the records past a cursor, the markers among them,
// and moving the cursor.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/dlq"
)

// tenantView reads the tenant's records past its cursor.
func (q *DLQ) tenantView(ctx context.Context, tenant string) (view, error) {
	keep := func(r *dlq.Record) bool { return r.Bucket() == tenant }
	if q.cfg.shared != "" {
		group := q.cfg.cursorGroup + "." + dlq.TenantToken(tenant)
		v, err := q.read(ctx, q.cfg.shared, group, keep)
		if errors.Is(err, kafkago.UnknownTopicOrPartition) {
			return view{}, nil
		}
		return v, err
	}
	topic := dlq.KafkaTopic(q.source, tenant)
	if err := validTopic(topic); err != nil {
		return view{}, err
	}
	// A hashed token is shared in theory only; keep the tenant's own.
	v, err := q.read(ctx, topic, q.cfg.cursorGroup, keep)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return view{}, nil
	}
	return v, err
}

// readShared groups the shared topic's records by tenant, each from its
// own cursor.
func (q *DLQ) readShared(ctx context.Context) (map[string][]entry, error) {
	v, err := q.read(ctx, q.cfg.shared, "", nil)
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
			group := q.cfg.cursorGroup + "." + dlq.TenantToken(tenant)
			if cur, err = q.cursor(ctx, group, v.topic, v.ends); err != nil {
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

// tenantTopics lists the source's per-tenant DLQ topics. kafka-go's
// transport would answer from its metadata cache, up to 6s behind a topic
// a DLQ made since (a tenant's first dead letter), so the listing renews
// the transport first: its first Metadata comes from the broker. A
// listing is an operator's request (the CLI's list, a console page), not a
// loop, so one new connection each is cheap.
func (q *DLQ) tenantTopics(ctx context.Context) ([]string, error) {
	q.tr.renew()
	resp, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("kafka: list topics: %w", err)
	}
	var out []string
	for _, t := range resp.Topics {
		src, tok, ok := dlq.SplitKafkaTopic(t.Name)
		if !ok || src != q.source {
			continue
		}
		if _, _, err := dlq.ParseTenantToken(tok); err != nil {
			continue // not a topic a DLQ names
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
func (q *DLQ) read(ctx context.Context, topic, group string, keep func(*dlq.Record) bool) (view, error) {
	v := view{topic: topic, group: group}
	starts, ends, err := q.bounds(ctx, topic)
	if err != nil {
		return v, err
	}
	v.ends = ends
	cur := map[int]int64{}
	if group != "" {
		if cur, err = q.cursor(ctx, group, topic, ends); err != nil {
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
			err := q.readPartition(ctx, topic, p, starts[p], starts[p]+1, func(m *fetched) error {
				return checkRingfence(topic, p, m)
			})
			if err != nil {
				return v, err
			}
		}
		err := q.readPartition(ctx, topic, p, from, ends[p], func(m *fetched) error {
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
func (q *DLQ) cursor(ctx context.Context, group, topic string, ends map[int]int64) (map[int]int64, error) {
	req := &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}}
	for p := range ends {
		req.Topics[topic] = append(req.Topics[topic], p)
	}
	resp, err := q.client.OffsetFetch(ctx, req)
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
func (q *DLQ) advance(ctx context.Context, v view, done map[letter]bool) error {
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
	return q.commit(ctx, v.group, v.topic, next)
}

func (q *DLQ) commit(ctx context.Context, group, topic string, offsets map[int]int64) error {
	return commitOffsets(ctx, q.client, group, topic, offsets)
}

// commitOffsets commits offsets of topic's partitions for group, outside
// any generation (a "simple" commit, accepted while the group has no
// member).
func commitOffsets(ctx context.Context, cl *kafkago.Client, group, topic string, offsets map[int]int64) error {
	req := &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafkago.OffsetCommit{}}
	for p, off := range offsets {
		req.Topics[topic] = append(req.Topics[topic], kafkago.OffsetCommit{Partition: p, Offset: off})
	}
	resp, err := cl.OffsetCommit(ctx, req)
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

// readPartition calls fn for each record of topic/partition in [from, to)
// until fn returns an error.
func (q *DLQ) readPartition(ctx context.Context, topic string, partition int, from, to int64, fn func(*fetched) error) error {
	o := wire.FetchOptions{MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: 100 * time.Millisecond}
	return readRange(ctx, q.records, topic, partition, from, to, o, fn)
}
