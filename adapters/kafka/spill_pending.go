package kafka

// Surveying a source's spill logs: Pending for the lanes an earlier owner
// left, Backlog for operators; the shared topic through its index, old
// per-tenant topics through their cursors.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// errFull stops a walk over fetched records once the caller has enough.
var errFull = errors.New("kafka: read full")

// errNoTenantRecord: a spill topic with a hashed token holds no spill
// record, so nothing says whose it is (and nothing of it needs re-feeding).
var errNoTenantRecord = errors.New("kafka: no spill record names the tenant")

type topicPart struct {
	topic string
	part  int
}

// spillPart is the state of one partition of a spill topic.
type spillPart struct {
	topicPart
	first, last int64 // log start and end
	cursor      int64 // where Read(from < 0) starts: the cursor when in [first, last], else first
}

// backlog is how many records lie past the cursor (another group's
// records included).
func (p spillPart) backlog() int64 { return p.last - p.cursor }

// offsetsChunk is how many partitions one ListOffsets call of survey asks
// about. kafka-go sends a request per partition and offset kind, all at
// once, each on a pooled connection of its own: a chunk bounds the
// connections a survey of many spill topics opens.
const offsetsChunk = 64

// survey returns the state of partition part (all partitions for part <
// 0) of every old per-tenant spill topic of the source, sorted, and each
// topic's token. It
// lists the cluster's topics once (directly, not through kafka-go's
// metadata cache, which may not know a topic another process made a
// moment ago), then asks for the cursors in one OffsetFetch and for the
// bounds with ListOffsets, offsetsChunk partitions at a time.
func (s *SpillLog) survey(ctx context.Context, part int) ([]spillPart, map[string]string, error) {
	live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return nil, nil, err
	}
	tokens := map[string]string{}
	var all []topicPart
	want := map[string][]int{}
	for name, sh := range live {
		tok, ok := splitSpillTopic(s.source, name)
		if !ok || part >= sh.partitions {
			continue
		}
		tokens[name] = tok
		for p := range sh.partitions {
			if part < 0 || p == part {
				all = append(all, topicPart{name, p})
				want[name] = append(want[name], p)
			}
		}
	}
	if len(all) == 0 {
		return nil, tokens, nil
	}
	cur, err := s.cursors(ctx, want)
	if err != nil {
		return nil, nil, err
	}
	var out []spillPart
	for len(all) > 0 {
		n := min(len(all), offsetsChunk)
		req := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
		for _, tp := range all[:n] {
			req.Topics[tp.topic] = append(req.Topics[tp.topic], kafkago.FirstOffsetOf(tp.part), kafkago.LastOffsetOf(tp.part))
		}
		all = all[n:]
		resp, err := s.client.ListOffsets(ctx, req)
		if err != nil {
			return nil, nil, fmt.Errorf("kafka: spill topic offsets: %w", err)
		}
		for t, ps := range resp.Topics {
			for _, po := range ps {
				switch {
				case errors.Is(po.Error, kafkago.UnknownTopicOrPartition):
					continue // deleted since it was listed
				case po.Error != nil:
					return nil, nil, fmt.Errorf("kafka: offsets of %s/%d: %w", t, po.Partition, po.Error)
				}
				sp := spillPart{topicPart: topicPart{t, po.Partition}, first: po.FirstOffset, last: po.LastOffset, cursor: po.FirstOffset}
				if c, ok := cur[sp.topicPart]; ok && c >= sp.first && c <= sp.last {
					sp.cursor = c
				}
				out = append(out, sp)
			}
		}
	}
	slices.SortFunc(out, func(a, b spillPart) int {
		if a.topic != b.topic {
			if a.topic < b.topic {
				return -1
			}
			return 1
		}
		return a.part - b.part
	})
	return out, tokens, nil
}

