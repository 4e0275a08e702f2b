package kafka

// Reading spill topics back: Read for the engine's re-feed, Pending for the
// lanes an earlier owner left.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/consumer"
	"github.com/ringfence/ringfence/dlq"
)

// errFull stops a walk over fetched records once Read has enough.
var errFull = errors.New("kafka: read full")

// errNoTenantRecord: a spill topic with a hashed token holds no spill
// record, so nothing says whose it is (and nothing of it needs re-feeding).
var errNoTenantRecord = errors.New("kafka: no spill record names the tenant")

// opTimeout bounds each network call of a SpillLog but Append's produces
// (see produceTimeout): a broker that vanished without closing the
// connection must not hold a spill worker for ever.
const opTimeout = 30 * time.Second

// Read returns up to limit spill records of lane at positions (offsets of
// partition p of the tenant's spill topic) >= from, or, for from < 0, from
// the cursor group's committed offset (the log start when there is none).
// Each comes back as the original: key, value and headers byte for byte,
// topic, partition, offset and time, with Refed set and SpillPos its
// offset. Records that are not this group's spill records are passed over
// (when they lie at the cursor, the cursor is moved past them). Read does
// not wait for new records: at the log's end it returns none at once.
func (s *SpillLog) Read(ctx context.Context, lane consumer.SpillLane, from int64, limit int) ([]*consumer.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	topic, err := s.laneTopic(lane)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	p := int(lane.Partition.ID)
	atCursor := from < 0
	var cursor int64
	if atCursor {
		var exists bool
		cursor, exists, err = s.start(ctx, topic, p)
		if err != nil || !exists {
			return nil, err
		}
		from = cursor
	}
	var out []*consumer.Message
	skipTo := int64(-1) // past the records at the cursor that are not ours
	refreshed := false
	for stalls := 0; len(out) == 0 && stalls < fetchStalls; {
		resp, err := s.client.Fetch(ctx, &kafkago.FetchRequest{
			Topic: topic, Partition: p, Offset: from,
			MinBytes: 0, MaxBytes: int64(s.cfg.fetchBytes), MaxWait: fetchSlack,
		})
		if err == nil && resp.Error != nil {
			err = resp.Error
			closeRecords(resp.Records)
		}
		switch {
		case err == nil:
		case errors.Is(err, kafkago.UnknownTopicOrPartition):
			return nil, nil // nothing was ever spilled (or the topic was deleted)
		case cacheMiss(err) && !refreshed:
			// Our metadata cache does not know the topic yet (another
			// process created it): ask the cluster.
			live, lerr := liveTopics(ctx, s.cfg.dialer, s.brokers)
			if lerr != nil {
				return nil, lerr
			}
			if _, ok := live[topic]; !ok {
				return nil, nil
			}
			refreshCache(ctx, s.client, topic)
			refreshed = true
			continue
		case errors.Is(err, kafkago.OffsetOutOfRange):
			first, last, berr := partitionBounds(ctx, s.client, topic, p)
			if berr != nil {
				return nil, berr
			}
			if from >= last {
				return nil, nil
			}
			s.lost(topic, p, from, first)
			from = first
			continue
		default:
			return nil, fmt.Errorf("kafka: read spill %s/%d at %d: %w", topic, p, from, err)
		}
		before := from
		from, err = walkRecords(resp.Records, from, func(r *kafkago.Record) error {
			if len(out) == limit {
				return errFull
			}
			f, err := readRecord(r)
			if err != nil {
				return err
			}
			sp, ok := decodeSpill(f, s.source)
			if !ok || sp.group != s.group || sp.tenant != "" && sp.tenant != lane.Tenant {
				s.stats.skipped.Add(1)
				if len(out) == 0 {
					skipTo = f.offset + 1
				}
				return nil
			}
			out = append(out, sp.msg)
			return nil
		})
		if err != nil && !errors.Is(err, errFull) {
			return nil, fmt.Errorf("kafka: read spill %s/%d: %w", topic, p, err)
		}
		if from >= resp.HighWatermark {
			break
		}
		if from == before {
			stalls++ // only control records or a gap: give up for now
		} else {
			stalls = 0
		}
	}
	if atCursor && skipTo > cursor {
		// Nothing of ours lies between the cursor and skipTo: move the
		// cursor past what is not ours, or Pending would name this lane
		// for ever.
		if err := commitOffsets(ctx, s.client, s.cursor, topic, map[int]int64{p: skipTo}); err != nil {
			s.log.Warn("kafka: moving a spill cursor past foreign records failed", "topic", topic, "partition", p, "err", err)
		}
	}
	s.stats.read.Add(uint64(len(out)))
	return out, nil
}

// lost logs that entries of topic/p from from up to first were removed
// before they were re-fed (retention, or a deleted and remade topic).
func (s *SpillLog) lost(topic string, p int, from, first int64) {
	s.stats.lost.Add(1)
	s.log.Error("kafka: spilled messages removed by the broker before they were re-fed (retention.ms of the spill topic too short for the outage?)",
		"topic", topic, "partition", p, "from", from, "log_start", first)
}

// start returns where Read(from < 0) starts on topic/p: the cursor group's
// committed offset, or the log start when there is none, it is below the
// log start (entries removed by retention: logged) or past the log end
// (the topic was deleted and made again). exists is false when there is no
// such topic.
func (s *SpillLog) start(ctx context.Context, topic string, p int) (off int64, exists bool, err error) {
	first, last, err := partitionBounds(ctx, s.client, topic, p)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	cur, err := s.cursors(ctx, map[string]bool{topic: true}, p)
	if err != nil {
		return 0, false, err
	}
	c, ok := cur[topic]
	switch {
	case !ok || c < 0 || c > last:
		return first, true, nil
	case c < first:
		s.lost(topic, p, c, first)
		return first, true, nil
	}
	return c, true, nil
}

