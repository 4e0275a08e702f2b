package kafka

// Fetching a source partition. The source reads with kafka-go's
// Client.Fetch, whose record decoder keeps a header value's null apart from
// an empty one (kafka-go's Conn.ReadBatch reads both as nil, so a tenant
// header "" would reach the engine as a missing value).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/ringfence/ringfence/consumer"
)

// deliverSlice is the most messages of one fetch handed to the engine in
// one DeliverBatch. A fetch of MaxBytes may hold thousands of small
// messages; delivering it in slices, and dropping the rest of it once the
// engine paused the partition (the rest is fetched again on Resume), keeps
// the engine's per-partition bounds within deliverSlice messages.
const deliverSlice = 64

// fetchSlack is how much longer than MaxWait one fetch may take before it
// is abandoned as hung (a broker that vanished without closing the
// connection).
const fetchSlack = 10 * time.Second

// fetch reads ps and delivers each fetched batch, in offset order, until
// ctx ends, retrying failures with backoff (100ms doubling up to 5s).
func (s *Source) fetch(ctx context.Context, ps *partition, d consumer.Dispatcher) {
	offset := ps.start
	resolve := offset < 0
	for attempt := 0; ; {
		if !ps.waitResumed(ctx) {
			return
		}
		if attempt > 0 && !sleep(ctx, backoff(attempt)) {
			return
		}
		var err error
		if resolve {
			offset, err = s.resolve(ctx, int(ps.id.ID), offset)
			resolve = err != nil
		}
		if err == nil {
			offset, err = s.fetchOnce(ctx, ps, offset, d)
		}
		switch {
		case err == nil:
			attempt = 0
			continue
		case ctx.Err() != nil:
			return
		case errors.Is(err, kafkago.OffsetOutOfRange):
			// Retention removed what we wanted, or we are past the end:
			// resolve the offset against the log's range again.
			s.log.Warn("kafka: offset out of range", "partition", ps.id.ID, "offset", offset)
			resolve = true
		case cacheMiss(err):
			// kafka-go's cached metadata does not know the topic (yet):
			// ask the cluster itself whether it exists.
			if err = s.checkTopic(ctx); err != nil && (ctx.Err() != nil || s.failed(err)) {
				return
			}
			if err != nil {
				s.log.Warn("kafka: topic unknown; waiting for it", "partition", ps.id.ID, "err", err)
			}
		case s.failed(err):
			return
		default:
			s.log.Warn("kafka: fetch failed; retrying", "partition", ps.id.ID, "offset", offset, "attempt", attempt+1, "err", err)
		}
		attempt++
	}
}

// checkTopic asks the cluster (not kafka-go's metadata cache) whether the
// source topic exists. If it does, it is marked seen and the cache is
// refreshed; if not, the error wraps UnknownTopicOrPartition.
func (s *Source) checkTopic(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	live, err := liveTopics(cctx, s.cfg.dialer, s.brokers)
	if err != nil {
		return err
	}
	if _, ok := live[s.topic]; !ok {
		return fmt.Errorf("kafka: topic %s: %w", s.topic, kafkago.UnknownTopicOrPartition)
	}
	s.watch.seen()
	refreshCache(cctx, s.client, s.topic)
	return nil
}

// resolve turns offset (FirstOffset, LastOffset, or one outside the log)
// into the absolute offset to fetch: the log start for FirstOffset or an
// offset below it, the log end for LastOffset or an offset past it.
func (s *Source) resolve(ctx context.Context, part int, offset int64) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, fetchSlack)
	defer cancel()
	first, last, err := partitionBounds(rctx, s.client, s.topic, part)
	if err != nil {
		return offset, err
	}
	switch {
	case offset == kafkago.FirstOffset, offset >= 0 && offset < first:
		return first, nil
	case offset == kafkago.LastOffset, offset > last:
		return last, nil
	}
	return offset, nil
}

// partitionBounds returns the first and the next offset of topic/part.
func partitionBounds(ctx context.Context, cl *kafkago.Client, topic string, part int) (first, last int64, err error) {
	resp, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		topic: {kafkago.FirstOffsetOf(part), kafkago.LastOffsetOf(part)},
	}})
	if err != nil {
		return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, part, err)
	}
	for _, po := range resp.Topics[topic] {
		if po.Partition != part {
			continue
		}
		if po.Error != nil {
			return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, part, po.Error)
		}
		return po.FirstOffset, po.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("kafka: offsets of %s/%d: no answer: %w", topic, part, kafkago.UnknownTopicOrPartition)
}