// cursors returns the cursor group's committed offsets on the given
// partitions (absent: none).
func (s *SpillLog) cursors(ctx context.Context, parts map[string][]int) (map[topicPart]int64, error) {
	resp, err := s.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: s.cursor, Topics: parts})
	if err != nil {
		return nil, fmt.Errorf("kafka: spill cursors of %s: %w", s.cursor, err)
	}
	if errors.Is(resp.Error, kafkago.GroupIdNotFound) {
		return map[topicPart]int64{}, nil
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("kafka: spill cursors of %s: %w", s.cursor, resp.Error)
	}
	out := make(map[topicPart]int64)
	for t, ps := range resp.Topics {
		for _, po := range ps {
			if po.Error != nil && !errors.Is(po.Error, kafkago.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("kafka: spill cursor of %s on %s/%d: %w", s.cursor, t, po.Partition, po.Error)
			}
			if po.Error == nil && po.CommittedOffset >= 0 {
				out[topicPart{t, po.Partition}] = po.CommittedOffset
			}
		}
	}
	return out, nil
}

// Pending returns the lanes of source partition p with entries past their
// cursor: the tenants an earlier process, or the previous owner of p,
// spilled and did not finish. It (re)builds the index of spill partition p
// from the broker (see SpillLog: one pass from the floor to the end),
// drops the cursor records the floor made useless, and looks for lanes
// still draining an old per-tenant topic (one listing of the cluster's
// topics, asking a broker directly, and one OffsetFetch and ListOffsets of
// partition p of each such topic).
func (s *SpillLog) Pending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	if p.Topic != s.source || p.ID < 0 {
		return nil, nil
	}
	// p was (re)assigned: its lanes start again from the broker's state.
	s.ahead.forget(p)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	old, err := s.legacyPending(ctx, p)
	if err != nil {
		return nil, err
	}
	s.legacyMu.Lock()
	for l := range s.legacy {
		if l.Partition == p {
			delete(s.legacy, l)
		}
	}
	for _, l := range old {
		if s.legacy == nil {
			s.legacy = make(map[consumer.SpillLane]bool)
		}
		s.legacy[l] = true
	}
	s.legacyMu.Unlock()

	part := int(p.ID)
	s.part(part).reset()
	sp, err := s.index(ctx, part)
	if err != nil {
		return nil, err
	}
	s.dropCursors(ctx, part, sp)
	sp.mu.Lock()
	var tenants []string
	if sp.idx != nil {
		tenants = sp.idx.pendingLanes()
	}
	sp.mu.Unlock()
	lanes := old
	for _, t := range tenants {
		l := consumer.SpillLane{Tenant: t, Partition: p}
		if !slices.Contains(old, l) {
			lanes = append(lanes, l)
		}
	}
	return lanes, nil
}

// legacyPending returns the lanes of p with records past the cursor in
// their old per-tenant spill topic. A lane whose records past the cursor
// are all another group's is named too; its first Read moves the cursor
// past them.
func (s *SpillLog) legacyPending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	parts, tokens, err := s.survey(ctx, int(p.ID))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, sp := range parts {
		if sp.backlog() > 0 {
			names = append(names, sp.topic)
		}
	}
	// Read asks for their bounds through kafka-go: load them into its cache.
	refreshCache(ctx, s.client, names...)
	lanes := make([]consumer.SpillLane, 0, len(names))
	for _, t := range names {
		tenant, err := s.tenantOf(ctx, t, tokens[t], int(p.ID))
		if errors.Is(err, errNoTenantRecord) {
			s.log.Warn("kafka: spill topic holds records past the cursor, none of them a spill record; ignored", "topic", t, "partition", p.ID)
			continue
		}
		if err != nil {
			return nil, err
		}
		lanes = append(lanes, consumer.SpillLane{Tenant: tenant, Partition: p})
	}
	return lanes, nil
}

// SpillBacklog is what one tenant has past its cursors in one spill topic.
type SpillBacklog struct {
	Tenant string
	// Topic is the spill topic: the shared one, or an old per-tenant one.
	Topic string
	// Partitions holds, by source partition, the records past the
	// cursor. They include copies (a re-appended batch); in an old
	// per-tenant topic, records of other groups too, so they are an upper
	// bound.
	Partitions map[int]int64
	// Total is the sum of Partitions. A topic with Total 0 is drained: it
	// holds only settled records until retention removes them.
	Total int64
}