// cursors returns the cursor group's committed offset on partition p of
// each topic (absent: none).
func (s *SpillLog) cursors(ctx context.Context, topics map[string]bool, p int) (map[string]int64, error) {
	req := &kafkago.OffsetFetchRequest{GroupID: s.cursor, Topics: map[string][]int{}}
	for t := range topics {
		req.Topics[t] = []int{p}
	}
	resp, err := s.client.OffsetFetch(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafka: spill cursors of %s: %w", s.cursor, err)
	}
	if errors.Is(resp.Error, kafkago.GroupIdNotFound) {
		return map[string]int64{}, nil
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("kafka: spill cursors of %s: %w", s.cursor, resp.Error)
	}
	out := make(map[string]int64, len(topics))
	for t, ps := range resp.Topics {
		for _, po := range ps {
			if po.Partition != p {
				continue
			}
			if po.Error != nil && !errors.Is(po.Error, kafkago.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("kafka: spill cursor of %s on %s/%d: %w", s.cursor, t, p, po.Error)
			}
			if po.Error == nil && po.CommittedOffset >= 0 {
				out[t] = po.CommittedOffset
			}
		}
	}
	return out, nil
}

// Pending returns the lanes of source partition p whose spill partition p
// holds records past the cursor: the tenants an earlier process, or the
// previous owner of p, spilled and did not finish. It lists the cluster's
// topics once, then asks for the cursors of all the source's spill topics
// in one OffsetFetch and for their bounds in one ListOffsets (which kafka-go
// sends as one request per partition leader and offset). A hashed token is
// mapped back to its tenant by the SpillHeaderTenant of a record, read once
// per topic.
//
// A lane whose records past the cursor are all another group's is named
// too; its first Read moves the cursor past them.
func (s *SpillLog) Pending(ctx context.Context, p consumer.Partition) ([]consumer.SpillLane, error) {
	if p.Topic != s.source || p.ID < 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	live, err := liveTopics(ctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return nil, err
	}
	part := int(p.ID)
	tokens := map[string]string{} // topic -> token
	for name, sh := range live {
		if tok, ok := splitSpillTopic(s.source, name); ok && part < sh.partitions {
			tokens[name] = tok
		}
	}
	if len(tokens) == 0 {
		return nil, nil
	}
	req := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	topics := map[string]bool{}
	for t := range tokens {
		req.Topics[t] = []kafkago.OffsetRequest{kafkago.FirstOffsetOf(part), kafkago.LastOffsetOf(part)}
		topics[t] = true
	}
	resp, err := s.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafka: spill topic offsets: %w", err)
	}
	cur, err := s.cursors(ctx, topics, part)
	if err != nil {
		return nil, err
	}
	var names []string
	for t, ps := range resp.Topics {
		for _, po := range ps {
			switch {
			case po.Partition != part:
				continue
			case errors.Is(po.Error, kafkago.UnknownTopicOrPartition):
				continue // deleted since it was listed
			case po.Error != nil:
				return nil, fmt.Errorf("kafka: offsets of %s/%d: %w", t, part, po.Error)
			}
			from := po.FirstOffset
			if c, ok := cur[t]; ok && c >= po.FirstOffset && c <= po.LastOffset {
				from = c
			}
			if po.LastOffset > from {
				names = append(names, t)
			}
		}
	}
	slices.Sort(names)
	// Read will fetch these: make sure our metadata cache knows them.
	refreshCache(ctx, s.client, names...)
	lanes := make([]consumer.SpillLane, 0, len(names))
	for _, t := range names {
		tenant, ok, err := dlq.ParseTenantToken(tokens[t])
		if err != nil {
			continue // splitSpillTopic checked it
		}
		if !ok {
			tenant, err = s.tenantOf(ctx, t, part)
			if errors.Is(err, errNoTenantRecord) {
				s.log.Warn("kafka: spill topic holds records past the cursor, none of them a spill record; ignored", "topic", t, "partition", part)
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		lanes = append(lanes, consumer.SpillLane{Tenant: tenant, Partition: p})
	}
	return lanes, nil
}

// tenantOf returns the tenant of a spill topic with a hashed token: the
// SpillHeaderTenant of its records (whose token must be the topic's).
func (s *SpillLog) tenantOf(ctx context.Context, topic string, p int) (string, error) {
	tok, _ := splitSpillTopic(s.source, topic)
	return s.tenants.Do(ctx, topic, func(ctx context.Context) (string, error) {
		first, last, err := partitionBounds(ctx, s.client, topic, p)
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
	for stalls := 0; from < to && stalls < fetchStalls; {
		resp, err := s.client.Fetch(ctx, &kafkago.FetchRequest{
			Topic: topic, Partition: p, Offset: from, MinBytes: 0, MaxBytes: int64(s.cfg.fetchBytes), MaxWait: fetchSlack,
		})
		if err == nil && resp.Error != nil {
			err = resp.Error
			closeRecords(resp.Records)
		}
		if err != nil {
			return fmt.Errorf("kafka: read spill %s/%d at %d: %w", topic, p, from, err)
		}
		before := from
		from, err = walkRecords(resp.Records, from, func(r *kafkago.Record) error {
			f, err := readRecord(r)
			if err != nil {
				return err
			}
			if !fn(f) {
				return errFull
			}
			return nil
		})
		if errors.Is(err, errFull) {
			return nil
		}
		if err != nil {
			return err
		}
		if from == before {
			stalls++
		} else {
			stalls = 0
		}
	}
	return nil
}