// fetchOnce fetches ps once from offset and delivers what came back, in
// DeliverBatch calls of up to deliverSlice messages, stopping early when the
// engine pauses ps. It returns the offset to fetch next.
func (s *Source) fetchOnce(ctx context.Context, ps *partition, offset int64, d consumer.Dispatcher) (int64, error) {
	fctx, cancel := context.WithTimeout(ctx, s.cfg.maxWait+fetchSlack)
	defer cancel()
	resp, err := s.client.Fetch(fctx, &kafkago.FetchRequest{
		Topic: s.topic, Partition: int(ps.id.ID), Offset: offset,
		MinBytes: 1, MaxBytes: int64(s.cfg.maxBytes), MaxWait: s.cfg.maxWait,
	})
	if err == nil && resp.Error != nil {
		err = resp.Error
		closeRecords(resp.Records)
	}
	if err != nil {
		return offset, err
	}
	s.watch.seen()
	batch := make([]*consumer.Message, 0, deliverSlice)
	next, err := walkRecords(resp.Records, offset, func(r *kafkago.Record) error {
		if len(batch) == deliverSlice {
			d.DeliverBatch(batch)
			batch = make([]*consumer.Message, 0, deliverSlice)
			if ps.paused.Load() {
				return errPaused
			}
		}
		m, err := sourceMessage(ps.id, r)
		if err != nil {
			return err
		}
		batch = append(batch, m)
		return nil
	})
	if len(batch) > 0 {
		d.DeliverBatch(batch)
	}
	if errors.Is(err, errPaused) {
		err = nil
	}
	return next, err
}

// errPaused stops delivering a fetch once the engine paused its partition.
var errPaused = errors.New("kafka: partition paused")

// sourceMessage copies a fetched record into a consumer.Message. Header
// values keep null (nil) apart from empty.
func sourceMessage(p consumer.Partition, r *kafkago.Record) (*consumer.Message, error) {
	m := &consumer.Message{Topic: p.Topic, Partition: p, Offset: r.Offset, Time: r.Time}
	var err error
	if m.Key, err = readBytes(r.Key); err != nil {
		return nil, err
	}
	if m.Value, err = readBytes(r.Value); err != nil {
		return nil, err
	}
	if len(r.Headers) > 0 {
		m.Headers = make([]consumer.Header, len(r.Headers))
		for i, h := range r.Headers {
			m.Headers[i] = consumer.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m, nil
}

// walkRecords calls fn, in order, for each data record of rr at offset from
// or later, and closes rr. It returns the offset after the last record it
// passed, control records included (a transaction's commit markers take
// offsets too), so that a fetch holding only control records still moves
// on. An error of fn stops the walk; the returned offset is then the one
// after the last record fn accepted.
func walkRecords(rr kafkago.RecordReader, from int64, fn func(*kafkago.Record) error) (int64, error) {
	defer closeRecords(rr)
	next := from
	var readers []kafkago.RecordReader
	if st, ok := rr.(*protocol.RecordStream); ok {
		readers = st.Records
	} else {
		readers = []kafkago.RecordReader{rr}
	}
	for _, sub := range readers {
		_, control := sub.(*protocol.ControlBatch)
		for {
			r, err := sub.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return next, fmt.Errorf("kafka: decode records: %w", err)
			}
			if r.Offset < next {
				closeRecord(r)
				continue // a batch may start before the fetch offset
			}
			if control {
				closeRecord(r)
				next = r.Offset + 1
				continue
			}
			err = fn(r)
			closeRecord(r)
			if err != nil {
				return next, err
			}
			next = r.Offset + 1
		}
	}
	return next, nil
}

func closeRecord(r *kafkago.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}

func closeRecords(rr kafkago.RecordReader) {
	if c, ok := rr.(io.Closer); ok {
		_ = c.Close()
	}
}

// cacheMiss reports whether err is kafka-go's transport failing to route a
// request because its cached metadata (refreshed every 6s) does not know
// the topic or partition: the topic may have been created or grown since,
// or deleted.
func cacheMiss(err error) bool {
	return errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) || errors.Is(err, protocol.ErrNoLeader)
}

// topicShape is a topic's partition count and replication factor.
type topicShape struct {
	partitions  int
	replication int
}

// liveTopics asks one of brokers, directly and not through kafka-go's
// metadata cache, for every topic of the cluster and its shape. (A
// metadata request naming topics would ask the broker to auto-create them;
// one naming none never does.)
func liveTopics(ctx context.Context, dialer *kafkago.Dialer, brokers []string) (map[string]topicShape, error) {
	var errs []error
	for _, b := range brokers {
		conn, err := dialer.DialContext(ctx, "tcp", b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		parts, err := conn.ReadPartitions()
		_ = conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out := make(map[string]topicShape)
		for _, p := range parts {
			sh := out[p.Topic]
			sh.partitions++
			sh.replication = max(sh.replication, len(p.Replicas))
			out[p.Topic] = sh
		}
		return out, nil
	}
	return nil, fmt.Errorf("kafka: list topics: %w", errors.Join(errs...))
}

// refreshCache makes kafka-go's transport load topic into its metadata
// cache now instead of at its next periodic refresh. Call it only for a
// topic the cluster just said exists: kafka-go refreshes its cache on
// demand only for a metadata request that allows topic auto-creation.
func refreshCache(ctx context.Context, cl *kafkago.Client, topics ...string) {
	if len(topics) == 0 || cl.Transport == nil {
		return
	}
	_, _ = cl.Transport.RoundTrip(ctx, cl.Addr, &metadata.Request{TopicNames: topics, AllowAutoTopicCreation: true})
}