// Backlog lists the tenants with records past their cursors in the shared
// spill topic, sorted by tenant, then every old per-tenant spill topic of
// the source with what it holds past the cursor, sorted by topic (drained
// ones too: see SpillBacklog.Total). It reads the broker's state only (an
// index built for the purpose, for every partition) and writes nothing.
func (s *SpillLog) Backlog(ctx context.Context) ([]SpillBacklog, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	shared, err := s.sharedBacklog(ctx)
	if err != nil {
		return nil, err
	}
	old, err := s.legacyBacklog(ctx)
	if err != nil {
		return nil, err
	}
	return append(shared, old...), nil
}

// sharedBacklog is Backlog of the shared topic.
func (s *SpillLog) sharedBacklog(ctx context.Context) ([]SpillBacklog, error) {
	live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return nil, err
	}
	sh, ok := live[s.shared]
	if !ok {
		return nil, nil
	}
	refreshCache(ctx, s.client, s.shared, s.cursorLog)
	by := map[string]*SpillBacklog{}
	for p := range sh.partitions {
		x, err := s.buildIndex(ctx, p)
		if err != nil {
			return nil, err
		}
		for t, l := range x.lanes {
			if len(l.offs) == 0 {
				continue
			}
			b := by[t]
			if b == nil {
				b = &SpillBacklog{Tenant: t, Topic: s.shared, Partitions: map[int]int64{}}
				by[t] = b
			}
			b.Partitions[p] = int64(len(l.offs))
			b.Total += int64(len(l.offs))
		}
	}
	out := make([]SpillBacklog, 0, len(by))
	for _, b := range by {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b SpillBacklog) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}

// legacyBacklog is Backlog of the old per-tenant topics.
func (s *SpillLog) legacyBacklog(ctx context.Context) ([]SpillBacklog, error) {
	parts, tokens, err := s.survey(ctx, -1)
	if err != nil {
		return nil, err
	}
	var out []SpillBacklog
	for _, sp := range parts {
		if len(out) == 0 || out[len(out)-1].Topic != sp.topic {
			out = append(out, SpillBacklog{Topic: sp.topic, Partitions: map[int]int64{}})
		}
		b := &out[len(out)-1]
		b.Partitions[sp.part] = sp.backlog()
		b.Total += sp.backlog()
	}
	for i := range out {
		b := &out[i]
		tenant, ok, err := dlq.ParseTenantToken(tokens[b.Topic])
		if err == nil && !ok {
			// Hashed: read the key from a partition that holds records.
			for _, sp := range parts {
				if sp.topic == b.Topic && sp.last > sp.first {
					if full, err := s.tenantOf(ctx, b.Topic, tokens[b.Topic], sp.part); err == nil {
						tenant = full
						break
					}
				}
			}
		}
		b.Tenant = tenant
	}
	return out, nil
}

// tenantOf returns the tenant of topic, a spill topic with token tok: the
// token's key, or for a hashed token the SpillHeaderTenant of a record of
// partition p (whose token must be tok).
func (s *SpillLog) tenantOf(ctx context.Context, topic, tok string, p int) (string, error) {
	tenant, ok, err := dlq.ParseTenantToken(tok)
	if err != nil || ok {
		return tenant, err
	}
	return s.tenants.Do(ctx, topic, func(ctx context.Context) (string, error) {
		first, last, err := s.bounds(ctx, topic, p)
		if err != nil {
			return "", err
		}
		var tenant string
		err = s.scan(ctx, topic, p, first, last, func(f *fetched) bool {
			sp, ok := decodeSpill(f, s.source)
			if ok && sp.tenant != "" && dlq.TenantToken(sp.tenant) == tok {
				tenant = sp.tenant
				return false
			}
			return true
		})
		if err != nil {
			return "", err
		}
		if tenant == "" {
			return "", fmt.Errorf("%w: %s/%d", errNoTenantRecord, topic, p)
		}
		return tenant, nil
	})
}

// scan calls fn for each record of topic/p in [from, to) until fn returns
// false.
func (s *SpillLog) scan(ctx context.Context, topic string, p int, from, to int64, fn func(*fetched) bool) error {
	o := wire.FetchOptions{MaxBytes: s.cfg.fetchBytes, MaxWait: fetchSlack}
	err := readRange(ctx, s.records, topic, p, from, to, o, func(f *fetched) error {
		if !fn(f) {
			return errFull
		}
		return nil
	})
	if errors.Is(err, errFull) {
		return nil
	}
	return err
}
