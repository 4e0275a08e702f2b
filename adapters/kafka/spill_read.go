package kafka

// Reading a spill lane back for the engine's re-feed.

import (
	"context"
	"errors"
	"fmt"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ringfence/ringfence/adapters/kafka/internal/wire"
	"github.com/ringfence/ringfence/consumer"
)

// opTimeout bounds each network call of a SpillLog but Append's produces
// (see produceTimeout): a broker that vanished without closing the
// connection must not hold a spill worker for ever.
const opTimeout = 30 * time.Second

// skipBudget bounds how long one Read passes over records that are not
// this group's before it returns (see errSkipping).
const skipBudget = 5 * time.Second

// errSkipping: Read passed over other groups' records for skipBudget
// without finding one of this group's. The next Read of the lane goes on
// from where this one stopped.
var errSkipping = errors.New("kafka: spill lane holds many records of other groups; still passing over them")

// Read returns up to limit spill records of lane at positions (offsets of
// partition p of the spill topic) >= from, or, for from < 0, from the lane's
// cursor. Each comes back as the original: key, value and headers byte for
// byte, topic, partition, offset and time, with Refed set and SpillPos its
// offset. The positions come from the partition's index (built on first
// use, see SpillLog); when it knows none, Read first indexes what was
// appended since by others. Read does not wait for new records: at the
// log's end it returns none at once.
func (s *SpillLog) Read(ctx context.Context, lane consumer.SpillLane, from int64, limit int) ([]*consumer.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := s.checkLane(lane); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if topic := s.legacyTopic(lane); topic != "" {
		return s.readLegacy(ctx, topic, lane, from, limit)
	}
	return s.readShared(ctx, lane, from, limit)
}

// readLegacy is Read of a lane draining its old per-tenant topic. Records
// that are not this group's spill records are passed over (when they lie
// at the cursor, the cursor is moved past them); a lane whose next record
// of this group lies behind more of them than one Read passes in
// skipBudget gets an error wrapping errSkipping, and the next Read goes on
// from there.
func (s *SpillLog) readLegacy(ctx context.Context, topic string, lane consumer.SpillLane, from int64, limit int) ([]*consumer.Message, error) {
	var err error
	p := int(lane.Partition.ID)
	asked := from
	if from >= 0 {
		if out, resume, ok := s.ahead.take(lane, from, limit); ok {
			s.stats.aheadHits.Add(1)
			if len(out) > 0 {
				s.stats.read.Add(uint64(len(out)))
				return out, nil
			}
			from = resume // what lies before resume is not ours
		}
	}
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
	var out, extra []*consumer.Message
	skipTo := int64(-1) // past the records at the cursor that are not ours
	began := time.Now()
	var skipping error
	for stalls := 0; len(out) == 0 && stalls < fetchStalls; {
		before := from
		o := wire.FetchOptions{MinBytes: 0, MaxBytes: s.fetchSize(limit), MaxWait: fetchSlack}
		next, hw, err := s.records.Fetch(ctx, topic, int32(p), from, o, func(r *wire.Record, hs []wire.Header) error {
			f := fetchedOf(r, hs)
			s.noteRecord(f)
			sp, ok := decodeSpill(f, s.source)
			if !ok || sp.group != s.group || sp.tenant != "" && sp.tenant != lane.Tenant {
				s.stats.skipped.Add(1)
				if len(out) == 0 {
					skipTo = f.offset + 1
				}
				return nil
			}
			if len(out) < limit {
				out = append(out, sp.msg)
			} else {
				extra = append(extra, sp.msg) // fetched anyway: keep for the next Read
			}
			return nil
		})
		switch {
		case err == nil:
		case errors.Is(err, kafkago.UnknownTopicOrPartition):
			return nil, nil // nothing was ever spilled (or the topic was deleted)
		case errors.Is(err, kafkago.OffsetOutOfRange):
			first, last, berr := s.bounds(ctx, topic, p)
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
		from = next
		if from >= hw {
			break
		}
		if from == before {
			stalls++ // a gap: give up for now
		} else {
			stalls = 0
		}
		if len(out) == 0 && time.Since(began) >= s.skipBudget {
			if !atCursor {
				s.ahead.put(lane, asked, nil, from)
			}
			skipping = fmt.Errorf("%w (%s/%d, at %d)", errSkipping, topic, p, from)
			break
		}
	}
	if atCursor && skipTo > cursor {
		// Nothing of ours lies between the cursor and skipTo: move the
		// cursor past what is not ours, or Pending would name this lane
		// for ever.
		if cerr := commitOffsets(ctx, s.client, s.cursor, topic, map[int]int64{p: skipTo}); cerr != nil {
			s.log.Warn("kafka: moving a spill cursor past foreign records failed", "topic", topic, "partition", p, "err", cerr)
		}
	}
	if skipping != nil {
		return nil, skipping
	}
	if len(extra) > 0 {
		s.ahead.put(lane, out[len(out)-1].SpillPos+1, extra, from)
	}
	s.stats.read.Add(uint64(len(out)))
	return out, nil
}

// bounds returns the first and the next offset of topic/p. kafka-go routes
// the request through its metadata cache, which may not know a topic
// another process made a moment ago: on such a miss it asks the cluster
// and, if the topic exists, loads it into the cache and asks again.
func (s *SpillLog) bounds(ctx context.Context, topic string, p int) (first, last int64, err error) {
	first, last, err = partitionBounds(ctx, s.client, topic, p)
	if !cacheMiss(err) {
		return first, last, err
	}
	live, lerr := liveTopics(ctx, s.cfg.dialer, s.brokers)
	if lerr != nil {
		return 0, 0, lerr
	}
	if _, ok := live[topic]; !ok {
		return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, p, kafkago.UnknownTopicOrPartition)
	}
	refreshCache(ctx, s.client, topic)
	return partitionBounds(ctx, s.client, topic, p)
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
	first, last, err := s.bounds(ctx, topic, p)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	cur, err := s.cursors(ctx, map[string][]int{topic: {p}})
	if err != nil {
		return 0, false, err
	}
	c, ok := cur[topicPart{topic, p}]
	switch {
	case !ok || c < 0 || c > last:
		return first, true, nil
	case c < first:
		s.lost(topic, p, c, first)
		return first, true, nil
	}
	return c, true, nil
}

// fetchSize is the MaxBytes of a fetch that should bring limit records:
// twice what that many records took lately (at least 16 KiB, at most
// SpillFetchBytes). A re-feed that asks for one record while its tenant is
// parked must not fetch a whole SpillFetchBytes each time.
func (s *SpillLog) fetchSize(limit int) int {
	per := s.recordBytes.Load()
	if per <= 0 {
		return s.cfg.fetchBytes
	}
	return int(min(max(2*int64(limit)*per, 16<<10), int64(s.cfg.fetchBytes)))
}

// noteRecord folds a fetched record's size into the running average
// fetchSize uses.
func (s *SpillLog) noteRecord(f *fetched) {
	n := int64(len(f.key) + len(f.value) + 64)
	for _, h := range f.headers {
		n += int64(len(h.Key) + len(h.Value) + 8)
	}
	old := s.recordBytes.Load()
	if old == 0 {
		s.recordBytes.Store(n)
		return
	}
	s.recordBytes.Store(old + (n-old)/16)
}
