package kafka

// Reading a spill lane back for the engine's re-feed.

import (
	"context"
	"errors"
	"fmt"
	"time"

	kafkago "github.com/segmentio/kafka-go"

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
// partition p of the tenant's spill topic) >= from, or, for from < 0, from
// the cursor group's committed offset (the log start when there is none).
// Each comes back as the original: key, value and headers byte for byte,
// topic, partition, offset and time, with Refed set and SpillPos its
// offset. Records that are not this group's spill records are passed over
// (when they lie at the cursor, the cursor is moved past them); a lane
// whose next record of this group lies behind more of them than one Read
// passes in skipBudget gets an error wrapping errSkipping, and the next
// Read goes on from there. Read does not wait for new records: at the
// log's end it returns none at once.
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
	refreshed := false
	began := time.Now()
	var skipping error
	for stalls := 0; len(out) == 0 && stalls < fetchStalls; {
		resp, err := s.client.Fetch(ctx, &kafkago.FetchRequest{
			Topic: topic, Partition: p, Offset: from,
			MinBytes: 0, MaxBytes: s.fetchSize(limit), MaxWait: fetchSlack,
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
			f, err := readRecord(r)
			if err != nil {
				return err
			}
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
		if err != nil {
			if len(out) > 0 {
				break // return what was read; the next Read meets the error again
			}
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
// parked must not fetch (and decode into kafka-go's 64 KiB pages) a whole
// SpillFetchBytes each time.
func (s *SpillLog) fetchSize(limit int) int64 {
	per := s.recordBytes.Load()
	if per <= 0 {
		return int64(s.cfg.fetchBytes)
	}
	return min(max(2*int64(limit)*per, 16<<10), int64(s.cfg.fetchBytes))
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
